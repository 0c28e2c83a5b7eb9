//! Schema and migrations, keyed on `PRAGMA user_version`: migration N brings a file from
//! version N-1 to N. A file newer than this binary knows is refused, never "repaired".

use rusqlite::Connection;

use super::StoreError;

/// Statuses that close a record; keep in step with `model::Status::CLOSED` (a test checks).
pub const CLOSED_SQL: &str = "('replayed','resolved','skipped')";

const V1: &str = "
CREATE TABLE dead_letters (
    id               INTEGER PRIMARY KEY,
    partition        TEXT    NOT NULL,
    status           TEXT    NOT NULL,
    source           TEXT    NOT NULL,
    failure_class    TEXT    NOT NULL,
    class_rule       TEXT    NOT NULL,
    fingerprint      INTEGER NOT NULL,
    -- 16 bytes of sha256 over the identity (idempotency key, event id, n8n execution+node,
    -- or the body): what makes a repeat count as an occurrence.
    dedup_key        BLOB,
    occurrences      INTEGER NOT NULL DEFAULT 1,
    first_seen_at    INTEGER NOT NULL,   -- unix ms
    last_seen_at     INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    workflow_id      TEXT,
    workflow_name    TEXT,
    execution_id     TEXT,
    execution_url    TEXT,
    execution_mode   TEXT,
    retry_of         TEXT,
    node_name        TEXT,
    node_type        TEXT,
    http_status      INTEGER,
    error_code       TEXT,
    error_name       TEXT,
    error_message    TEXT,
    idempotency_key  TEXT,
    external_event_id TEXT,
    correlation_id   TEXT,
    tenant_id        TEXT,
    contract_version TEXT,
    business_object_type TEXT,
    business_object_id   TEXT,
    replay_url       TEXT,
    owner            TEXT,
    due_at           INTEGER,
    attempts         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX dead_letters_open_dedup ON dead_letters(partition, dedup_key)
    WHERE status NOT IN ('replayed','resolved','skipped');
CREATE INDEX dead_letters_status ON dead_letters(status, id);
CREATE INDEX dead_letters_fingerprint ON dead_letters(fingerprint, id);
CREATE INDEX dead_letters_workflow ON dead_letters(workflow_id, id);

-- Documents kept apart from the metadata so list scans stay small. kind: item | error.
-- version: payload edits (triage) add versions; the original stays.
CREATE TABLE payloads (
    id         INTEGER PRIMARY KEY,
    record_id  INTEGER NOT NULL REFERENCES dead_letters(id) ON DELETE CASCADE,
    kind       TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    codec      TEXT    NOT NULL,
    size       INTEGER NOT NULL,
    sha256     BLOB    NOT NULL,
    bytes      BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    actor      TEXT    NOT NULL
);
CREATE INDEX payloads_record ON payloads(record_id, kind, version);

-- Append-only audit of everything that happens to a record.
CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    record_id   INTEGER NOT NULL REFERENCES dead_letters(id) ON DELETE CASCADE,
    at          INTEGER NOT NULL,
    actor       TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    from_status TEXT,
    to_status   TEXT,
    detail      TEXT
);
CREATE INDEX events_record ON events(record_id, id);
";

/// Triage: optimistic-concurrency version, the payload version a replay sends, tags, flags,
/// and failure groups (one row per fingerprint, kept up to date at ingest, so listing groups
/// and detecting poison never scan the records).
const V2: &str = "
ALTER TABLE dead_letters ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE dead_letters ADD COLUMN payload_version INTEGER;
ALTER TABLE dead_letters ADD COLUMN tags TEXT;
ALTER TABLE dead_letters ADD COLUMN poison INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dead_letters ADD COLUMN credential_incident INTEGER NOT NULL DEFAULT 0;
UPDATE dead_letters SET payload_version = 1
    WHERE EXISTS (SELECT 1 FROM payloads p WHERE p.record_id = dead_letters.id AND p.kind = 'item');

