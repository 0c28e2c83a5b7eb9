//! The only module that knows SQLite.
//!
//! One file (`deadletter.db`, WAL). **All writes go through one writer thread** (`writer.rs`)
//! fed by a channel: it takes every request waiting, commits them in one transaction with
//! `synchronous=FULL` (group commit), and only then answers each caller — so an answer means
//! "on disk", and one fsync serves many requests. Readers use their own connections from a
//! small pool (`ReadPool`), which WAL lets run beside the writer. Documents are encoded
//! (`codec.rs`) by the caller before they reach the writer.
//!
//! What it must never do: import axum or know HTTP; hand rusqlite types to its callers.

mod apply;
pub mod codec;
pub mod enrich;
pub mod export;
pub mod jobs;
mod query;
pub mod retention;
pub mod schema;
pub mod stats;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

pub use apply::SYSTEM as SYSTEM_ACTOR;
pub use apply::{
    AttemptRecord, Change, Chosen, Claim, Claimed, Finish, GroupAction, GroupActionKind, GroupItem,
    IngestOutcome, NewRecord, Next, PayloadEdit, PoisonRule, SYSTEM,
};
pub use codec::{Codec, Encoded};
pub use query::{
    ms_to_time, AttemptView, DocumentView, Enrichment, EventView, GroupFilter, GroupSummary,
    ListFilter, ListPage, RecordDetail, RecordSummary,
};
pub use writer::{ImportBatch, Writer};

use crate::config::StorageConfig;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no dead letter with id {0}")]
    NotFound(i64),
    #[error("no failure group with fingerprint {0}")]
    NoGroup(String),
    #[error("no replay job with id {0}")]
    NoJob(i64),
    #[error("dead letter {id} changed since it was read (version {expected} was read; it is now at {current}); read it again")]
    Stale {
        id: i64,
        expected: i64,
        current: i64,
    },
    #[error(transparent)]
    IllegalMove(#[from] crate::model::MoveError),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "{path} was written by a newer deadletter (schema version {found}; this binary knows up to {known}). \
         Upgrade deadletter, or point --data-dir at another directory."
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("no database at {0}: has `deadletter serve` run with this data dir?")]
    Missing(PathBuf),
    #[error("the disk is full: {0}")]
    DiskFull(String),
    #[error("the writer has stopped")]
    WriterGone,
    #[error("{0}")]
    Busy(String),
    #[error("stored data is damaged: {0}")]
    Corrupt(String),
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("database error: {0}")]
    Sqlite(#[source] rusqlite::Error),
}

impl StoreError {
    /// A refusal of the request itself (nothing was written): not a storage failure.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StoreError::NotFound(_)
                | StoreError::NoGroup(_)
                | StoreError::NoJob(_)
                | StoreError::Stale { .. }
                | StoreError::IllegalMove(_)
                | StoreError::Invalid(_)
        )
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::SqliteFailure(f, ref msg)
                if f.code == rusqlite::ErrorCode::DiskFull =>
            {
                StoreError::DiskFull(msg.clone().unwrap_or_else(|| f.to_string()))
            }
            other => StoreError::Sqlite(other),
        }
    }
}

/// WAL pages between automatic checkpoints (4 KiB pages: ~16 MiB).
const WAL_AUTOCHECKPOINT_PAGES: i64 = 4000;

/// Pragmas every connection gets.
fn configure(conn: &Connection, busy_timeout: Duration) -> Result<(), StoreError> {
    conn.busy_timeout(busy_timeout)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "secure_delete", "ON")?;
    Ok(())
}

