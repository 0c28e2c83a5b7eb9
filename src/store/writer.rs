//! The single writer: one thread, one connection, group commit.
//!
//! Callers send a request and await its answer. The thread blocks for the first request, then
//! takes every other one already waiting (up to `max_batch`), applies them all inside one
//! `BEGIN IMMEDIATE … COMMIT` — each under its own savepoint, so one failing request never
//! sinks the others — and answers each only after the commit (`synchronous=FULL`) returned.
//! While it is in fsync, new requests queue up and form the next batch: that is how ingest
//! gets far past one fsync per request.
//!
//! Nothing expensive happens here: documents arrive already encoded (see `codec`). WAL
//! checkpoints stay on this thread (SQLite's auto-checkpoint every 1000 pages): measured, a
//! separate checkpointer thread was slower, because under steady load the WAL could never be
//! reset and kept growing into freshly allocated file blocks.

use std::sync::Arc;
use std::thread::JoinHandle;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::codec::Encoded;
use super::schema::CLOSED_SQL;
use super::StoreError;
use crate::model::{EventKind, FailureClass, FailureFacts, Fingerprint, RecordId, Source, Status};

/// One failure ready to store: parsed, redacted, classified, its documents encoded.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub partition: String,
    pub source: Source,
    pub status: Status,
    pub failure_class: FailureClass,
    pub class_rule: String,
    pub fingerprint: Fingerprint,
    pub dedup_key: Option<[u8; 16]>,
    pub at_ms: i64,
    pub actor: String,
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
}

enum Request {
    Ingest {
        rec: Box<NewRecord>,
        reply: oneshot::Sender<Result<IngestOutcome, StoreError>>,
        /// A place in the queue, given back when the request is answered (backpressure).
        _slot: OwnedSemaphorePermit,
    },
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct Writer {
    tx: std::sync::mpsc::Sender<Request>,
    /// At most `QUEUE` requests wait for the writer; callers beyond that wait (asynchronously)
    /// for a slot. Closed when the writer stops.
    slots: Arc<Semaphore>,
    _thread: Arc<JoinOnDrop>,
}

/// Joins the writer thread when the last handle goes, so every acknowledged batch is
/// committed and the connection closed (checkpointing the WAL) before the process exits.
struct JoinOnDrop(std::sync::Mutex<Option<JoinHandle<()>>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        // The channel's sender lives beside this in `Writer`, dropped just before us only when
        // every handle is gone, so the thread is already on its way out.
        if let Some(h) = self.0.lock().ok().and_then(|mut g| g.take()) {
            let _ = h.join();
        }
    }
}

impl Writer {
    /// How many requests may wait for the writer before callers wait to enqueue.
    const QUEUE: usize = 8192;

    /// Start the writer thread on `conn`.
    pub fn start(conn: Connection, max_batch: usize) -> Result<Writer, StoreError> {
        // A std channel, not tokio's: the writer needs `recv_timeout` with sub-millisecond
        // precision to linger for a batch (tokio's timer ticks in milliseconds).
        let (tx, rx) = std::sync::mpsc::channel();
        let slots = Arc::new(Semaphore::new(Self::QUEUE));
        let closing = slots.clone();
        let handle = std::thread::Builder::new()
            .name("deadletter-writer".into())
            .spawn(move || {
                run(conn, rx, max_batch.max(1));
                closing.close();
            })
            .map_err(|source| StoreError::Io {
                path: "writer thread".into(),
                source,
            })?;
        Ok(Writer {
            tx,
            slots,
            _thread: Arc::new(JoinOnDrop(std::sync::Mutex::new(Some(handle)))),
        })
    }