CREATE TABLE groups (
    fingerprint     INTEGER PRIMARY KEY,
    failure_class   TEXT    NOT NULL,
    workflow_id     TEXT,
    workflow_name   TEXT,
    node_name       TEXT,
    sample_message  TEXT,
    first_seen_at   INTEGER NOT NULL,
    last_seen_at    INTEGER NOT NULL,
    records         INTEGER NOT NULL,
    -- Poison detection: records created since window_start (reset when the window passes).
    window_start    INTEGER NOT NULL,
    window_records  INTEGER NOT NULL,
    poison          INTEGER NOT NULL DEFAULT 0,
    poison_since    INTEGER
);
INSERT INTO groups (fingerprint, failure_class, workflow_id, workflow_name, node_name, sample_message,
                    first_seen_at, last_seen_at, records, window_start, window_records)
    SELECT fingerprint, failure_class, workflow_id, workflow_name, node_name, error_message,
           min(first_seen_at), max(last_seen_at), count(*), max(first_seen_at), 0
    FROM dead_letters GROUP BY fingerprint;
CREATE INDEX groups_last_seen ON groups(last_seen_at);
";

/// Delivery: when a record is next due, the lease of a record being sent, the last delivery
/// error, and one row per attempt with the target's answer.
const V3: &str = "
ALTER TABLE dead_letters ADD COLUMN next_attempt_at INTEGER;
ALTER TABLE dead_letters ADD COLUMN lease_owner TEXT;
ALTER TABLE dead_letters ADD COLUMN lease_expires_at INTEGER;
ALTER TABLE dead_letters ADD COLUMN last_error TEXT;
-- Lineage: the record whose replay failed again and produced this one.
ALTER TABLE dead_letters ADD COLUMN replay_of INTEGER;
UPDATE dead_letters SET next_attempt_at = last_seen_at WHERE status = 'retry_scheduled';
CREATE INDEX dead_letters_due ON dead_letters(next_attempt_at) WHERE status = 'retry_scheduled';
CREATE INDEX dead_letters_leased ON dead_letters(lease_expires_at) WHERE lease_owner IS NOT NULL;

CREATE TABLE attempts (
    id               INTEGER PRIMARY KEY,
    record_id        INTEGER NOT NULL REFERENCES dead_letters(id) ON DELETE CASCADE,
    attempt          INTEGER NOT NULL,
    started_at       INTEGER NOT NULL,
    target           TEXT    NOT NULL,
    url              TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    payload_version  INTEGER,
    -- success | transient | permanent
    outcome          TEXT    NOT NULL,
    status_code      INTEGER,
    latency_ms       INTEGER NOT NULL,
    error            TEXT,
    -- The start of the target's answer, capped and redacted.
    response_excerpt TEXT,
    retry_after_ms   INTEGER,
    -- The n8n execution the replay started, when the target's answer names it.
    downstream_execution_id TEXT
);
CREATE INDEX attempts_record ON attempts(record_id, id);
";

/// Replay jobs: the job (who asked, who approved, its state and settings) and its items in
/// order, each with its outcome; an index to find whether an idempotency key ever succeeded.
const V4: &str = "
CREATE TABLE replay_jobs (
    id                 INTEGER PRIMARY KEY,
    created_at         INTEGER NOT NULL,
    created_by         TEXT    NOT NULL,
    created_by_token   TEXT,
    -- awaiting_approval | running | paused | cancelled | stopped | done
    status             TEXT    NOT NULL,
    approved_by        TEXT,
    approved_at        INTEGER,
    new_keys           INTEGER NOT NULL DEFAULT 0,
    batch_size         INTEGER NOT NULL,
    stop_failure_ratio REAL    NOT NULL,
    spec               TEXT    NOT NULL,
    stop_reason        TEXT,
    updated_at         INTEGER NOT NULL
);
CREATE TABLE replay_job_items (
    job_id    INTEGER NOT NULL REFERENCES replay_jobs(id) ON DELETE CASCADE,
    seq       INTEGER NOT NULL,
    record_id INTEGER NOT NULL,
    -- pending | succeeded | failed | skipped
    state     TEXT    NOT NULL,
    detail    TEXT,
    PRIMARY KEY (job_id, seq)
);
CREATE INDEX attempts_key_success ON attempts(idempotency_key) WHERE outcome = 'success';
";