/// Open (creating if needed) the database for writing: the writer's connection. Sets WAL,
/// `synchronous=FULL` and incremental auto-vacuum, and runs migrations.
fn open_writer_conn(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let fresh = !path.exists();
    let mut conn = Connection::open(path)?;
    configure(&conn, busy_timeout)?;
    if fresh {
        // Must precede the first table: it decides the file's layout.
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
    }
    // The WAL switch is refused on a locked file; it is persistent, so only the first open matters.
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Corrupt(format!(
            "cannot switch {} to WAL (got {mode})",
            path.display()
        )));
    }
    // Durability promise: a commit is on disk before the writer answers anyone.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "cache_size", -16_000)?;
    // Checkpoint every ~16 MiB of WAL rather than SQLite's 4 MiB: fewer, larger checkpoints
    // write each hot index page to the main file less often and fsync it less often (measured
    // +12% ingest on a 4 ms-fsync disk, no change on a fast one; BENCHMARKS.md).
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    // On macOS a plain fsync leaves data in the drive's cache; F_FULLFSYNC is what makes a
    // commit survive power loss, which is what a 201 promises.
    #[cfg(target_os = "macos")]
    {
        conn.pragma_update(None, "fullfsync", "ON")?;
        conn.pragma_update(None, "checkpoint_fullfsync", "ON")?;
    }
    schema::migrate(&mut conn, path)?;
    // Prove now that this connection can write, so a database locked by another process (a
    // sqlite3 shell in a transaction, a backup) or on a read-only disk is a clear message at
    // start rather than failed ingests later.
    conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").map_err(|e| match e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) =>
        {
            StoreError::Busy(format!(
                "{} is locked by another process (a sqlite3 shell in a transaction? a backup?); stop it and start again",
                path.display()
            ))
        }
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ReadOnly => {
            StoreError::Busy(format!("{} cannot be written (read-only file or disk)", path.display()))
        }
        other => other.into(),
    })?;
    Ok(conn)
}