    async fn enqueue(
        &self,
        rec: NewRecord,
    ) -> Result<oneshot::Receiver<Result<IngestOutcome, StoreError>>, StoreError> {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::WriterGone)?;
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request::Ingest {
                rec: Box::new(rec),
                reply,
                _slot: slot,
            })
            .map_err(|_| StoreError::WriterGone)?;
        Ok(answer)
    }

    /// Store one failure; resolves once it is committed.
    pub async fn ingest(&self, rec: NewRecord) -> Result<IngestOutcome, StoreError> {
        let answer = self.enqueue(rec).await?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Store several failures in order (they usually share one commit); one result each.
    pub async fn ingest_many(
        &self,
        recs: Vec<NewRecord>,
    ) -> Vec<Result<IngestOutcome, StoreError>> {
        let mut waiting = Vec::with_capacity(recs.len());
        for rec in recs {
            waiting.push(self.enqueue(rec).await);
        }
        let mut out = Vec::with_capacity(waiting.len());
        for w in waiting {
            out.push(match w {
                Ok(answer) => answer.await.unwrap_or(Err(StoreError::WriterGone)),
                Err(e) => Err(e),
            });
        }
        out
    }

    pub fn is_alive(&self) -> bool {
        !self.slots.is_closed()
    }
}

/// The longest the writer waits for more requests before committing what it has.
const MAX_LINGER: Duration = Duration::from_millis(2);

fn drain(rx: &Receiver<Request>, batch: &mut Vec<Request>, max: usize) {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
}

/// The writer loop. After the first request it takes everything already waiting; then, if the
/// previous commit answered more callers than are back yet, it lingers — at most half the
/// previous commit's duration, never over `MAX_LINGER` — because those callers are likely
/// sending again, and one fsync should serve them all. Without this, batches alternate between
/// the few requests that made it before the writer woke and the many that arrived during the
/// following commit (measured: ~15 per commit at 32 connections on a 4 ms-fsync disk).
fn run(mut conn: Connection, rx: Receiver<Request>, max_batch: usize) {
    let mut batch = Vec::with_capacity(max_batch);
    let mut expected = 1;
    let mut last_commit = Duration::ZERO;
    while let Ok(first) = rx.recv() {
        batch.push(first);
        drain(&rx, &mut batch, max_batch);
        let want = expected.min(max_batch);
        if batch.len() < want {
            let deadline = Instant::now() + (last_commit / 2).min(MAX_LINGER);
            while batch.len() < want {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match rx.recv_timeout(left) {
                    Ok(r) => {
                        batch.push(r);
                        drain(&rx, &mut batch, max_batch);
                    }
                    Err(_) => break,
                }
            }
        }
        let started = Instant::now();
        let results = commit_batch(&mut conn, &batch);
        last_commit = started.elapsed();
        expected = batch.len();
        tracing::trace!(
            batch = batch.len(),
            micros = last_commit.as_micros() as u64,
            "group commit"
        );
        for (req, res) in batch.drain(..).zip(results) {
            match req {
                Request::Ingest { reply, .. } => {
                    let _ = reply.send(res);
                }
            }
        }
    }
    tracing::debug!("writer: channel closed, stopping");
}

/// Apply every request in one transaction, then answer. The fast path runs them back to back;
/// only when one fails is the transaction rolled back and the batch redone with a savepoint per
/// request, so a bad request sinks no other (savepoints cost a statement pair and a
/// sub-journal each, which the common case should not pay). A failed commit fails them all:
/// none of them was acknowledged.
fn commit_batch(
    conn: &mut Connection,
    batch: &[Request],
) -> Vec<Result<IngestOutcome, StoreError>> {
    match run_batch(conn, batch, false) {
        Ok(results) => results,
        Err(BatchFailed::Request) => match run_batch(conn, batch, true) {
            Ok(results) => results,
            Err(BatchFailed::Request) => unreachable!("isolated batches report per request"),
            Err(BatchFailed::Whole(e)) => fail_all(batch, e),
        },
        Err(BatchFailed::Whole(e)) => fail_all(batch, e),
    }
}

enum BatchFailed {
    /// A request failed on the fast path: redo the batch with isolation.
    Request,
    /// The transaction itself failed: nothing was stored.
    Whole(StoreError),
}