/// Retention: what was removed, when, why and by whom, without the payload (its hash and size
/// prove what it was).
const V5: &str = "
CREATE TABLE tombstones (
    id                INTEGER PRIMARY KEY,
    record_id         INTEGER NOT NULL,
    partition         TEXT    NOT NULL,
    workflow_id       TEXT,
    idempotency_key   TEXT,
    external_event_id TEXT,
    tenant_id         TEXT,
    status            TEXT    NOT NULL,
    failure_class     TEXT    NOT NULL,
    created_at        INTEGER NOT NULL,
    removed_at        INTEGER NOT NULL,
    -- age | closed_age | size | erasure | operator
    reason            TEXT    NOT NULL,
    actor             TEXT    NOT NULL,
    payload_sha256    BLOB,
    payload_size      INTEGER,
    -- Had anyone looked at it or acted on it (any event after its creation)?
    touched           INTEGER NOT NULL
);
CREATE INDEX tombstones_removed ON tombstones(removed_at);
CREATE INDEX tombstones_record ON tombstones(record_id);
CREATE INDEX dead_letters_first_seen ON dead_letters(first_seen_at);
";

/// Retention, part 2: what each record weighs (its stored documents), running totals per
/// partition and status kept by triggers (so size caps and, later, depth gauges never scan the
/// records), removal counts by reason, the id floor that keeps a removed record's id from ever
/// being handed out again, and the indexes the per-partition sweeps walk.
const V6: &str = "
ALTER TABLE dead_letters ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE dead_letters SET stored_bytes =
    coalesce((SELECT sum(length(bytes)) FROM payloads p WHERE p.record_id = dead_letters.id), 0);
CREATE TABLE partition_stats (
    partition TEXT    NOT NULL,
    status    TEXT    NOT NULL,
    records   INTEGER NOT NULL,
    bytes     INTEGER NOT NULL,
    PRIMARY KEY (partition, status)
) WITHOUT ROWID;
INSERT INTO partition_stats (partition, status, records, bytes)
    SELECT partition, status, count(*), sum(stored_bytes) FROM dead_letters GROUP BY partition, status;
CREATE TRIGGER partition_stats_insert AFTER INSERT ON dead_letters BEGIN
    INSERT INTO partition_stats (partition, status, records, bytes)
        VALUES (NEW.partition, NEW.status, 1, NEW.stored_bytes)
        ON CONFLICT (partition, status) DO UPDATE
        SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER partition_stats_delete AFTER DELETE ON dead_letters BEGIN
    UPDATE partition_stats SET records = records - 1, bytes = bytes - OLD.stored_bytes
        WHERE partition = OLD.partition AND status = OLD.status;
END;
CREATE TRIGGER partition_stats_update AFTER UPDATE OF partition, status, stored_bytes ON dead_letters
    WHEN OLD.partition IS NOT NEW.partition OR OLD.status IS NOT NEW.status
         OR OLD.stored_bytes IS NOT NEW.stored_bytes
BEGIN
    UPDATE partition_stats SET records = records - 1, bytes = bytes - OLD.stored_bytes
        WHERE partition = OLD.partition AND status = OLD.status;
    INSERT INTO partition_stats (partition, status, records, bytes)
        VALUES (NEW.partition, NEW.status, 1, NEW.stored_bytes)
        ON CONFLICT (partition, status) DO UPDATE
        SET records = records + 1, bytes = bytes + excluded.bytes;
END;
CREATE TABLE removals (
    partition TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    records   INTEGER NOT NULL,
    PRIMARY KEY (partition, reason)
) WITHOUT ROWID;
INSERT INTO removals (partition, reason, records)
    SELECT partition, reason, count(*) FROM tombstones GROUP BY partition, reason;
