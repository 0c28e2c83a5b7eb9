//! Reads: the filtered, cursor-paged list and the one-record view with its documents and audit
//! events. Pages are ordered newest first by id; the cursor is the last id seen, so a page
//! never shifts when records are inserted while someone pages through.

use chrono::{DateTime, TimeZone, Utc};
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ValueRef};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::Serialize;

use super::codec::{decode, Codec};
use super::schema::CLOSED_SQL;
use super::StoreError;
use crate::model::{FailureClass, FailureFacts, Fingerprint, Status};

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<Status>,
    pub partition: Option<String>,
    /// Matches the workflow's id or its name exactly.
    pub workflow: Option<String>,
    pub owner: Option<String>,
    pub failure_class: Option<FailureClass>,
    pub fingerprint: Option<Fingerprint>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// Substring of the error message (case-insensitive for ASCII).
    pub message_contains: Option<String>,
    /// Only ids below this one (the previous page's cursor).
    pub before_id: Option<i64>,
    pub limit: usize,
}

/// One row of a list.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RecordSummary {
    pub id: i64,
    pub partition: String,
    pub status: Status,
    pub source: String,
    pub failure_class: FailureClass,
    pub class_rule: String,
    #[schema(value_type = String, example = "ae0a9387729d212c")]
    pub fingerprint: Fingerprint,
    pub occurrences: i64,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(flatten)]
    pub facts: FailureFacts,
    pub owner: Option<String>,
    pub due_at: Option<DateTime<Utc>>,
    pub attempts: i64,
    /// Bumped by every change: send it back (`If-Match` or `version`) to change the record.
    pub version: i64,
    /// The payload version a replay would send (the newest); none without a payload.
    pub payload_version: Option<i64>,
    pub tags: Vec<String>,
    /// Its fingerprint failed too often: it went straight to review.
    pub poison: bool,
    pub credential_incident: bool,
    /// When an automatic retry is next due (retry_scheduled only).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// What the last delivery attempt, or the move to review, said.
    pub last_error: Option<String>,
    /// The record whose replay failed again and produced this one.
    pub replay_of: Option<i64>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ListPage {
    pub items: Vec<RecordSummary>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// A stored document, decoded: the exact JSON text that was stored.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct DocumentView {
    pub version: i64,
    pub codec: String,
    pub size: i64,
    pub stored_size: i64,
    pub sha256: String,
    pub created_at: DateTime<Utc>,
    pub actor: String,
    #[serde(skip)]
    pub json: String,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EventView {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub kind: String,
    pub from_status: Option<String>,
    pub to_status: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub detail: Option<serde_json::Value>,
}

#[derive(Debug, Clone)]
pub struct RecordDetail {
    pub summary: RecordSummary,
    /// The failing item (newest version: what a replay sends), when there is one.
    pub payload: Option<DocumentView>,
    /// Every payload version, oldest (the original) first, without their bodies.
    pub payload_versions: Vec<DocumentView>,
    /// The producer's error object, redacted.
    pub error: Option<DocumentView>,
    pub events: Vec<EventView>,
    /// Every delivery attempt, oldest first.
    pub deliveries: Vec<AttemptView>,
    pub enrichment: Enrichment,
}

/// Whether deadletter fetched the record's execution from n8n, and what it learnt.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct Enrichment {
    /// null (not fetched: not an Error Trigger record, or no n8n API configured), pending,
    /// enriched, unavailable.
    pub state: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub detail: Option<serde_json::Value>,
    /// The failing node's input items as n8n had them (newest fetch), redacted.
    #[schema(value_type = Option<Object>)]
    pub failing_node_inputs: Option<serde_json::Value>,
}

/// One delivery attempt and the target's answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AttemptView {
    pub attempt: i64,
    pub at: DateTime<Utc>,
    pub target: String,
    pub url: String,
    pub idempotency_key: String,
    pub payload_version: Option<i64>,
    pub outcome: String,
    pub status_code: Option<u16>,
    pub latency_ms: i64,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    pub retry_after_ms: Option<i64>,
    pub downstream_execution_id: Option<String>,
}

