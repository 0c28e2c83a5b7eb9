//! Removing records: by age (the sweeper) or by request (erasure). Each removed record leaves a
//! tombstone — no payload, but its hash and size, who asked and why, and whether anyone had
//! looked at it — and its documents, events and attempts go with it (secure_delete overwrites
//! their bytes). Applied by the writer, in small batches so ingest never waits long.

use rusqlite::{params, Connection, OptionalExtension};
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
    /// Over a size cap: the partition's, or the whole database's.
    Size,
    /// An erasure request (a person's data must go).
    Erasure,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::ClosedAge => "closed_age",
            Reason::Size => "size",
            Reason::Erasure => "erasure",
        }
    }
}

/// What retention keeps of one partition (or of every partition without its own policy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub max_age_ms: i64,
    pub closed_max_age_ms: i64,
    /// Stored document bytes the partition may hold; the oldest go beyond it.
    pub max_bytes: Option<i64>,
}

/// The default policy and the partitions with one of their own.
#[derive(Debug, Clone)]
pub struct Policies {
    pub default: Policy,
    pub partitions: Vec<(String, Policy)>,
}

impl Policies {
    pub fn of(&self, partition: &str) -> &Policy {
        self.partitions
            .iter()
            .find(|(p, _)| p == partition)
            .map_or(&self.default, |(_, policy)| policy)
    }
}

/// One sweep step: remove at most `batch` records that policy says must go at `now_ms`, and
/// at most `batch` tombstones past their age.
#[derive(Debug, Clone)]
pub struct SweepStep {
    pub now_ms: i64,
    pub policies: Policies,
    pub tombstone_max_age_ms: i64,
    /// The database's used size (pages in use, not the free ones) may not pass this.
    pub max_total_bytes: Option<i64>,
    pub batch: usize,
    /// A step stops removing once it has run this long (and says there is more), so the
    /// ingests queued behind it never wait longer than about this.
    pub budget: std::time::Duration,
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
    remove_until(conn, ids, reason, actor, now_ms, None)
}

/// `remove`, stopping early (between records) once `deadline` has passed.
fn remove_until(
    conn: &Connection,
    ids: &[i64],
    reason: Reason,
    actor: &str,
    now_ms: i64,
    deadline: Option<std::time::Instant>,
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
    let mut delete =
        conn.prepare_cached("DELETE FROM dead_letters WHERE id = ?1 RETURNING partition")?;
    let mut count = conn.prepare_cached(
        "INSERT INTO removals (partition, reason, records) VALUES (?1, ?2, 1)
         ON CONFLICT (partition, reason) DO UPDATE SET records = records + 1",
    )?;
    let mut floor =
        conn.prepare_cached("UPDATE counters SET value = max(value, ?1) WHERE name = 'id_floor'")?;
    let mut n = 0;
    for id in ids {
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        tomb.execute(params![id, now_ms, reason.as_str(), actor])?;
        let partition: Option<String> = delete.query_row([id], |r| r.get(0)).optional()?;
        if let Some(p) = partition {
            count.execute(params![p, reason.as_str()])?;
            floor.execute([id])?;
            n += 1;
        }
    }
    Ok(n)
}

/// How many records one sweep step removed (by reason) and tombstones it expired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Swept {
    pub age: usize,
    pub closed_age: usize,
    pub size: usize,
    pub tombstones: usize,
    /// The step stopped at its batch or time budget: more may be due.
    pub more: bool,
}

impl Swept {
    pub fn total(&self) -> usize {
        self.age + self.closed_age + self.size + self.tombstones
    }

    pub fn add(&mut self, o: Swept) {
        self.age += o.age;
        self.closed_age += o.closed_age;
        self.size += o.size;
        self.tombstones += o.tombstones;
        self.more = o.more;
    }
}

/// What a removed record is reckoned to free besides its documents (its row, index entries,
/// events): used to decide how many records bring the database under its total cap. On the
/// low side, so the sweeper removes too few (and goes on next step) rather than too many.
const ROW_OVERHEAD: i64 = 300;

/// Partitions that have records.
fn partitions(conn: &Connection) -> Result<Vec<String>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT partition FROM partition_stats GROUP BY partition HAVING sum(records) > 0",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<Vec<_>, _>>()?)
}

/// The oldest records of a partition (not in flight), oldest first: id, first seen, bytes.
fn oldest(
    conn: &Connection,
    partition: &str,
    before_ms: i64,
    limit: usize,
) -> Result<Vec<(i64, i64, i64)>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT id, first_seen_at, stored_bytes FROM dead_letters
             WHERE partition = ?1 AND first_seen_at < ?2 AND lease_owner IS NULL
             ORDER BY first_seen_at LIMIT ?3",
        )?
        .query_map(params![partition, before_ms, limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<Vec<_>, _>>()?)
}

