//! Removing records: by age (the sweeper) or by request (erasure). Each removed record leaves a
//! tombstone — no payload, but its hash and size, who asked and why, and whether anyone had
//! looked at it — and its documents, events and attempts go with it (secure_delete overwrites
//! their bytes). Applied by the writer, in small batches so ingest never waits long.

use rusqlite::{params, Connection};
use serde::Serialize;

use super::schema::CLOSED_SQL;
use super::StoreError;

/// Why a record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Open for longer than the retention age.
    Age,
    /// Closed (replayed, resolved, skipped) for longer than the shorter closed age.
    ClosedAge,
    /// An erasure request (a person's data must go).
    Erasure,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::ClosedAge => "closed_age",
            Reason::Erasure => "erasure",
        }
    }
}

/// One sweep step: remove at most `batch` records past their age at `now_ms`.
#[derive(Debug, Clone, Copy)]
pub struct SweepStep {
    pub now_ms: i64,
    pub max_age_ms: i64,
    pub closed_max_age_ms: i64,
    pub tombstone_max_age_ms: i64,
    pub batch: usize,
}

/// Which records an erasure removes.
#[derive(Debug, Clone)]
pub enum ErasureSelector {
    Ids(Vec<i64>),
    IdempotencyKey(String),
    ExternalEventId(String),
    TenantId(String),
}

#[derive(Debug, Clone)]
pub struct Erasure {
    pub selector: ErasureSelector,
    pub actor: String,
    pub at_ms: i64,
}

/// Remove these records, leaving tombstones. The ids must exist.
fn remove(
    conn: &Connection,
    ids: &[i64],
    reason: Reason,
    actor: &str,
    now_ms: i64,
) -> Result<usize, StoreError> {
    let mut tomb = conn.prepare_cached(
        "INSERT INTO tombstones (record_id, partition, workflow_id, idempotency_key, external_event_id,
             tenant_id, status, failure_class, created_at, removed_at, reason, actor,
             payload_sha256, payload_size, touched)
         SELECT d.id, d.partition, d.workflow_id, d.idempotency_key, d.external_event_id, d.tenant_id,
                d.status, d.failure_class, d.first_seen_at, ?2, ?3, ?4,
                (SELECT sha256 FROM payloads p WHERE p.record_id = d.id AND p.kind = 'item' AND p.version = 1),
                (SELECT size FROM payloads p WHERE p.record_id = d.id AND p.kind = 'item' AND p.version = 1),
                (SELECT count(*) FROM events e WHERE e.record_id = d.id) > 1
         FROM dead_letters d WHERE d.id = ?1",
    )?;
    let mut delete = conn.prepare_cached("DELETE FROM dead_letters WHERE id = ?1")?;
    let mut n = 0;
    for id in ids {
        tomb.execute(params![id, now_ms, reason.as_str(), actor])?;
        n += delete.execute([id])?;
    }
    Ok(n)
}

/// How many records one sweep step removed (by reason) and tombstones it expired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Swept {
    pub age: usize,
    pub closed_age: usize,
    pub tombstones: usize,
}

impl Swept {
    pub fn total(&self) -> usize {
        self.age + self.closed_age + self.tombstones
    }
}