const COLUMNS: &str = "id, partition, status, source, failure_class, class_rule, fingerprint, occurrences,
    first_seen_at, last_seen_at, updated_at, workflow_id, workflow_name, execution_id, execution_url,
    execution_mode, retry_of, node_name, node_type, http_status, error_code, error_name, error_message,
    idempotency_key, external_event_id, correlation_id, tenant_id, contract_version,
    business_object_type, business_object_id, replay_url, owner, due_at, attempts,
    version, payload_version, tags, poison, credential_incident, next_attempt_at, last_error,
    replay_of";

pub fn ms_to_time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

fn summary(r: &Row<'_>) -> rusqlite::Result<RecordSummary> {
    Ok(RecordSummary {
        id: r.get(0)?,
        partition: r.get(1)?,
        status: r.get(2)?,
        source: r.get(3)?,
        failure_class: r.get(4)?,
        class_rule: r.get(5)?,
        fingerprint: Fingerprint::from_i64(r.get(6)?),
        occurrences: r.get(7)?,
        first_seen_at: ms_to_time(r.get(8)?),
        last_seen_at: ms_to_time(r.get(9)?),
        updated_at: ms_to_time(r.get(10)?),
        facts: FailureFacts {
            workflow_id: r.get(11)?,
            workflow_name: r.get(12)?,
            execution_id: r.get(13)?,
            execution_url: r.get(14)?,
            execution_mode: r.get(15)?,
            retry_of: r.get(16)?,
            node_name: r.get(17)?,
            node_type: r.get(18)?,
            http_status: r.get(19)?,
            error_code: r.get(20)?,
            error_name: r.get(21)?,
            error_message: r.get(22)?,
            idempotency_key: r.get(23)?,
            external_event_id: r.get(24)?,
            correlation_id: r.get(25)?,
            tenant_id: r.get(26)?,
            contract_version: r.get(27)?,
            business_object_type: r.get(28)?,
            business_object_id: r.get(29)?,
            replay_url: r.get(30)?,
        },
        owner: r.get(31)?,
        due_at: r.get::<_, Option<i64>>(32)?.map(ms_to_time),
        attempts: r.get(33)?,
        version: r.get(34)?,
        payload_version: r.get(35)?,
        tags: r
            .get::<_, Option<String>>(36)?
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default(),
        poison: r.get(37)?,
        credential_incident: r.get(38)?,
        next_attempt_at: r.get::<_, Option<i64>>(39)?.map(ms_to_time),
        last_error: r.get(40)?,
        replay_of: r.get(41)?,
    })
}

impl FromSql for Status {
    fn column_result(v: ValueRef<'_>) -> FromSqlResult<Self> {
        v.as_str()?
            .parse()
            .map_err(|e: String| FromSqlError::Other(e.into()))
    }
}

impl FromSql for FailureClass {
    fn column_result(v: ValueRef<'_>) -> FromSqlResult<Self> {
        v.as_str()?
            .parse()
            .map_err(|e: String| FromSqlError::Other(e.into()))
    }
}

pub fn summary_by_id(conn: &Connection, id: i64) -> Result<RecordSummary, StoreError> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM dead_letters WHERE id = ?1"))?
        .query_row([id], summary)
        .map_err(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => StoreError::NotFound(id),
            other => other.into(),
        })
}

