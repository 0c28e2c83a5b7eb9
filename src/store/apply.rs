//! What the writer does with each request, inside its transaction. Every function validates
//! before it writes, so a refusal (not found, stale version, illegal move) leaves nothing
//! behind and needs no rollback; only SQL failures do.

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::json;

use super::codec::Encoded;
use super::query::{self, RecordSummary};
use super::schema::CLOSED_SQL;
use super::StoreError;
use crate::model::{
    EventKind, FailureClass, FailureFacts, Fingerprint, Mover, RecordId, Source, Status,
};

/// One failure ready to store: parsed, redacted, classified, its documents encoded, its class
/// policy applied.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub partition: String,
    pub source: Source,
    /// Where the class policy sends it (poison detection may still send it to review).
    pub status: Status,
    pub failure_class: FailureClass,
    pub class_rule: String,
    pub fingerprint: Fingerprint,
    pub dedup_key: Option<[u8; 16]>,
    pub at_ms: i64,
    pub actor: String,
    pub owner: Option<String>,
    pub due_at_ms: Option<i64>,
    /// When a record entering retry_scheduled is first due.
    pub next_attempt_at_ms: Option<i64>,
    /// The record whose replay failed again and produced this one.
    pub replay_of: Option<i64>,
    pub credential_incident: bool,
    pub facts: FailureFacts,
    pub payload: Option<Encoded>,
    pub error: Option<Encoded>,
}

/// What ingest did with one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestOutcome {
    pub id: RecordId,
    pub status: Status,
    /// False when an open record with the same identity absorbed it as another occurrence.
    pub created: bool,
    pub occurrences: i64,
    /// Its fingerprint has failed too often: it went straight to review.
    pub poison: bool,
}

/// Poison detection settings, from config.
#[derive(Debug, Clone, Copy)]
pub struct PoisonRule {
    pub threshold: u32,
    pub window_ms: i64,
}

/// An operator's change to one record (PATCH): any of status, owner, note, tags, payload.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub id: i64,
    pub actor: String,
    pub at_ms: i64,
    /// Refuse the change unless the record is still at this version (optimistic concurrency).
    pub expected_version: Option<i64>,
    pub status: Option<(Status, Option<String>)>,
    /// `Some(None)` takes the owner away.
    pub owner: Option<Option<String>>,
    pub note: Option<String>,
    pub tags: Option<Vec<String>>,
    pub payload: Option<PayloadEdit>,
}

/// A new payload version, encoded, with the RFC 6902 diff from the version it was made from.
#[derive(Debug, Clone)]
pub struct PayloadEdit {
    pub doc: Encoded,
    /// The version the operator edited (None: the record had no payload).
    pub base_version: Option<i64>,
    pub diff: serde_json::Value,
}

/// One bulk action: over the open records of a failure group, or over records chosen by id.
/// One transaction; each record is changed and audited on its own.
#[derive(Debug, Clone)]
pub struct GroupAction {
    pub chosen: Chosen,
    pub actor: String,
    pub at_ms: i64,
    pub kind: GroupActionKind,
    /// Reason for the status change (required for skip), or the owner for assign.
    pub text: Option<String>,
}

/// The records a bulk action applies to.
#[derive(Debug, Clone)]
pub enum Chosen {
    /// Every open record of this failure group.
    Group(Fingerprint),
    /// These records (the web page's ticked rows); one the action does not fit is reported,
    /// one that does not exist refuses the whole action.
    Ids(Vec<i64>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupActionKind {
    Resolve,
    Skip,
    Assign,
    ReadyForReplay,
    /// Add the text to each record's audit trail.
    Note,
}

/// What a bulk action did to one record.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct GroupItem {
    pub id: i64,
    pub ok: bool,
    pub status: Status,
    pub error: Option<String>,
}

thread_local! {
    /// How long each record closed by the writer's current transaction had been open (ms).
    /// The writer counts them into the metrics only once the transaction commits, and drops
    /// them when it rolls back.
    pub(super) static CLOSED_AFTER_MS: std::cell::RefCell<Vec<i64>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Who did something to which record, when: every audit event of one request shares it.
struct Audit<'a> {
    id: i64,
    at: i64,
    actor: &'a str,
}

impl Audit<'_> {
    fn log(
        &self,
        conn: &Connection,
        kind: EventKind,
        from: Option<Status>,
        to: Option<Status>,
        detail: Option<serde_json::Value>,
    ) -> Result<(), StoreError> {
        conn.prepare_cached(
            "INSERT INTO events (record_id, at, actor, kind, from_status, to_status, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            self.id,
            self.at,
            self.actor,
            kind.as_str(),
            from.map(Status::as_str),
            to.map(Status::as_str),
            detail.map(|d| d.to_string())
        ])?;
        if to.is_some_and(Status::is_closed) && !from.is_some_and(Status::is_closed) {
            let first_seen: i64 = conn
                .prepare_cached("SELECT first_seen_at FROM dead_letters WHERE id = ?1")?
                .query_row([self.id], |r| r.get(0))?;
            CLOSED_AFTER_MS.with(|c| c.borrow_mut().push(self.at - first_seen));
        }
        Ok(())
    }
}