pub fn sweep(conn: &Connection, s: &SweepStep) -> Result<Swept, StoreError> {
    let ids = |sql: &str, cutoff: i64| -> Result<Vec<i64>, StoreError> {
        Ok(conn
            .prepare_cached(sql)?
            .query_map(params![cutoff, s.batch as i64], |r| r.get(0))?
            .collect::<Result<Vec<i64>, _>>()?)
    };
    let closed = ids(
        &format!(
            "SELECT id FROM dead_letters WHERE status IN {CLOSED_SQL} AND updated_at < ?1 ORDER BY id LIMIT ?2"
        ),
        s.now_ms - s.closed_max_age_ms,
    )?;
    let closed_age = remove(
        conn,
        &closed,
        Reason::ClosedAge,
        super::apply::SYSTEM,
        s.now_ms,
    )?;
    let left = s.batch.saturating_sub(closed_age);
    let old = if left > 0 {
        conn.prepare_cached(
            "SELECT id FROM dead_letters WHERE first_seen_at < ?1 AND lease_owner IS NULL ORDER BY first_seen_at LIMIT ?2",
        )?
        .query_map(params![s.now_ms - s.max_age_ms, left as i64], |r| r.get(0))?
        .collect::<Result<Vec<i64>, _>>()?
    } else {
        Vec::new()
    };
    let age = remove(conn, &old, Reason::Age, super::apply::SYSTEM, s.now_ms)?;
    let tombstones = conn
        .prepare_cached(
            "DELETE FROM tombstones WHERE id IN (SELECT id FROM tombstones WHERE removed_at < ?1 LIMIT ?2)",
        )?
        .execute(params![s.now_ms - s.tombstone_max_age_ms, s.batch as i64])?;
    Ok(Swept {
        age,
        closed_age,
        tombstones,
    })
}

/// Remove what the selector names, now; tombstones say "erasure" and who asked.
pub fn erase(conn: &Connection, e: &Erasure) -> Result<Vec<i64>, StoreError> {
    let ids: Vec<i64> = match &e.selector {
        ErasureSelector::Ids(ids) => {
            let mut found = Vec::new();
            for id in ids {
                let exists = conn
                    .prepare_cached("SELECT 1 FROM dead_letters WHERE id = ?1")?
                    .exists([id])?;
                if exists {
                    found.push(*id);
                }
            }
            found
        }
        ErasureSelector::IdempotencyKey(k) => by(conn, "idempotency_key", k)?,
        ErasureSelector::ExternalEventId(k) => by(conn, "external_event_id", k)?,
        ErasureSelector::TenantId(k) => by(conn, "tenant_id", k)?,
    };
    remove(conn, &ids, Reason::Erasure, &e.actor, e.at_ms)?;
    Ok(ids)
}

fn by(conn: &Connection, column: &str, value: &str) -> Result<Vec<i64>, StoreError> {
    Ok(conn
        .prepare_cached(&format!("SELECT id FROM dead_letters WHERE {column} = ?1"))?
        .query_map([value], |r| r.get(0))?
        .collect::<Result<Vec<i64>, _>>()?)
}

/// A tombstone as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TombstoneView {
    pub record_id: i64,
    pub partition: String,
    pub workflow_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub external_event_id: Option<String>,
    pub tenant_id: Option<String>,
    pub status: String,
    pub failure_class: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub removed_at: chrono::DateTime<chrono::Utc>,
    pub reason: String,
    pub actor: String,
    pub payload_sha256: Option<String>,
    pub payload_size: Option<i64>,
    pub touched: bool,
}

pub fn tombstones(conn: &Connection, limit: usize) -> Result<Vec<TombstoneView>, StoreError> {
    use super::query::ms_to_time;
    Ok(conn
        .prepare_cached(
            "SELECT record_id, partition, workflow_id, idempotency_key, external_event_id, tenant_id, status,
                    failure_class, created_at, removed_at, reason, actor, payload_sha256, payload_size, touched
             FROM tombstones ORDER BY id DESC LIMIT ?1",
        )?
        .query_map([limit as i64], |r| {
            Ok(TombstoneView {
                record_id: r.get(0)?,
                partition: r.get(1)?,
                workflow_id: r.get(2)?,
                idempotency_key: r.get(3)?,
                external_event_id: r.get(4)?,
                tenant_id: r.get(5)?,
                status: r.get(6)?,
                failure_class: r.get(7)?,
                created_at: ms_to_time(r.get(8)?),
                removed_at: ms_to_time(r.get(9)?),
                reason: r.get(10)?,
                actor: r.get(11)?,
                payload_sha256: r.get::<_, Option<Vec<u8>>>(12)?.map(hex::encode),
                payload_size: r.get(13)?,
                touched: r.get(14)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?)
}
