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

/// Every migration, in order. Append only; never edit one that has shipped.
const MIGRATIONS: &[&str] = &[V1];

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