pub(super) fn insert_document(
    conn: &Connection,
    id: i64,
    kind: &str,
    version: i64,
    doc: &Encoded,
    at: i64,
    actor: &str,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO payloads (record_id, kind, version, codec, size, sha256, bytes, created_at, actor)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        id,
        kind,
        version,
        doc.codec.as_str(),
        doc.size as i64,
        &doc.sha256[..],
        &doc.bytes,
        at,
        actor
    ])?;
    Ok(())
}

/// Count a new record into its failure group and say whether the group is (now) poison, and
/// how many records it has had in the current window. (Read, decide, write: an
/// `UPSERT … RETURNING` would cost an ephemeral table per record.)
fn count_into_group(
    conn: &Connection,
    r: &NewRecord,
    rule: PoisonRule,
) -> Result<(bool, i64), StoreError> {
    let fp = r.fingerprint.as_i64();
    let current: Option<(i64, i64, bool)> = conn
        .prepare_cached(
            "SELECT window_start, window_records, poison FROM groups WHERE fingerprint = ?1",
        )?
        .query_row([fp], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()?;
    let Some((window_start, window_records, poison)) = current else {
        let poison = rule.threshold <= 1;
        conn.prepare_cached(
            "INSERT INTO groups (fingerprint, failure_class, workflow_id, workflow_name, node_name,
                 sample_message, first_seen_at, last_seen_at, records, window_start, window_records,
                 poison, poison_since)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, 1, ?7, 1, ?8, ?9)",
        )?
        .execute(params![
            fp,
            r.failure_class.as_str(),
            r.facts.workflow_id,
            r.facts.workflow_name,
            r.facts.node_name,
            r.facts.error_message,
            r.at_ms,
            poison,
            poison.then_some(r.at_ms),
        ])?;
        return Ok((poison, 1));
    };
    let (window_start, in_window) = if r.at_ms - window_start > rule.window_ms {
        (r.at_ms, 1)
    } else {
        (window_start, window_records + 1)
    };
    let turns_poison = !poison && in_window >= i64::from(rule.threshold);
    conn.prepare_cached(
        "UPDATE groups SET last_seen_at = ?2, records = records + 1, window_start = ?3,
             window_records = ?4, poison = poison OR ?5,
             poison_since = CASE WHEN ?5 THEN ?2 ELSE poison_since END
         WHERE fingerprint = ?1",
    )?
    .execute(params![fp, r.at_ms, window_start, in_window, turns_poison])?;
    Ok((poison || turns_poison, in_window))
}