/// Bytes of the database file in use (its free pages excluded: they are reused or vacuumed).
pub fn used_bytes(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.query_row(
        "SELECT (SELECT page_count FROM pragma_page_count()) - (SELECT freelist_count FROM pragma_freelist_count()),
                (SELECT page_size FROM pragma_page_size())",
        [],
        |r| Ok(r.get::<_, i64>(0)? * r.get::<_, i64>(1)?),
    )?)
}

/// Records to remove, oldest first, until `excess` bytes are reckoned freed (at most `limit`).
fn until_freed(candidates: &[(i64, i64, i64)], excess: i64, per_row: i64) -> Vec<i64> {
    let mut freed = 0;
    let mut ids = Vec::new();
    for (id, _, bytes) in candidates {
        if freed >= excess {
            break;
        }
        freed += bytes + per_row;
        ids.push(*id);
    }
    ids
}

pub fn sweep(conn: &Connection, s: &SweepStep) -> Result<Swept, StoreError> {
    let system = super::apply::SYSTEM;
    let deadline = std::time::Instant::now() + s.budget;
    let mut out = Swept::default();
    let left = |out: &Swept| {
        if std::time::Instant::now() >= deadline {
            0
        } else {
            s.batch.saturating_sub(out.age + out.closed_age + out.size)
        }
    };
    let remove =
        |ids: &[i64], reason| remove_until(conn, ids, reason, system, s.now_ms, Some(deadline));

    // Closed records past their (partition's) closed age, the longest-closed first. One query:
    // the partial index on closed records' updated_at bounds it, a CASE gives each partition
    // its own cutoff.
    let mut sql = format!(
        "SELECT id FROM dead_letters WHERE status IN {CLOSED_SQL} AND updated_at < ?1 AND updated_at < "
    );
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    let policies = &s.policies;
    let shortest = policies
        .partitions
        .iter()
        .map(|(_, p)| p.closed_max_age_ms)
        .chain([policies.default.closed_max_age_ms])
        .min()
        .unwrap_or(0);
    args.push((s.now_ms - shortest).into());
    if policies.partitions.is_empty() {
        sql.push_str("?2");
    } else {
        sql.push_str("CASE partition");
        for (name, p) in &policies.partitions {
            sql.push_str(&format!(
                " WHEN ?{} THEN ?{}",
                args.len() + 1,
                args.len() + 2
            ));
            args.push(name.clone().into());
            args.push((s.now_ms - p.closed_max_age_ms).into());
        }
        sql.push_str(&format!(" ELSE ?{} END", args.len() + 1));
    }
    args.push((s.now_ms - policies.default.closed_max_age_ms).into());
    sql.push_str(&format!(" ORDER BY updated_at LIMIT ?{}", args.len() + 1));
    args.push((s.batch as i64).into());
    let closed = conn
        .prepare_cached(&sql)?
        .query_map(rusqlite::params_from_iter(args), |r| r.get(0))?
        .collect::<Result<Vec<i64>, _>>()?;
    out.closed_age = remove(&closed, Reason::ClosedAge)?;

    // Then, partition by partition: records past the partition's age, and the oldest ones
    // beyond its byte cap.
    for partition in partitions(conn)? {
        let policy = s.policies.of(&partition);
        if left(&out) == 0 {
            break;
        }
        let old: Vec<i64> = oldest(conn, &partition, s.now_ms - policy.max_age_ms, left(&out))?
            .into_iter()
            .map(|(id, _, _)| id)
            .collect();
        out.age += remove(&old, Reason::Age)?;
        let Some(cap) = policy.max_bytes else {
            continue;
        };
        if left(&out) == 0 {
            break;
        }
        let now_bytes: i64 = conn
            .prepare_cached(
                "SELECT coalesce(sum(bytes), 0) FROM partition_stats WHERE partition = ?1",
            )?
            .query_row([&partition], |r| r.get(0))?;
        if now_bytes > cap {
            let candidates = oldest(conn, &partition, i64::MAX, left(&out))?;
            let ids = until_freed(&candidates, now_bytes - cap, 0);
            out.size += remove(&ids, Reason::Size)?;
        }
    }

    // Then the whole database: the oldest records of any partition beyond the total cap.
    // The estimate is on the low side, so measure again (inside this transaction the page
    // counts already reflect the removals and the tombstones written) and go on until the file
    // is under its cap, the step's budget is spent or nothing is left to remove.
    if let Some(cap) = s.max_total_bytes {
        loop {
            let used = used_bytes(conn)?;
            if used <= cap || left(&out) == 0 {
                break;
            }
            let mut candidates = Vec::new();
            for partition in partitions(conn)? {
                candidates.extend(oldest(conn, &partition, i64::MAX, left(&out))?);
            }
            candidates.sort_by_key(|&(id, first_seen, _)| (first_seen, id));
            candidates.truncate(left(&out));
            let ids = until_freed(&candidates, used - cap, ROW_OVERHEAD);
            let removed = remove(&ids, Reason::Size)?;
            if removed == 0 {
                break;
            }
            out.size += removed;
        }
    }
    if out.total() > 0 {
        conn.prepare_cached("DELETE FROM partition_stats WHERE records = 0")?
            .execute([])?;
    }

    out.tombstones = conn
        .prepare_cached(
            "DELETE FROM tombstones WHERE id IN (SELECT id FROM tombstones WHERE removed_at < ?1 LIMIT ?2)",
        )?
        .execute(params![s.now_ms - s.tombstone_max_age_ms, s.batch as i64])?;
    out.more = left(&out) == 0 || out.tombstones == s.batch;
    Ok(out)
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

/// One partition as retention sees it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PartitionRetention {
    pub partition: String,
    pub records: i64,
    pub open: i64,
    /// Stored bytes of its documents (compressed as stored).
    pub bytes: i64,
    pub max_bytes: Option<i64>,
    pub max_age_seconds: i64,
    pub closed_max_age_seconds: i64,
    /// Open records that age will remove within `warn_before`: look at them now.
    pub expiring_soon: i64,
    /// When the oldest record (open or not) reaches its age.
    pub next_expiry: Option<chrono::DateTime<chrono::Utc>>,
    /// Records removed so far, by reason (age, closed_age, size, erasure).
    pub removed: std::collections::BTreeMap<String, i64>,
}