fn open_reader_conn(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    if !path.exists() {
        return Err(StoreError::Missing(path.to_owned()));
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    configure(&conn, busy_timeout)?;
    conn.pragma_update(None, "query_only", "ON")?;
    schema::check_not_newer(&conn, path)?;
    Ok(conn)
}

/// Reader connections, reused. Any number of readers may run beside the writer (WAL).
#[derive(Clone)]
pub struct ReadPool {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Arc<Mutex<Vec<Connection>>>,
}

impl ReadPool {
    const KEEP_IDLE: usize = 8;

    pub fn open(path: &Path, busy_timeout: Duration) -> Result<ReadPool, StoreError> {
        let first = open_reader_conn(path, busy_timeout)?;
        Ok(ReadPool {
            path: path.to_owned(),
            busy_timeout,
            idle: Arc::new(Mutex::new(vec![first])),
        })
    }

    /// Run `f` on a reader connection (blocking: call from a blocking context).
    pub fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let taken = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match taken {
            Some(c) => c,
            None => open_reader_conn(&self.path, self.busy_timeout)?,
        };
        let out = f(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < Self::KEEP_IDLE {
            idle.push(conn);
        }
        out
    }

    pub fn list(&self, filter: &ListFilter) -> Result<ListPage, StoreError> {
        self.with(|c| query::list(c, filter))
    }

    pub fn get(&self, id: i64) -> Result<RecordDetail, StoreError> {
        self.with(|c| query::get(c, id))
    }

    pub fn summary(&self, id: i64) -> Result<RecordSummary, StoreError> {
        self.with(|c| query::summary_by_id(c, id))
    }

    /// One payload version (None: the newest), decoded.
    pub fn payload(
        &self,
        id: i64,
        version: Option<i64>,
    ) -> Result<Option<DocumentView>, StoreError> {
        self.with(|c| query::document(c, id, "item", version))
    }

    pub fn enrich_candidates(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<enrich::Candidate>, StoreError> {
        self.with(|c| enrich::candidates(c, now_ms, limit))
    }

    pub fn known_execution(
        &self,
        workflow_id: &str,
        execution_id: &str,
    ) -> Result<bool, StoreError> {
        self.with(|c| enrich::known_execution(c, workflow_id, execution_id))
    }

    pub fn counter(&self, name: &str) -> Result<Option<i64>, StoreError> {
        self.with(|c| enrich::counter(c, name))
    }

    pub fn gauges(&self) -> Result<stats::Gauges, StoreError> {
        self.with(stats::gauges)
    }

    pub fn stats(&self, now_ms: i64, money: &[String]) -> Result<stats::Stats, StoreError> {
        self.with(|c| stats::stats(c, now_ms, money))
    }

    pub fn tombstones(&self, limit: usize) -> Result<Vec<retention::TombstoneView>, StoreError> {
        self.with(|c| retention::tombstones(c, limit))
    }

    /// Every payload version of a record with its text, oldest (the original) first.
    pub fn payload_history(&self, id: i64) -> Result<Vec<DocumentView>, StoreError> {
        self.with(|c| query::documents(c, id, "item"))
    }

    /// The newest replay jobs, each with its counts (no items).
    pub fn jobs(&self, limit: usize) -> Result<Vec<jobs::JobView>, StoreError> {
        self.with(|c| jobs::list(c, limit))
    }

    pub fn job(&self, id: i64) -> Result<jobs::JobView, StoreError> {
        self.with(|c| jobs::get(c, id))
    }

    pub fn open_jobs_of(&self, actor: &str) -> Result<i64, StoreError> {
        self.with(|c| jobs::open_jobs_of(c, actor))
    }

    pub fn running_jobs(&self) -> Result<Vec<i64>, StoreError> {
        self.with(jobs::running)
    }

    /// The record whose send with this key succeeded, if any.
    pub fn key_succeeded(&self, key: &str) -> Result<Option<i64>, StoreError> {
        self.with(|c| jobs::key_succeeded(c, key))
    }

    /// Is any lease past its expiry at `now_ms`? (Cheap: saves the writer a round trip.)
    pub fn has_expired_leases(&self, now_ms: i64) -> Result<bool, StoreError> {
        self.with(|c| {
            Ok(c.prepare_cached(
                "SELECT 1 FROM dead_letters WHERE lease_owner IS NOT NULL AND lease_expires_at < ?1 LIMIT 1",
            )?
            .exists([now_ms])?)
        })
    }

    /// Records due for an automatic retry at `now_ms`.
    pub fn due(&self, now_ms: i64, limit: usize) -> Result<Vec<RecordSummary>, StoreError> {
        self.with(|c| query::due(c, now_ms, limit))
    }

    pub fn groups(&self, filter: &GroupFilter) -> Result<Vec<GroupSummary>, StoreError> {
        self.with(|c| query::groups(c, filter))
    }

    pub fn ping(&self) -> Result<(), StoreError> {
        self.with(|c| Ok(c.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?))
    }
}

/// `PRAGMA integrity_check` and `foreign_key_check` on a database file: the problems found
/// (empty: healthy). Reads only; works while the server runs.
pub fn check(path: &Path, busy_timeout: Duration) -> Result<Vec<String>, StoreError> {
    let conn = open_reader_conn(path, busy_timeout)?;
    let mut problems: Vec<String> = conn
        .prepare("PRAGMA integrity_check")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|l| l != "ok")
        .collect();
    let fk = conn
        .prepare("PRAGMA foreign_key_check")?
        .query_map([], |r| {
            Ok(format!(
                "foreign key: {} row {} -> {}",
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    problems.extend(fk);
    Ok(problems)
}

/// A consistent copy of the database at `to` (SQLite's VACUUM INTO: one read transaction, so
/// it is a snapshot even while the server writes). Refuses to overwrite a file.
pub fn backup(path: &Path, to: &Path, busy_timeout: Duration) -> Result<(), StoreError> {
    if !path.exists() {
        return Err(StoreError::Missing(path.to_owned()));
    }
    if to.exists() {
        return Err(StoreError::Invalid(format!(
            "{} exists; give a new file",
            to.display()
        )));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)?;
    configure(&conn, busy_timeout)?;
    schema::check_not_newer(&conn, path)?;
    conn.execute("VACUUM INTO ?1", [to.to_string_lossy()])?;
    Ok(())
}

/// The store as the server holds it: the writer's handle and the reader pool.
#[derive(Clone)]
pub struct Store {
    pub writer: Writer,
    pub readers: ReadPool,
    pub path: PathBuf,
    /// Held for as long as the store is open: one deadletter per data dir (leases and the
    /// single writer assume it).
    _instance: Arc<std::fs::File>,
}

impl Store {
    /// Create the data dir if needed, open and migrate the database, start the writer thread.
    pub fn open(cfg: &StorageConfig, poison: PoisonRule) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io {
            path: cfg.data_dir.clone(),
            source,
        };
        std::fs::create_dir_all(&cfg.data_dir).map_err(io)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // Payloads are customer data: the directory is the user's alone.
            std::fs::set_permissions(&cfg.data_dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io)?;
        }
        let lock_path = cfg.data_dir.join("deadletter.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io)?;
        if lock.try_lock().is_err() {
            return Err(StoreError::Busy(format!(
                "another deadletter is already serving {}; stop it first (one server per data dir)",
                cfg.data_dir.display()
            )));
        }
        let path = cfg.db_path();
        let conn = open_writer_conn(&path, cfg.busy_timeout)?;
        let writer = Writer::start(conn, cfg.writer_max_batch, poison)?;
        let readers = ReadPool::open(&path, cfg.busy_timeout)?;
        Ok(Store {
            writer,
            readers,
            path,
            _instance: Arc::new(lock),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::ingest::{Ingestor, RequestContext};
    use crate::model::Source;

    fn store(dir: &Path) -> (Store, Ingestor) {
        let mut config = Config::default_config().unwrap();
        config.set_data_dir(dir.to_owned());
        let poison = PoisonRule {
            threshold: 3,
            window_ms: 3_600_000,
        };
        (
            Store::open(&config.storage, poison).unwrap(),
            Ingestor::new(&config),
        )
    }

    fn record(i: &Ingestor, body: &str) -> NewRecord {
        let ctx = RequestContext {
            actor: "test".into(),
            ..RequestContext::default()
        };
        i.prepare(Source::Envelope, body.as_bytes(), &ctx, 1_000)
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_ingests_all_commit_and_repeats_in_one_batch_deduplicate() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ing) = store(dir.path());
        let ing = Arc::new(ing);
        let mut tasks = Vec::new();
        for n in 0..200 {
            let (w, ing) = (store.writer.clone(), ing.clone());
            // Every item twice: 100 records, each seen twice, however the batches fall.
            let body = format!(
                r#"{{"payload":{{"n":{}}},"idempotency_key":"k{}"}}"#,
                n / 2,
                n / 2
            );
            tasks.push(tokio::spawn(
                async move { w.ingest(record(&ing, &body)).await },
            ));
        }
        let mut created = std::collections::HashSet::new();
        let mut repeats = 0;
        for t in tasks {
            let o = t.await.unwrap().unwrap();
            if o.created {
                assert!(created.insert(o.id), "one id created twice");
            } else {
                repeats += 1;
            }
        }
        assert_eq!((created.len(), repeats), (100, 100));
        let recs = store.readers.clone();
        let page = tokio::task::spawn_blocking(move || {
            recs.list(&ListFilter {
                limit: 1000,
                ..ListFilter::default()
            })
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(page.items.len(), 100);
        assert!(page.items.iter().all(|r| r.occurrences == 2));
    }

    #[test]
    fn the_file_is_wal_with_incremental_vacuum_and_the_latest_schema() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = store(dir.path());
        store
            .readers
            .with(|c| {
                let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
                let vacuum: i64 = c.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))?;
                let fk: i64 = c.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
                let secure: i64 = c.query_row("PRAGMA secure_delete", [], |r| r.get(0))?;
                assert_eq!(mode, "wal");
                assert_eq!(vacuum, 2, "incremental");
                assert_eq!((fk, secure), (1, 1));
                assert_eq!(schema::version(c)?, schema::LATEST);
                Ok(())
            })
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_past_their_age_go_and_leave_tombstones() {
        use crate::config::RetentionConfig;
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let (store, ing) = store(dir.path());
        let day = 86_400_000i64;
        let ctx = RequestContext {
            actor: "test".into(),
            ..RequestContext::default()
        };
        // Three records first seen on day 0; one of them resolved on day 1.
        let mut ids = Vec::new();
        for n in 0..3 {
            let body = format!(
                r#"{{"payload":{{"n":{n},"secret_marker":"m-{n}"}},"idempotency_key":"k{n}"}}"#
            );
            let rec = ing
                .prepare(Source::Envelope, body.as_bytes(), &ctx, 0)
                .unwrap();
            ids.push(store.writer.ingest(rec).await.unwrap().id.get());
        }
        store
            .writer
            .change(Change {
                id: ids[0],
                actor: "ana".into(),
                at_ms: day,
                status: Some((crate::model::Status::Resolved, None)),
                ..Change::default()
            })
            .await
            .unwrap();
        let cfg = RetentionConfig {
            max_age: Duration::from_secs(14 * 86_400),
            closed_max_age: Duration::from_secs(7 * 86_400),
            tombstone_max_age: Duration::from_secs(400 * 86_400),
            sweep_every: Duration::from_secs(600),
            batch: 1,
            ..Config::default_config().unwrap().retention
        };
        // Day 5: nothing is due.
        let s = crate::retention::sweep_once(&store, &cfg, 5 * day)
            .await
            .unwrap();
        assert_eq!(s.total(), 0);
        // Day 9: the resolved one (closed on day 1, kept 7 days) goes.
        let s = crate::retention::sweep_once(&store, &cfg, 9 * day)
            .await
            .unwrap();
        assert_eq!((s.closed_age, s.age), (1, 0));
        // Day 15: the open ones pass 14 days and go, one batch at a time.
        let s = crate::retention::sweep_once(&store, &cfg, 15 * day)
            .await
            .unwrap();
        assert_eq!((s.closed_age, s.age), (0, 2));
        let r = store.readers.clone();
        let (tombs, gone) = tokio::task::spawn_blocking(move || {
            (r.tombstones(10).unwrap(), r.get(ids[1]).is_err())
        })
        .await
        .unwrap();
        assert!(gone);
        assert_eq!(tombs.len(), 3);
        let first = tombs.iter().find(|t| t.reason == "closed_age").unwrap();
        assert_eq!(
            (first.status.as_str(), first.touched),
            ("resolved", true),
            "someone had acted on it"
        );
        let aged: Vec<_> = tombs.iter().filter(|t| t.reason == "age").collect();
        assert!(aged
            .iter()
            .all(|t| !t.touched && t.actor == "deadletter" && t.payload_size.is_some()));
        assert_eq!(
            aged.iter()
                .filter(|t| t.idempotency_key.as_deref() == Some("k1"))
                .count(),
            1
        );
        // Tombstones themselves expire after their own age.
        let s = crate::retention::sweep_once(&store, &cfg, 500 * day)
            .await
            .unwrap();
        assert_eq!(s.tombstones, 3);
    }

    /// Ingest one record into `partition` at `at_ms` with a payload of about `size` bytes.
    async fn put(
        store: &Store,
        ing: &Ingestor,
        partition: &str,
        at_ms: i64,
        n: usize,
        size: usize,
    ) -> i64 {
        let ctx = RequestContext {
            actor: "test".into(),
            ..RequestContext::default()
        };
        let body = serde_json::json!({
            "partition": partition,
            "idempotency_key": format!("{partition}-{n}"),
            // Short enough to be stored uncompressed: its stored size is its size.
            "payload": {"n": n, "fill": "x".repeat(size)},
        })
        .to_string();
        let rec = ing
            .prepare(Source::Envelope, body.as_bytes(), &ctx, at_ms)
            .unwrap();
        store.writer.ingest(rec).await.unwrap().id.get()
    }

    /// The running totals the triggers keep, against a count of the records themselves.
    fn totals_match(store: &Store) {
        store
            .readers
            .with(|c| {
                let kept: Vec<(String, String, i64, i64)> = c
                    .prepare("SELECT partition, status, records, bytes FROM partition_stats WHERE records > 0 ORDER BY 1, 2")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect::<Result<_, _>>()?;
                let counted: Vec<(String, String, i64, i64)> = c
                    .prepare(
                        "SELECT d.partition, d.status, count(*),
                                sum((SELECT coalesce(sum(length(bytes)), 0) FROM payloads p WHERE p.record_id = d.id))
                         FROM dead_letters d GROUP BY 1, 2 ORDER BY 1, 2",
                    )?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect::<Result<_, _>>()?;
                assert_eq!(kept, counted);
                Ok(())
            })
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn size_caps_hold_in_every_partition_and_the_oldest_go_first() {
        use crate::config::PartitionRetention;
        let dir = tempfile::tempdir().unwrap();
        let (store, ing) = store(dir.path());
        let minute = 60_000i64;
        // 40 partitions of 25 records of ~500 bytes, interleaved in time; p7 may hold more.
        let mut ids: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        for n in 0..25 {
            for p in 0..40 {
                let name = format!("p{p}");
                let id = put(&store, &ing, &name, (n * 40 + p) * minute, n as usize, 500).await;
                ids.entry(name).or_default().push(id);
            }
        }
        totals_match(&store);
        let mut cfg = Config::default_config().unwrap().retention;
        cfg.batch = 50;
        cfg.max_bytes = Some(5_000);
        cfg.max_total_bytes = None;
        cfg.partitions.insert(
            "p7".into(),
            PartitionRetention {
                max_age: cfg.max_age,
                closed_max_age: cfg.closed_max_age,
                max_bytes: Some(8_000),
            },
        );
        let now = 25 * 40 * minute;
        let swept = crate::retention::sweep_once(&store, &cfg, now)
            .await
            .unwrap();
        assert_eq!((swept.age, swept.closed_age), (0, 0));
        let status = crate::retention::status(&store, &cfg, now).await.unwrap();
        assert_eq!(status.partitions.len(), 40);
        let mut removed = 0;
        for p in &status.partitions {
            let cap = if p.partition == "p7" { 8_000 } else { 5_000 };
            assert!(p.bytes <= cap, "{} holds {} > {cap}", p.partition, p.bytes);
            // Each record weighs ~560 stored bytes: the cap is met with little to spare.
            assert!(
                p.bytes > cap - 600,
                "{} removed too much: {}",
                p.partition,
                p.bytes
            );
            // What is left is the newest records.
            let left: Vec<i64> = store
                .readers
                .with(|c| {
                    Ok(
                        c.prepare("SELECT id FROM dead_letters WHERE partition = ?1 ORDER BY id")?
                            .query_map([&p.partition], |r| r.get(0))?
                            .collect::<Result<_, _>>()?,
                    )
                })
                .unwrap();
            let all = &ids[&p.partition];
            assert_eq!(
                left,
                all[all.len() - left.len()..].to_vec(),
                "{}",
                p.partition
            );
            assert_eq!(
                p.removed.get("size").copied().unwrap_or(0),
                (all.len() - left.len()) as i64
            );
            removed += all.len() - left.len();
        }
        assert_eq!(swept.size, removed);
        assert_eq!(status.removed.get("size").copied(), Some(removed as i64));
        let tombs = store.readers.tombstones(10_000).unwrap();
        assert_eq!(tombs.len(), removed);
        assert!(tombs
            .iter()
            .all(|t| t.reason == "size" && t.payload_size.unwrap() > 500));
        totals_match(&store);
        // A second sweep has nothing to do.
        let again = crate::retention::sweep_once(&store, &cfg, now)
            .await
            .unwrap();
        assert_eq!(again.total(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partitions_keep_their_own_age_and_the_total_cap_bounds_the_file() {
        use crate::config::PartitionRetention;
        let dir = tempfile::tempdir().unwrap();
        let (store, ing) = store(dir.path());
        let day = 86_400_000i64;
        let a = put(&store, &ing, "ops", 0, 1, 10).await;
        let b = put(&store, &ing, "billing", 0, 1, 10).await;
        // One closed record in each, resolved on day 1.
        let ops_closed = put(&store, &ing, "ops", 0, 2, 10).await;
        let billing_closed = put(&store, &ing, "billing", 0, 2, 10).await;
        for id in [ops_closed, billing_closed] {
            store
                .writer
                .change(Change {
                    id,
                    actor: "ana".into(),
                    at_ms: day,
                    status: Some((crate::model::Status::Resolved, None)),
                    ..Change::default()
                })
                .await
                .unwrap();
        }
        let mut cfg = Config::default_config().unwrap().retention;
        cfg.partitions.insert(
            "billing".into(),
            PartitionRetention {
                max_age: std::time::Duration::from_secs(30 * 86_400),
                closed_max_age: std::time::Duration::from_secs(20 * 86_400),
                max_bytes: None,
            },
        );
        // Day 13: ops's open record expires within warn_before (2 days), on day 14; billing's
        // on day 30.
        let s = crate::retention::status(&store, &cfg, 13 * day)
            .await
            .unwrap();
        assert_eq!(s.expiring_soon, 1);
        let ops = s.partitions.iter().find(|p| p.partition == "ops").unwrap();
        assert_eq!(
            (
                ops.expiring_soon,
                ops.next_expiry.unwrap().timestamp_millis()
            ),
            (1, 14 * day)
        );
        let gone = |id: i64| store.readers.get(id).is_err();
        // Day 9: ops's closed record (7 days) goes, billing's (20 days) stays.
        let swept = crate::retention::sweep_once(&store, &cfg, 9 * day)
            .await
            .unwrap();
        assert_eq!((swept.closed_age, swept.age), (1, 0));
        assert!(gone(ops_closed) && !gone(billing_closed));
        let swept = crate::retention::sweep_once(&store, &cfg, 15 * day)
            .await
            .unwrap();
        assert_eq!((swept.closed_age, swept.age), (0, 1));
        assert!(gone(a) && !gone(b) && !gone(billing_closed));
        let swept = crate::retention::sweep_once(&store, &cfg, 22 * day)
            .await
            .unwrap();
        assert_eq!((swept.closed_age, swept.age), (1, 0));
        let swept = crate::retention::sweep_once(&store, &cfg, 31 * day)
            .await
            .unwrap();
        assert_eq!(swept.age, 1);
        assert!(gone(b));

        // The total cap: 3,000 records of ~2 KB, then a cap of half of what the file uses.
        for n in 0..3_000 {
            put(
                &store,
                &ing,
                &format!("t{}", n % 5),
                40 * day + n,
                n as usize,
                900,
            )
            .await;
        }
        let used = store
            .readers
            .with(crate::store::retention::used_bytes)
            .unwrap();
        cfg.max_bytes = None;
        cfg.max_total_bytes = Some((used / 2) as u64);
        let swept = crate::retention::sweep_once(&store, &cfg, 41 * day)
            .await
            .unwrap();
        let after = store
            .readers
            .with(crate::store::retention::used_bytes)
            .unwrap();
        assert!(after <= used / 2, "{after} > {}", used / 2);
        // The space went back to the file system: no free pages are left in the file.
        let (free, pages): (i64, i64) = store
            .readers
            .with(|c| {
                Ok(c.query_row(
                    "SELECT (SELECT freelist_count FROM pragma_freelist_count()),
                            (SELECT page_count FROM pragma_page_count())",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?)
            })
            .unwrap();
        assert_eq!(free, 0, "{pages} pages, {free} of them free");
        assert!(swept.size > 1_000 && swept.size < 2_000, "{swept:?}");
        // The oldest went: every record left is newer than every one removed.
        let newest_gone: i64 = store
            .readers
            .with(|c| {
                Ok(c.query_row(
                    "SELECT max(record_id) FROM tombstones WHERE reason = 'size'",
                    [],
                    |r| r.get(0),
                )?)
            })
            .unwrap();
        let min_left: i64 = store
            .readers
            .with(|c| Ok(c.query_row("SELECT min(id) FROM dead_letters", [], |r| r.get(0))?))
            .unwrap();
        assert!(min_left > newest_gone);
        totals_match(&store);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_removed_records_id_is_never_handed_out_again() {
        use super::retention::{Erasure, ErasureSelector};
        let dir = tempfile::tempdir().unwrap();
        let (store, ing) = store(dir.path());
        put(&store, &ing, "p", 0, 1, 10).await;
        let newest = put(&store, &ing, "p", 0, 2, 10).await;
        store
            .writer
            .erase(Erasure {
                selector: ErasureSelector::Ids(vec![newest]),
                actor: "dpo".into(),
                at_ms: 1,
            })
            .await
            .unwrap();
        let next = put(&store, &ing, "p", 2, 3, 10).await;
        assert_eq!(next, newest + 1, "the erased record's id came back");
        totals_match(&store);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stats_match_a_known_data_set() {
        use crate::model::Status;
        let dir = tempfile::tempdir().unwrap();
        let (store, ing) = store(dir.path());
        let (h, d) = (3_600_000i64, 86_400_000i64);
        let now = 10 * d;
        let close = |id: i64, to: Status, at: i64| {
            let w = store.writer.clone();
            async move {
                w.change(Change {
                    id,
                    actor: "ana".into(),
                    at_ms: at,
                    status: Some((to, Some("done".into()))),
                    ..Change::default()
                })
                .await
                .unwrap();
            }
        };
        let r1 = put(&store, &ing, "billing", now - 3 * d, 1, 10).await;
        close(r1, Status::Resolved, now - 3 * d + h).await;
        let r2 = put(&store, &ing, "billing", now - 5 * d, 2, 10).await;
        close(r2, Status::Skipped, now - 2 * d).await;
        put(&store, &ing, "ops", now - h / 2, 3, 10).await;
        put(&store, &ing, "ops", now - 2 * h, 4, 10).await;
        put(&store, &ing, "ops", now - 30 * h, 5, 10).await;
        put(&store, &ing, "billing", now - 6 * d, 6, 10).await;

        let s = store.readers.stats(now, &["billing".into()]).unwrap();
        assert_eq!((s.total, s.open), (6, 4));
        assert_eq!((s.new_last_hour, s.new_last_day), (1, 2));
        let mut hourly = vec![0; 24];
        hourly[22] = 1; // two hours ago
        hourly[23] = 1; // half an hour ago
        assert_eq!(s.ingress_per_hour, hourly);
        assert_eq!((s.open_older_than_hour, s.open_older_than_day), (3, 2));
        // Unknown-class records are due 24 h after they are first seen.
        assert_eq!(s.open_past_sla, 2);
        assert_eq!(s.closed_shares["resolved"], 0.5);
        assert_eq!(s.closed_shares["skipped"], 0.5);
        assert_eq!(s.closed_shares["replayed"], 0.0);
        let r = s.time_to_resolution.unwrap();
        assert_eq!(r.records, 2);
        assert_eq!(r.mean_seconds, ((h + 3 * d) / 2) as f64 / 1000.0);
        assert_eq!(r.p90_seconds, (3 * d) as f64 / 1000.0);
        let slo = s.slo_48h.unwrap();
        assert_eq!(
            (slo.eligible, slo.met),
            (3, 1),
            "only r1 closed within 48 h"
        );
        assert_eq!(s.business_loss_risk, 1);
        let billing = s
            .partitions
            .iter()
            .find(|p| p.partition == "billing")
            .unwrap();
        assert_eq!(
            (billing.open, billing.closed, billing.money_impacting),
            (1, 2, true)
        );
        assert_eq!(s.top_workflows.len(), 1);
        assert_eq!(s.top_workflows[0].open, 4);
        assert_eq!(s.top_fingerprints.iter().map(|f| f.open).sum::<i64>(), 4);
    }
}