pub fn ingest(
    conn: &Connection,
    r: &NewRecord,
    rule: PoisonRule,
) -> Result<IngestOutcome, StoreError> {
    if let Some(key) = &r.dedup_key {
        let found: Option<(i64, String, i64, bool)> = conn
            .prepare_cached(&format!(
                "SELECT id, status, occurrences, poison FROM dead_letters
                 WHERE partition = ?1 AND dedup_key = ?2 AND status NOT IN {CLOSED_SQL}
                 ORDER BY id DESC LIMIT 1"
            ))?
            .query_row(params![r.partition, &key[..]], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()?;
        if let Some((id, status, occurrences, poison)) = found {
            conn.prepare_cached(
                "UPDATE dead_letters SET occurrences = occurrences + 1, last_seen_at = ?2, updated_at = ?2
                 WHERE id = ?1",
            )?
            .execute(params![id, r.at_ms])?;
            return Ok(IngestOutcome {
                id: RecordId::new(id),
                status: status.parse::<Status>().map_err(StoreError::Corrupt)?,
                created: false,
                occurrences: occurrences + 1,
                poison,
            });
        }
    }
    let (poison, in_window) = count_into_group(conn, r, rule)?;
    // A poison fingerprint never loops: its new records wait for a person.
    let status = if poison { Status::Review } else { r.status };
    // Never reuse an id, not even that of a removed record (tombstones and exports name it).
    let id: i64 = conn
        .prepare_cached(
            "SELECT max(coalesce((SELECT max(id) FROM dead_letters), 0),
                        (SELECT value FROM counters WHERE name = 'id_floor')) + 1",
        )?
        .query_row([], |row| row.get(0))?;
    let stored_bytes = r.payload.as_ref().map_or(0, |d| d.bytes.len())
        + r.error.as_ref().map_or(0, |d| d.bytes.len());
    conn.prepare_cached(
        "INSERT INTO dead_letters (
            id, stored_bytes, partition, status, source, failure_class, class_rule, fingerprint, dedup_key,
            first_seen_at, last_seen_at, updated_at,
            workflow_id, workflow_name, execution_id, execution_url, execution_mode, retry_of,
            node_name, node_type, http_status, error_code, error_name, error_message,
            idempotency_key, external_event_id, correlation_id, tenant_id, contract_version,
            business_object_type, business_object_id, replay_url,
            owner, due_at, payload_version, poison, credential_incident, next_attempt_at, replay_of)
         VALUES (?36, ?37, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
                 ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32,
                 ?33, ?34, ?35)",
    )?
    .execute(params![
        r.partition,
        status.as_str(),
        r.source.as_str(),
        r.failure_class.as_str(),
        r.class_rule,
        r.fingerprint.as_i64(),
        r.dedup_key.as_ref().map(|k| &k[..]),
        r.at_ms,
        r.facts.workflow_id,
        r.facts.workflow_name,
        r.facts.execution_id,
        r.facts.execution_url,
        r.facts.execution_mode,
        r.facts.retry_of,
        r.facts.node_name,
        r.facts.node_type,
        r.facts.http_status,
        r.facts.error_code,
        r.facts.error_name,
        r.facts.error_message,
        r.facts.idempotency_key,
        r.facts.external_event_id,
        r.facts.correlation_id,
        r.facts.tenant_id,
        r.facts.contract_version,
        r.facts.business_object_type,
        r.facts.business_object_id,
        r.facts.replay_url,
        r.owner,
        r.due_at_ms,
        r.payload.as_ref().map(|_| 1),
        poison,
        r.credential_incident,
        (status == Status::RetryScheduled).then_some(r.next_attempt_at_ms.unwrap_or(r.at_ms)),
        r.replay_of,
        id,
        stored_bytes as i64,
    ])?;
    if let Some(doc) = &r.payload {
        insert_document(conn, id, "item", 1, doc, r.at_ms, &r.actor)?;
    }
    if let Some(doc) = &r.error {
        insert_document(conn, id, "error", 1, doc, r.at_ms, &r.actor)?;
    }
    let mut detail = serde_json::Map::new();
    if poison {
        // Only the first record of a poison group says why (the group row keeps the rest);
        // repeating it on every record would cost ~80 bytes each.
        detail.insert(
            "poison".into(),
            if in_window == i64::from(rule.threshold) {
                json!({"records_in_window": in_window, "threshold": rule.threshold, "window_ms": rule.window_ms})
            } else {
                json!(true)
            },
        );
    }
    if r.credential_incident {
        detail.insert("credential_incident".into(), json!(true));
    }
    if let Some(o) = &r.owner {
        detail.insert("owner".into(), json!(o));
    }
    if let Some(of) = r.replay_of {
        detail.insert("replay_of".into(), json!(of));
    }
    Audit {
        id,
        at: r.at_ms,
        actor: &r.actor,
    }
    .log(
        conn,
        EventKind::Created,
        None,
        Some(status),
        (!detail.is_empty()).then_some(serde_json::Value::Object(detail)),
    )?;
    Ok(IngestOutcome {
        id: RecordId::new(id),
        status,
        created: true,
        occurrences: 1,
        poison,
    })
}