CREATE TABLE counters (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO counters (name, value) VALUES ('id_floor',
    max(coalesce((SELECT max(id) FROM dead_letters), 0), coalesce((SELECT max(record_id) FROM tombstones), 0)));
DROP INDEX dead_letters_first_seen;
CREATE INDEX dead_letters_partition_age ON dead_letters(partition, first_seen_at);
CREATE INDEX dead_letters_closed ON dead_letters(updated_at) WHERE status IN ('replayed','resolved','skipped');
";

/// Observability: what `GET /metrics` reads per scrape without scanning records — the oldest
/// open record of each partition (the partial index's first entry) and the records with more
/// than 3 attempts (a partial index that only holds them) — and the open records past their
/// due time that the over-SLA alert counts (an index range, not a scan of the open records).
const V7: &str = "
CREATE INDEX dead_letters_open_age ON dead_letters(partition, first_seen_at)
    WHERE status NOT IN ('replayed','resolved','skipped');
CREATE INDEX dead_letters_many_attempts ON dead_letters(attempts) WHERE attempts > 3;
CREATE INDEX dead_letters_open_due ON dead_letters(due_at)
    WHERE status NOT IN ('replayed','resolved','skipped');
";

/// n8n enrichment: whether deadletter fetched an Error Trigger record's execution from n8n's
/// API (NULL: not yet, or no API configured; pending: trying again after `enrich_after`;
/// enriched; unavailable) and what it learnt; an index over the records still to look at.
const V8: &str = "
ALTER TABLE dead_letters ADD COLUMN enrichment TEXT;
ALTER TABLE dead_letters ADD COLUMN enrichment_detail TEXT;
ALTER TABLE dead_letters ADD COLUMN enrich_after INTEGER;
CREATE INDEX dead_letters_to_enrich ON dead_letters(enrich_after)
    WHERE source = 'n8n_error_trigger' AND execution_id IS NOT NULL
      AND (enrichment IS NULL OR enrichment = 'pending');
";

/// n8n reconciliation: finding a record by its n8n execution (is this failure known?).
const V9: &str = "
CREATE INDEX dead_letters_execution ON dead_letters(execution_id) WHERE execution_id IS NOT NULL;
";

/// Every migration, in order. Append only; never edit one that has shipped.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9];

pub const LATEST: i64 = MIGRATIONS.len() as i64;

pub fn version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.query_row("PRAGMA user_version", [], |r| r.get(0))?)
}

/// Refuse a file written by a newer deadletter.
pub fn check_not_newer(conn: &Connection, path: &std::path::Path) -> Result<i64, StoreError> {
    let found = version(conn)?;
    if found > LATEST {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known: LATEST,
        });
    }
    Ok(found)
}

pub fn migrate(conn: &mut Connection, path: &std::path::Path) -> Result<(), StoreError> {
    let found = check_not_newer(conn, path)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Status;

    #[test]
    fn closed_sql_matches_the_model() {
        let names: Vec<String> = Status::CLOSED.iter().map(|s| format!("'{s}'")).collect();
        assert_eq!(CLOSED_SQL, format!("({})", names.join(",")));
        assert!(V1.contains(&format!("WHERE status NOT IN {CLOSED_SQL}")));
        assert!(V6.contains(&format!("WHERE status IN {CLOSED_SQL}")));
        assert!(V7.contains(&format!("WHERE status NOT IN {CLOSED_SQL}")));
    }

    #[test]
    fn a_version_1_file_with_records_migrates_to_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(V1).unwrap();
        c.pragma_update(None, "user_version", 1).unwrap();
        c.execute_batch(
            "INSERT INTO dead_letters (id, partition, status, source, failure_class, class_rule, fingerprint,
                 first_seen_at, last_seen_at, updated_at, workflow_id, error_message)
             VALUES (1, 'default', 'new', 'envelope', 'unknown', 'default', 42, 10, 20, 20, 'w', 'boom'),
                    (2, 'default', 'new', 'envelope', 'unknown', 'default', 42, 30, 40, 40, 'w', 'boom');
             INSERT INTO payloads (record_id, kind, version, codec, size, sha256, bytes, created_at, actor)
             VALUES (2, 'item', 1, 'raw', 1, x'00', x'31', 30, 'ingest');",
        )
        .unwrap();
        let mut c = c;
        migrate(&mut c, &path).unwrap();
        assert_eq!(version(&c).unwrap(), LATEST);
        let (records, first, last): (i64, i64, i64) = c
            .query_row(
                "SELECT records, first_seen_at, last_seen_at FROM groups WHERE fingerprint = 42",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((records, first, last), (2, 10, 40));
        let pv: Vec<Option<i64>> = c
            .prepare("SELECT payload_version FROM dead_letters ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(pv, vec![None, Some(1)]);
        // v6: running totals and the id floor start from what is there.
        let totals: (i64, i64, i64) = c
            .query_row(
                "SELECT records, bytes, (SELECT value FROM counters WHERE name = 'id_floor')
                 FROM partition_stats WHERE partition = 'default' AND status = 'new'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(totals, (2, 1, 2));
    }

    #[test]
    fn a_newer_file_is_refused_with_a_clear_message() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut c = Connection::open(&path).unwrap();
        migrate(&mut c, &path).unwrap();
        assert_eq!(version(&c).unwrap(), LATEST);
        migrate(&mut c, &path).unwrap();
        c.pragma_update(None, "user_version", LATEST + 1).unwrap();
        let msg = migrate(&mut c, &path).unwrap_err().to_string();
        assert!(msg.contains("newer deadletter"), "{msg}");
    }
}