/// Retention's view of the whole database.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RetentionStatus {
    /// Bytes of the database file in use (free pages excluded).
    pub used_bytes: i64,
    /// Free pages not yet given back to the file system (the sweeper's vacuum does that
    /// after removing records).
    pub free_bytes: i64,
    pub max_total_bytes: Option<i64>,
    /// Open records, all partitions, that age will remove within `warn_before_seconds`.
    pub expiring_soon: i64,
    pub warn_before_seconds: i64,
    pub tombstones: i64,
    /// Records removed so far, by reason, all partitions.
    pub removed: std::collections::BTreeMap<String, i64>,
    pub partitions: Vec<PartitionRetention>,
}

/// Counts from the running totals, plus one short index range per partition for the records
/// about to expire; never a scan of every record.
pub fn status(
    conn: &Connection,
    policies: &Policies,
    max_total_bytes: Option<i64>,
    now_ms: i64,
    warn_before_ms: i64,
) -> Result<RetentionStatus, StoreError> {
    use super::query::ms_to_time;
    let mut removed_by: std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<String, i64>,
    > = Default::default();
    let mut removed = std::collections::BTreeMap::new();
    for row in conn
        .prepare_cached("SELECT partition, reason, records FROM removals")?
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?
    {
        let (p, reason, n) = row?;
        *removed.entry(reason.clone()).or_insert(0) += n;
        removed_by.entry(p).or_default().insert(reason, n);
    }
    let rows = conn
        .prepare_cached(&format!(
            "SELECT partition, sum(records), sum(bytes),
                    coalesce(sum(records) FILTER (WHERE status NOT IN {CLOSED_SQL}), 0)
             FROM partition_stats GROUP BY partition HAVING sum(records) > 0 ORDER BY partition"
        ))?
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut partitions = Vec::new();
    let mut expiring_total = 0;
    for (partition, records, bytes, open) in rows {
        let policy = policies.of(&partition);
        let expiring_soon: i64 = conn
            .prepare_cached(&format!(
                "SELECT count(*) FROM dead_letters
                 WHERE partition = ?1 AND first_seen_at < ?2 AND status NOT IN {CLOSED_SQL}"
            ))?
            .query_row(
                params![partition, now_ms - policy.max_age_ms + warn_before_ms],
                |r| r.get(0),
            )?;
        let oldest: Option<i64> = conn
            .prepare_cached("SELECT min(first_seen_at) FROM dead_letters WHERE partition = ?1")?
            .query_row([&partition], |r| r.get(0))?;
        expiring_total += expiring_soon;
        partitions.push(PartitionRetention {
            removed: removed_by.remove(&partition).unwrap_or_default(),
            records,
            open,
            bytes,
            max_bytes: policy.max_bytes,
            max_age_seconds: policy.max_age_ms / 1000,
            closed_max_age_seconds: policy.closed_max_age_ms / 1000,
            expiring_soon,
            next_expiry: oldest.map(|t| ms_to_time(t + policy.max_age_ms)),
            partition,
        });
    }
    let free_bytes: i64 = conn.query_row(
        "SELECT (SELECT freelist_count FROM pragma_freelist_count()) * (SELECT page_size FROM pragma_page_size())",
        [],
        |r| r.get(0),
    )?;
    Ok(RetentionStatus {
        used_bytes: used_bytes(conn)?,
        free_bytes,
        max_total_bytes,
        expiring_soon: expiring_total,
        warn_before_seconds: warn_before_ms / 1000,
        tombstones: conn.query_row("SELECT count(*) FROM tombstones", [], |r| r.get(0))?,
        removed,
        partitions,
    })
}