/// Apply an operator's change: all checks first, then the writes, each audited.
pub fn change(conn: &Connection, c: &Change) -> Result<RecordSummary, StoreError> {
    let (status, version, owner, tags, payload_version): (
        String,
        i64,
        Option<String>,
        Option<String>,
        Option<i64>,
    ) = conn
        .prepare_cached(
            "SELECT status, version, owner, tags, payload_version FROM dead_letters WHERE id = ?1",
        )?
        .query_row([c.id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?
        .ok_or(StoreError::NotFound(c.id))?;
    let status = status.parse::<Status>().map_err(StoreError::Corrupt)?;
    if let Some(expected) = c.expected_version {
        if expected != version {
            return Err(StoreError::Stale {
                id: c.id,
                expected,
                current: version,
            });
        }
    }
    if let Some((to, reason)) = &c.status {
        status.check_move(*to, Mover::Operator, reason.as_deref())?;
    }
    if let Some(edit) = &c.payload {
        if edit.base_version != payload_version {
            return Err(StoreError::Stale {
                id: c.id,
                expected: version,
                current: version + 1,
            });
        }
    }
    let changes_something = c.status.is_some()
        || c.owner.as_ref().is_some_and(|o| *o != owner)
        || c.note.is_some()
        || c.tags.as_ref().is_some_and(|t| Some(tags_json(t)) != tags)
        || c.payload.is_some();
    if !changes_something {
        return Err(StoreError::Invalid("the change changes nothing".into()));
    }

    let audit = Audit {
        id: c.id,
        at: c.at_ms,
        actor: &c.actor,
    };
    if let Some((to, reason)) = &c.status {
        conn.prepare_cached("UPDATE dead_letters SET status = ?2 WHERE id = ?1")?
            .execute(params![c.id, to.as_str()])?;
        let detail = reason.as_ref().map(|r| json!({"reason": r}));
        audit.log(
            conn,
            EventKind::StatusChanged,
            Some(status),
            Some(*to),
            detail,
        )?;
    }
    if let Some(new_owner) = c.owner.as_ref().filter(|o| **o != owner) {
        conn.prepare_cached("UPDATE dead_letters SET owner = ?2 WHERE id = ?1")?
            .execute(params![c.id, new_owner])?;
        audit.log(
            conn,
            EventKind::Assigned,
            None,
            None,
            Some(json!({"owner": new_owner, "previous": owner})),
        )?;
    }
    if let Some(t) = c.tags.as_ref().filter(|t| Some(tags_json(t)) != tags) {
        conn.prepare_cached("UPDATE dead_letters SET tags = ?2 WHERE id = ?1")?
            .execute(params![c.id, tags_json(t)])?;
        let previous: serde_json::Value = tags
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or(json!([]));
        audit.log(
            conn,
            EventKind::Tagged,
            None,
            None,
            Some(json!({"tags": t, "previous": previous})),
        )?;
    }
    if let Some(edit) = &c.payload {
        let new_version = payload_version.unwrap_or(0) + 1;
        insert_document(
            conn,
            c.id,
            "item",
            new_version,
            &edit.doc,
            c.at_ms,
            &c.actor,
        )?;
        conn.prepare_cached(
            "UPDATE dead_letters SET payload_version = ?2, stored_bytes = stored_bytes + ?3
             WHERE id = ?1",
        )?
        .execute(params![c.id, new_version, edit.doc.bytes.len() as i64])?;
        audit.log(conn, EventKind::PayloadEdited,
            None,
            None,
            Some(
                json!({"version": new_version, "base_version": edit.base_version, "diff": edit.diff}),
            ),
        )?;
    }
    if let Some(note) = &c.note {
        audit.log(
            conn,
            EventKind::Noted,
            None,
            None,
            Some(json!({"note": note})),
        )?;
    }
    conn.prepare_cached(
        "UPDATE dead_letters SET version = version + 1, updated_at = ?2 WHERE id = ?1",
    )?
    .execute(params![c.id, c.at_ms])?;
    query::summary_by_id(conn, c.id)
}

fn tags_json(tags: &[String]) -> String {
    serde_json::to_string(tags).unwrap_or_else(|_| "[]".into())
}

/// Apply one action to every chosen record, each audited on its own; a record the action does
/// not fit (an illegal move) is reported and left as it was.
pub fn group_action(conn: &Connection, a: &GroupAction) -> Result<Vec<GroupItem>, StoreError> {
    let ids: Vec<i64> = match &a.chosen {
        Chosen::Ids(ids) => ids.clone(),
        Chosen::Group(fp) => open_of_group(conn, *fp)?,
    };
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let mut c = Change {
            id,
            actor: a.actor.clone(),
            at_ms: a.at_ms,
            ..Change::default()
        };
        match a.kind {
            GroupActionKind::Resolve => c.status = Some((Status::Resolved, a.text.clone())),
            GroupActionKind::Skip => c.status = Some((Status::Skipped, a.text.clone())),
            GroupActionKind::ReadyForReplay => {
                c.status = Some((Status::ReadyForReplay, a.text.clone()))
            }
            GroupActionKind::Assign => c.owner = Some(a.text.clone()),
            GroupActionKind::Note => c.note = a.text.clone(),
        }
        match change(conn, &c) {
            Ok(s) => out.push(GroupItem {
                id,
                ok: true,
                status: s.status,
                error: None,
            }),
            Err(e) if e.is_refusal() => {
                let status = query::summary_by_id(conn, id)?.status;
                out.push(GroupItem {
                    id,
                    ok: false,
                    status,
                    error: Some(e.to_string()),
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The open records of a failure group, oldest first (a group nobody knows is refused).
fn open_of_group(conn: &Connection, fp: Fingerprint) -> Result<Vec<i64>, StoreError> {
    let ids: Vec<i64> = conn
        .prepare_cached(&format!(
            "SELECT id FROM dead_letters WHERE fingerprint = ?1 AND status NOT IN {CLOSED_SQL} ORDER BY id"
        ))?
        .query_map([fp.as_i64()], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        let known: bool = conn
            .prepare_cached("SELECT 1 FROM groups WHERE fingerprint = ?1")?
            .query_row([fp.as_i64()], |_| Ok(true))
            .optional()?
            .unwrap_or(false);
        if !known {
            return Err(StoreError::NoGroup(fp.to_string()));
        }
    }
    Ok(ids)
}

/// Take a due record for sending: it moves (as deadletter) from `from` to `to` and is leased
/// to `owner` until `lease_until`; its attempt count goes up.
#[derive(Debug, Clone)]
pub struct Claim {
    pub id: i64,
    pub from: Status,
    pub to: Status,
    pub owner: String,
    pub lease_until_ms: i64,
    pub at_ms: i64,
}

/// What a claim hands the sender.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub attempt: i64,
    pub payload_version: Option<i64>,
}

/// One delivery attempt, as sent and answered.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub attempt: i64,
    pub started_at_ms: i64,
    pub target: String,
    pub url: String,
    pub idempotency_key: String,
    pub payload_version: Option<i64>,
    /// success | transient | permanent
    pub outcome: &'static str,
    pub status_code: Option<u16>,
    pub latency_ms: i64,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    pub retry_after_ms: Option<i64>,
    pub downstream_execution_id: Option<String>,
}

/// Where a sent record goes next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Delivered: replayed.
    Delivered,
    /// Try again at this time (retry_scheduled).
    RetryAt(i64),
    /// A person has to look (review), for this reason.
    Review(String),
    /// A replay failed (replay_failed).
    Failed(String),
}

/// The end of a send: the attempt is stored whatever happens; the record moves on only if
/// this sender still holds its lease (otherwise it was recovered and someone else has it).
#[derive(Debug, Clone)]
pub struct Finish {
    pub id: i64,
    pub owner: String,
    pub at_ms: i64,
    pub attempt: AttemptRecord,
    pub next: Next,
}

pub fn claim(conn: &Connection, c: &Claim) -> Result<Claimed, StoreError> {
    let (status, attempts, payload_version): (Status, i64, Option<i64>) = conn
        .prepare_cached("SELECT status, attempts, payload_version FROM dead_letters WHERE id = ?1")?
        .query_row([c.id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?
        .ok_or(StoreError::NotFound(c.id))?;
    if status != c.from {
        return Err(StoreError::Invalid(format!(
            "dead letter {} is {status}, not {}",
            c.id, c.from
        )));
    }
    status.check_move(c.to, Mover::System, None)?;
    conn.prepare_cached(
        "UPDATE dead_letters SET status = ?2, lease_owner = ?3, lease_expires_at = ?4,
             attempts = attempts + 1, next_attempt_at = NULL, updated_at = ?5, version = version + 1
         WHERE id = ?1",
    )?
    .execute(params![
        c.id,
        c.to.as_str(),
        c.owner,
        c.lease_until_ms,
        c.at_ms
    ])?;
    Audit {
        id: c.id,
        at: c.at_ms,
        actor: SYSTEM,
    }
    .log(
        conn,
        EventKind::StatusChanged,
        Some(status),
        Some(c.to),
        Some(json!({"attempt": attempts + 1})),
    )?;
    Ok(Claimed {
        attempt: attempts + 1,
        payload_version,
    })
}

/// The actor of everything deadletter does by itself.
pub const SYSTEM: &str = "deadletter";

pub fn finish(conn: &Connection, f: &Finish) -> Result<Status, StoreError> {
    let a = &f.attempt;
    conn.prepare_cached(
        "INSERT INTO attempts (record_id, attempt, started_at, target, url, idempotency_key,
             payload_version, outcome, status_code, latency_ms, error, response_excerpt, retry_after_ms,
             downstream_execution_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        f.id,
        a.attempt,
        a.started_at_ms,
        a.target,
        a.url,
        a.idempotency_key,
        a.payload_version,
        a.outcome,
        a.status_code,
        a.latency_ms,
        a.error,
        a.response_excerpt,
        a.retry_after_ms,
        a.downstream_execution_id
    ])?;
    let (status, owner): (Status, Option<String>) = conn
        .prepare_cached("SELECT status, lease_owner FROM dead_letters WHERE id = ?1")?
        .query_row([f.id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or(StoreError::NotFound(f.id))?;
    if owner.as_deref() != Some(f.owner.as_str()) {
        // Recovered after its lease ran out: the attempt is on record, the record is not ours.
        return Ok(status);
    }
    let (to, next_at, error) = match &f.next {
        Next::Delivered => (Status::Replayed, None, None),
        Next::RetryAt(t) => (Status::RetryScheduled, Some(*t), a.error.clone()),
        Next::Review(why) => (Status::Review, None, Some(why.clone())),
        Next::Failed(why) => (Status::ReplayFailed, None, Some(why.clone())),
    };
    status.check_move(to, Mover::System, None)?;
    conn.prepare_cached(
        "UPDATE dead_letters SET status = ?2, lease_owner = NULL, lease_expires_at = NULL,
             next_attempt_at = ?3, last_error = COALESCE(?4, last_error), updated_at = ?5,
             version = version + 1
         WHERE id = ?1",
    )?
    .execute(params![f.id, to.as_str(), next_at, error, f.at_ms])?;
    Audit {
        id: f.id,
        at: f.at_ms,
        actor: SYSTEM,
    }
    .log(
        conn,
        EventKind::StatusChanged,
        Some(status),
        Some(to),
        Some(json!({
            "attempt": a.attempt, "target": a.target, "outcome": a.outcome,
            "status_code": a.status_code, "reason": error,
        })),
    )?;
    Ok(to)
}

/// Return leased records to their queues: all of them (at start: nobody else runs), or only
/// those whose lease ran out. Each move is audited.
pub fn recover(conn: &Connection, now_ms: i64, only_expired: bool) -> Result<usize, StoreError> {
    let rows: Vec<(i64, Status, Option<String>)> = conn
        .prepare_cached(
            "SELECT id, status, lease_owner FROM dead_letters
             WHERE status IN ('retrying', 'replaying') AND (?2 = 0 OR lease_expires_at IS NULL OR lease_expires_at < ?1)",
        )?
        .query_map(params![now_ms, only_expired], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    for (id, status, owner) in &rows {
        let to = if *status == Status::Retrying {
            Status::RetryScheduled
        } else {
            Status::ReadyForReplay
        };
        conn.prepare_cached(
            "UPDATE dead_letters SET status = ?2, lease_owner = NULL, lease_expires_at = NULL,
                 next_attempt_at = CASE WHEN ?2 = 'retry_scheduled' THEN ?3 ELSE NULL END,
                 updated_at = ?3, version = version + 1
             WHERE id = ?1",
        )?
        .execute(params![id, to.as_str(), now_ms])?;
        Audit { id: *id, at: now_ms, actor: SYSTEM }.log(
            conn,
            EventKind::StatusChanged,
            Some(*status),
            Some(to),
            Some(json!({"reason": "lease released: the sender stopped or ran out of time", "lease_owner": owner})),
        )?;
    }
    Ok(rows.len())
}