pub fn list(conn: &Connection, f: &ListFilter) -> Result<ListPage, StoreError> {
    let mut sql = format!("SELECT {COLUMNS} FROM dead_letters WHERE 1=1");
    let mut args: Vec<Box<dyn ToSql>> = Vec::new();
    let mut add = |clause: &str, v: Box<dyn ToSql>| {
        args.push(v);
        sql.push_str(&clause.replace('?', &format!("?{}", args.len())));
    };
    if let Some(s) = f.status {
        add(" AND status = ?", Box::new(s.as_str()));
    }
    if let Some(p) = &f.partition {
        add(" AND partition = ?", Box::new(p.clone()));
    }
    if let Some(w) = &f.workflow {
        add(" AND (workflow_id = ? ", Box::new(w.clone()));
        add("OR workflow_name = ?)", Box::new(w.clone()));
    }
    if let Some(o) = &f.owner {
        add(" AND owner = ?", Box::new(o.clone()));
    }
    if let Some(c) = f.failure_class {
        add(" AND failure_class = ?", Box::new(c.as_str()));
    }
    if let Some(fp) = f.fingerprint {
        add(" AND fingerprint = ?", Box::new(fp.as_i64()));
    }
    if let Some(t) = f.since_ms {
        add(" AND first_seen_at >= ?", Box::new(t));
    }
    if let Some(t) = f.until_ms {
        add(" AND first_seen_at < ?", Box::new(t));
    }
    if let Some(q) = &f.message_contains {
        let escaped = q
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        add(
            " AND error_message LIKE ? ESCAPE '\\'",
            Box::new(format!("%{escaped}%")),
        );
    }
    if let Some(b) = f.before_id {
        add(" AND id < ?", Box::new(b));
    }
    let limit = f.limit.clamp(1, 100_000);
    add(" ORDER BY id DESC LIMIT ?", Box::new((limit + 1) as i64));
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut items = stmt
        .query_map(
            rusqlite::params_from_iter(args.iter().map(|b| b.as_ref())),
            summary,
        )?
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|r| r.id.to_string())
    } else {
        None
    };
    Ok(ListPage { items, next_cursor })
}

/// A document of a record: `version` None is the newest.
pub fn document(
    conn: &Connection,
    id: i64,
    kind: &str,
    version: Option<i64>,
) -> Result<Option<DocumentView>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT version, codec, size, sha256, bytes, created_at, actor FROM payloads
             WHERE record_id = ?1 AND kind = ?2 AND (?3 IS NULL OR version = ?3)
             ORDER BY version DESC LIMIT 1",
        )?
        .query_row(params![id, kind, version], StoredDocument::from_row)
        .optional()?;
    row.map(|d| d.decode(id)).transpose()
}

/// Every version of a record's document of this kind, with its text, oldest first (one query).
pub fn documents(conn: &Connection, id: i64, kind: &str) -> Result<Vec<DocumentView>, StoreError> {
    conn.prepare_cached(
        "SELECT version, codec, size, sha256, bytes, created_at, actor FROM payloads
         WHERE record_id = ?1 AND kind = ?2 ORDER BY version",
    )?
    .query_map(params![id, kind], StoredDocument::from_row)?
    .map(|row| row?.decode(id))
    .collect()
}

/// A `payloads` row as stored (compressed).
struct StoredDocument {
    version: i64,
    codec: String,
    size: i64,
    sha256: Vec<u8>,
    bytes: Vec<u8>,
    created_at: i64,
    actor: String,
}

impl StoredDocument {
    fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredDocument> {
        Ok(StoredDocument {
            version: r.get(0)?,
            codec: r.get(1)?,
            size: r.get(2)?,
            sha256: r.get(3)?,
            bytes: r.get(4)?,
            created_at: r.get(5)?,
            actor: r.get(6)?,
        })
    }

    fn decode(self, id: i64) -> Result<DocumentView, StoreError> {
        let stored_size = self.bytes.len() as i64;
        let codec = Codec::parse(&self.codec)?;
        let raw = decode(codec, self.size as usize, self.bytes)?;
        let json = String::from_utf8(raw)
            .map_err(|_| StoreError::Corrupt(format!("document of record {id} is not UTF-8")))?;
        Ok(DocumentView {
            version: self.version,
            codec: codec.as_str().to_owned(),
            size: self.size,
            stored_size,
            sha256: hex::encode(self.sha256),
            created_at: ms_to_time(self.created_at),
            actor: self.actor,
            json,
        })
    }
}