fn fail_all(batch: &[Request], e: StoreError) -> Vec<Result<IngestOutcome, StoreError>> {
    tracing::error!(error = %e, "writer: transaction failed; nothing in this batch was stored");
    batch.iter().map(|_| Err(clone_err(&e))).collect()
}

fn run_batch(
    conn: &mut Connection,
    batch: &[Request],
    isolate: bool,
) -> Result<Vec<Result<IngestOutcome, StoreError>>, BatchFailed> {
    let mut tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| BatchFailed::Whole(e.into()))?;
    let mut results = Vec::with_capacity(batch.len());
    for req in batch {
        let Request::Ingest { rec, .. } = req;
        if isolate {
            let res = (|| -> Result<IngestOutcome, StoreError> {
                let sp = tx.savepoint()?;
                let out = apply_ingest(&sp, rec)?;
                sp.commit()?;
                Ok(out)
            })();
            results.push(res);
        } else {
            match apply_ingest(&tx, rec) {
                Ok(out) => results.push(Ok(out)),
                // Dropping `tx` rolls the whole batch back.
                Err(_) => return Err(BatchFailed::Request),
            }
        }
    }
    tx.commit().map_err(|e| BatchFailed::Whole(e.into()))?;
    Ok(results)
}

fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::DiskFull(m) => StoreError::DiskFull(m.clone()),
        other => StoreError::Corrupt(format!("write failed: {other}")),
    }
}

fn apply_ingest(conn: &Connection, r: &NewRecord) -> Result<IngestOutcome, StoreError> {
    if let Some(key) = &r.dedup_key {
        let found: Option<(i64, String, i64)> = conn
            .prepare_cached(&format!(
                "SELECT id, status, occurrences FROM dead_letters
                 WHERE partition = ?1 AND dedup_key = ?2 AND status NOT IN {CLOSED_SQL}
                 ORDER BY id DESC LIMIT 1"
            ))?
            .query_row(params![r.partition, &key[..]], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()?;
        if let Some((id, status, occurrences)) = found {
            conn.prepare_cached(
                "UPDATE dead_letters SET occurrences = occurrences + 1, last_seen_at = ?2, updated_at = ?2
                 WHERE id = ?1",
            )?
            .execute(params![id, r.at_ms])?;
            let status = status.parse::<Status>().map_err(StoreError::Corrupt)?;
            return Ok(IngestOutcome {
                id: RecordId::new(id),
                status,
                created: false,
                occurrences: occurrences + 1,
            });
        }
    }
    conn.prepare_cached(
        "INSERT INTO dead_letters (
            partition, status, source, failure_class, class_rule, fingerprint, dedup_key,
            first_seen_at, last_seen_at, updated_at,
            workflow_id, workflow_name, execution_id, execution_url, execution_mode, retry_of,
            node_name, node_type, http_status, error_code, error_name, error_message,
            idempotency_key, external_event_id, correlation_id, tenant_id, contract_version,
            business_object_type, business_object_id, replay_url)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                 ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28)",
    )?
    .execute(params![
        r.partition,
        r.status.as_str(),
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
    ])?;
    let id = conn.last_insert_rowid();
    for (kind, doc) in [("item", &r.payload), ("error", &r.error)] {
        if let Some(doc) = doc {
            conn.prepare_cached(
                "INSERT INTO payloads (record_id, kind, version, codec, size, sha256, bytes, created_at, actor)
                 VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                id,
                kind,
                doc.codec.as_str(),
                doc.size as i64,
                &doc.sha256[..],
                &doc.bytes,
                r.at_ms,
                r.actor
            ])?;
        }
    }
    conn.prepare_cached(
        "INSERT INTO events (record_id, at, actor, kind, to_status) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        id,
        r.at_ms,
        r.actor,
        EventKind::Created.as_str(),
        r.status.as_str()
    ])?;
    Ok(IngestOutcome {
        id: RecordId::new(id),
        status: r.status,
        created: true,
        occurrences: 1,
    })
}