pub fn get(conn: &Connection, id: i64) -> Result<RecordDetail, StoreError> {
    let summary = summary_by_id(conn, id)?;
    let payload = document(conn, id, "item", None)?;
    let error = document(conn, id, "error", None)?;
    let payload_versions = conn
        .prepare_cached(
            "SELECT version, codec, size, length(bytes), sha256, created_at, actor FROM payloads
             WHERE record_id = ?1 AND kind = 'item' ORDER BY version",
        )?
        .query_map([id], |r| {
            Ok(DocumentView {
                version: r.get(0)?,
                codec: r.get(1)?,
                size: r.get(2)?,
                stored_size: r.get(3)?,
                sha256: hex::encode(r.get::<_, Vec<u8>>(4)?),
                created_at: ms_to_time(r.get(5)?),
                actor: r.get(6)?,
                json: String::new(),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let events = conn
        .prepare_cached(
            "SELECT id, at, actor, kind, from_status, to_status, detail FROM events
             WHERE record_id = ?1 ORDER BY id",
        )?
        .query_map([id], |r| {
            let detail: Option<String> = r.get(6)?;
            Ok(EventView {
                id: r.get(0)?,
                at: ms_to_time(r.get(1)?),
                actor: r.get(2)?,
                kind: r.get(3)?,
                from_status: r.get(4)?,
                to_status: r.get(5)?,
                detail: detail.and_then(|d| serde_json::from_str(&d).ok()),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let deliveries = conn
        .prepare_cached(
            "SELECT attempt, started_at, target, url, idempotency_key, payload_version, outcome,
                    status_code, latency_ms, error, response_excerpt, retry_after_ms,
                    downstream_execution_id
             FROM attempts WHERE record_id = ?1 ORDER BY id",
        )?
        .query_map([id], |r| {
            Ok(AttemptView {
                attempt: r.get(0)?,
                at: ms_to_time(r.get(1)?),
                target: r.get(2)?,
                url: r.get(3)?,
                idempotency_key: r.get(4)?,
                payload_version: r.get(5)?,
                outcome: r.get(6)?,
                status_code: r.get(7)?,
                latency_ms: r.get(8)?,
                error: r.get(9)?,
                response_excerpt: r.get(10)?,
                retry_after_ms: r.get(11)?,
                downstream_execution_id: r.get(12)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let (state, detail) = super::enrich::state(conn, id)?;
    let failing_node_inputs =
        document(conn, id, "n8n_inputs", None)?.and_then(|d| serde_json::from_str(&d.json).ok());
    Ok(RecordDetail {
        summary,
        payload,
        payload_versions,
        error,
        events,
        deliveries,
        enrichment: Enrichment {
            state,
            detail,
            failing_node_inputs,
        },
    })
}

fn raw_json(d: &Option<DocumentView>) -> Result<Option<&serde_json::value::RawValue>, StoreError> {
    d.as_ref()
        .map(|d| {
            serde_json::from_str::<&serde_json::value::RawValue>(&d.json)
                .map_err(|e| StoreError::Corrupt(format!("stored document is not JSON: {e}")))
        })
        .transpose()
}

#[derive(Serialize)]
struct DetailJson<'a> {
    #[serde(flatten)]
    summary: &'a RecordSummary,
    /// The failing item exactly as stored (byte for byte what the producer sent, unless
    /// redaction had to change it).
    payload: Option<&'a serde_json::value::RawValue>,
    payload_info: Option<&'a DocumentView>,
    payload_versions: &'a [DocumentView],
    error: Option<&'a serde_json::value::RawValue>,
    events: &'a [EventView],
    deliveries: &'a [AttemptView],
    enrichment: &'a Enrichment,
}

impl RecordDetail {
    /// The record as the API and `deadletter show --json` print it.
    pub fn to_json(&self) -> Result<Vec<u8>, StoreError> {
        let j = DetailJson {
            summary: &self.summary,
            payload: raw_json(&self.payload)?,
            payload_info: self.payload.as_ref(),
            payload_versions: &self.payload_versions,
            error: raw_json(&self.error)?,
            events: &self.events,
            deliveries: &self.deliveries,
            enrichment: &self.enrichment,
        };
        serde_json::to_vec(&j).map_err(|e| StoreError::Corrupt(e.to_string()))
    }
}

#[derive(Debug, Clone, Default)]
pub struct GroupFilter {
    /// Only groups with open records.
    pub open_only: bool,
    pub failure_class: Option<FailureClass>,
    /// Workflow id or exact name.
    pub workflow: Option<String>,
    pub poison_only: bool,
    pub limit: usize,
}

/// One failure group: every record with one fingerprint.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct GroupSummary {
    #[schema(value_type = String)]
    pub fingerprint: Fingerprint,
    pub failure_class: FailureClass,
    pub workflow_id: Option<String>,
    pub workflow_name: Option<String>,
    pub node_name: Option<String>,
    pub sample_message: Option<String>,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// Records ever created in the group.
    pub count: i64,
    /// Records of it still open.
    pub open: i64,
    pub poison: bool,
    pub poison_since: Option<DateTime<Utc>>,
}

/// Groups, most recently failing first.
pub fn groups(conn: &Connection, f: &GroupFilter) -> Result<Vec<GroupSummary>, StoreError> {
    let sql = format!(
        "SELECT * FROM (
             SELECT g.fingerprint, g.failure_class, g.workflow_id, g.workflow_name, g.node_name,
                    g.sample_message, g.first_seen_at, g.last_seen_at, g.records,
                    (SELECT count(*) FROM dead_letters d
                      WHERE d.fingerprint = g.fingerprint AND d.status NOT IN {CLOSED_SQL}) AS open,
                    g.poison, g.poison_since
             FROM groups g
             WHERE (?1 IS NULL OR g.failure_class = ?1)
               AND (?2 IS NULL OR g.workflow_id = ?2 OR g.workflow_name = ?2)
               AND (?3 = 0 OR g.poison = 1))
         WHERE (?4 = 0 OR open > 0)
         ORDER BY last_seen_at DESC LIMIT ?5"
    );
    let rows = conn
        .prepare_cached(&sql)?
        .query_map(
            params![
                f.failure_class.map(FailureClass::as_str),
                f.workflow,
                f.poison_only,
                f.open_only,
                f.limit.clamp(1, 1000) as i64
            ],
            |r| {
                Ok(GroupSummary {
                    fingerprint: Fingerprint::from_i64(r.get(0)?),
                    failure_class: r.get(1)?,
                    workflow_id: r.get(2)?,
                    workflow_name: r.get(3)?,
                    node_name: r.get(4)?,
                    sample_message: r.get(5)?,
                    first_seen_at: ms_to_time(r.get(6)?),
                    last_seen_at: ms_to_time(r.get(7)?),
                    count: r.get(8)?,
                    open: r.get(9)?,
                    poison: r.get(10)?,
                    poison_since: r.get::<_, Option<i64>>(11)?.map(ms_to_time),
                })
            },
        )?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

/// Records in retry_scheduled whose time has come, oldest due first. Auth failures are never
/// sent automatically, whatever their status.
pub fn due(conn: &Connection, now_ms: i64, limit: usize) -> Result<Vec<RecordSummary>, StoreError> {
    let rows = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM dead_letters
             WHERE status = 'retry_scheduled' AND next_attempt_at <= ?1 AND failure_class <> 'auth'
             ORDER BY next_attempt_at LIMIT ?2"
        ))?
        .query_map(params![now_ms, limit as i64], summary)?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}
