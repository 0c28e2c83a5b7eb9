//! The single writer: one thread, one connection, group commit.
//!
//! Callers send a request and await its answer. The thread blocks for the first request, then
//! takes every other one already waiting (up to `max_batch`), applies them all inside one
//! `BEGIN IMMEDIATE … COMMIT` — a request that fails sinks no other — and answers each only
//! after the commit (`synchronous=FULL`) returned. What each request does is in `apply`.
//! While it is in fsync, new requests queue up and form the next batch: that is how ingest
//! gets far past one fsync per request.
//!
//! Nothing expensive happens here: documents arrive already encoded (see `codec`). WAL
//! checkpoints stay on this thread (SQLite's auto-checkpoint): measured, a
//! separate checkpointer thread was slower, because under steady load the WAL could never be
//! reset and kept growing into freshly allocated file blocks.

use std::sync::Arc;
use std::thread::JoinHandle;

use rusqlite::{Connection, TransactionBehavior};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::apply::{
    self, Change, Claim, Claimed, Finish, GroupAction, GroupItem, IngestOutcome, NewRecord,
    PoisonRule,
};
use super::enrich::{self, Enrich};
use super::export::{self, Imported, Line};
use super::jobs::{self, ItemOutcome, JobMove, JobStatus, NewJob};
use super::query::RecordSummary;
use super::retention::{self, Erasure, SweepStep, Swept};
use super::StoreError;
use crate::model::Status;

/// What the writer can be asked to do.
enum Op {
    Ingest(Box<NewRecord>),
    Change(Box<Change>),
    Group(Box<GroupAction>),
    Claim(Box<Claim>),
    Finish(Box<Finish>),
    Recover { now_ms: i64, only_expired: bool },
    Sweep(SweepStep),
    Erase(Box<Erasure>),
    CreateJob(Box<NewJob>),
    MoveJob(Box<JobMove>),
    SetItem(Box<ItemOutcome>),
    Import(Box<ImportBatch>),
    Vacuum { pages: u32 },
    Enrich(Box<Enrich>),
    SetCounter { name: &'static str, value: i64 },
}

/// Lines of an export to apply in one transaction, encoded as this store encodes documents.
pub struct ImportBatch {
    pub lines: Vec<Line>,
    pub compress_above: usize,
    pub zstd_level: i32,
}

/// What it answers, one variant per `Op`.
enum Done {
    Ingested(IngestOutcome),
    Changed(Box<RecordSummary>),
    Group(Vec<GroupItem>),
    Claimed(Claimed),
    Finished(Status),
    Recovered(usize),
    Swept(Swept),
    Erased(Vec<i64>),
    JobCreated(i64),
    JobMoved(JobStatus),
    ItemSet,
    Imported(Imported, Vec<i64>),
    Vacuumed(usize),
    Enriched,
    CounterSet,
}

/// What travels on the writer's channel.
enum Msg {
    Req(Request),
    /// Commit what came before, answer it, and stop.
    Stop,
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Done, StoreError>>,
    /// A place in the queue, given back when the request is answered (backpressure).
    _slot: OwnedSemaphorePermit,
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct Writer {
    tx: std::sync::mpsc::Sender<Msg>,
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
    pub fn start(
        conn: Connection,
        max_batch: usize,
        poison: PoisonRule,
    ) -> Result<Writer, StoreError> {
        // A std channel, not tokio's: the writer needs `recv_timeout` with sub-millisecond
        // precision to linger for a batch (tokio's timer ticks in milliseconds).
        let (tx, rx) = std::sync::mpsc::channel();
        let slots = Arc::new(Semaphore::new(Self::QUEUE));
        let closing = slots.clone();
        let handle = std::thread::Builder::new()
            .name("deadletter-writer".into())
            .spawn(move || {
                run(conn, rx, max_batch.max(1), poison);
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
        op: Op,
    ) -> Result<oneshot::Receiver<Result<Done, StoreError>>, StoreError> {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::WriterGone)?;
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Req(Request {
                op,
                reply,
                _slot: slot,
            }))
            .map_err(|_| StoreError::WriterGone)?;
        Ok(answer)
    }

    async fn call(&self, op: Op) -> Result<Done, StoreError> {
        let answer = self.enqueue(op).await?;
        answer.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Store one failure; resolves once it is committed.
    pub async fn ingest(&self, rec: NewRecord) -> Result<IngestOutcome, StoreError> {
        match self.call(Op::Ingest(Box::new(rec))).await? {
            Done::Ingested(o) => Ok(o),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Store several failures in order (they usually share one commit); one result each.
    pub async fn ingest_many(
        &self,
        recs: Vec<NewRecord>,
    ) -> Vec<Result<IngestOutcome, StoreError>> {
        let mut waiting = Vec::with_capacity(recs.len());
        for rec in recs {
            waiting.push(self.enqueue(Op::Ingest(Box::new(rec))).await);
        }
        let mut out = Vec::with_capacity(waiting.len());
        for w in waiting {
            out.push(match w {
                Ok(answer) => match answer.await {
                    Ok(Ok(Done::Ingested(o))) => Ok(o),
                    Ok(Ok(_)) => Err(StoreError::Corrupt(
                        "writer answered another request".into(),
                    )),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(StoreError::WriterGone),
                },
                Err(e) => Err(e),
            });
        }
        out
    }

    /// Apply an operator's change to one record; the record as it now is.
    pub async fn change(&self, change: Change) -> Result<RecordSummary, StoreError> {
        match self.call(Op::Change(Box::new(change))).await? {
            Done::Changed(s) => Ok(*s),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Apply one action to every open record of a failure group.
    pub async fn group_action(&self, action: GroupAction) -> Result<Vec<GroupItem>, StoreError> {
        match self.call(Op::Group(Box::new(action))).await? {
            Done::Group(items) => Ok(items),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Lease a due record for sending.
    pub async fn claim(&self, claim: Claim) -> Result<Claimed, StoreError> {
        match self.call(Op::Claim(Box::new(claim))).await? {
            Done::Claimed(c) => Ok(c),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Store a send's attempt and move the record on; the status it now has.
    pub async fn finish(&self, finish: Finish) -> Result<Status, StoreError> {
        match self.call(Op::Finish(Box::new(finish))).await? {
            Done::Finished(s) => Ok(s),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Return leased records to their queues (all, or only expired leases); how many.
    pub async fn recover(&self, now_ms: i64, only_expired: bool) -> Result<usize, StoreError> {
        match self
            .call(Op::Recover {
                now_ms,
                only_expired,
            })
            .await?
        {
            Done::Recovered(n) => Ok(n),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// One sweep step (at most `step.batch` records); what it removed.
    pub async fn sweep(&self, step: SweepStep) -> Result<Swept, StoreError> {
        match self.call(Op::Sweep(step)).await? {
            Done::Swept(s) => Ok(s),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Erase now; the ids removed. The writer then reclaims the space and truncates the WAL,
    /// so the erased bytes are in neither file.
    pub async fn erase(&self, e: Erasure) -> Result<Vec<i64>, StoreError> {
        match self.call(Op::Erase(Box::new(e))).await? {
            Done::Erased(ids) => Ok(ids),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Record what fetching a record's n8n execution did (or an operator's request to fetch
    /// it again).
    pub async fn enrich(&self, e: Enrich) -> Result<(), StoreError> {
        match self.call(Op::Enrich(Box::new(e))).await? {
            Done::Enriched => Ok(()),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Keep a named number (e.g. the n8n reconciliation watermark).
    pub async fn set_counter(&self, name: &'static str, value: i64) -> Result<(), StoreError> {
        match self.call(Op::SetCounter { name, value }).await? {
            Done::CounterSet => Ok(()),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Give up to `pages` free pages back to the file system; how many went (fewer: done).
    pub async fn vacuum(&self, pages: u32) -> Result<usize, StoreError> {
        match self.call(Op::Vacuum { pages }).await? {
            Done::Vacuumed(n) => Ok(n),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Import a batch of export lines, all or nothing; what was done, and the ids that clash
    /// with different records here.
    pub async fn import(&self, batch: ImportBatch) -> Result<(Imported, Vec<i64>), StoreError> {
        match self.call(Op::Import(Box::new(batch))).await? {
            Done::Imported(done, conflicts) => Ok((done, conflicts)),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    pub async fn create_job(&self, job: NewJob) -> Result<i64, StoreError> {
        match self.call(Op::CreateJob(Box::new(job))).await? {
            Done::JobCreated(id) => Ok(id),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    pub async fn move_job(&self, m: JobMove) -> Result<JobStatus, StoreError> {
        match self.call(Op::MoveJob(Box::new(m))).await? {
            Done::JobMoved(s) => Ok(s),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    pub async fn set_item(&self, o: ItemOutcome) -> Result<(), StoreError> {
        match self.call(Op::SetItem(Box::new(o))).await? {
            Done::ItemSet => Ok(()),
            _ => Err(StoreError::Corrupt(
                "writer answered another request".into(),
            )),
        }
    }

    /// Commit and answer everything sent before, then stop the thread and wait for it (blocking).
    /// Handles still held elsewhere get `WriterGone` from then on.
    pub fn stop(&self) {
        let _ = self.tx.send(Msg::Stop);
        let handle = self._thread.0.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    pub fn is_alive(&self) -> bool {
        !self.slots.is_closed()
    }
}

/// The longest the writer waits for more requests before committing what it has.
const MAX_LINGER: Duration = Duration::from_millis(2);

/// Take what is waiting, up to `max`; true when a stop was among it.
fn drain(rx: &Receiver<Msg>, batch: &mut Vec<Request>, max: usize) -> bool {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(Msg::Req(r)) => batch.push(r),
            Ok(Msg::Stop) => return true,
            Err(_) => break,
        }
    }
    false
}

/// The writer loop. After the first request it takes everything already waiting; then, if the
/// previous commit answered more callers than are back yet, it lingers — at most half the
/// previous commit's duration, never over `MAX_LINGER` — because those callers are likely
/// sending again, and one fsync should serve them all. Without this, batches alternate between
/// the few requests that made it before the writer woke and the many that arrived during the
/// following commit (measured: ~15 per commit at 32 connections on a 4 ms-fsync disk).
fn run(mut conn: Connection, rx: Receiver<Msg>, max_batch: usize, poison: PoisonRule) {
    let mut batch = Vec::with_capacity(max_batch);
    let mut expected = 1;
    let mut last_commit = Duration::ZERO;
    let mut stopping = false;
    while !stopping {
        match rx.recv() {
            Ok(Msg::Req(first)) => batch.push(first),
            Ok(Msg::Stop) | Err(_) => break,
        }
        stopping = drain(&rx, &mut batch, max_batch);
        let want = expected.min(max_batch);
        if batch.len() < want && !stopping {
            let deadline = Instant::now() + (last_commit / 2).min(MAX_LINGER);
            while batch.len() < want {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match rx.recv_timeout(left) {
                    Ok(Msg::Req(r)) => {
                        batch.push(r);
                        if drain(&rx, &mut batch, max_batch) {
                            stopping = true;
                            break;
                        }
                    }
                    Ok(Msg::Stop) => {
                        stopping = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        let started = Instant::now();
        let results = commit_batch(&mut conn, &batch, poison);
        last_commit = started.elapsed();
        crate::metrics::METRICS
            .writer_batch
            .observe(batch.len() as f64);
        crate::metrics::METRICS
            .writer_commit
            .observe(last_commit.as_secs_f64());
        // Sweeps give their space back in bounded steps of their own (`Writer::vacuum`).
        let removed = results
            .iter()
            .any(|res| matches!(res, Ok(Done::Erased(ids)) if !ids.is_empty()));
        if removed {
            reclaim(&conn);
        }
        expected = batch.len();
        tracing::trace!(
            batch = batch.len(),
            micros = last_commit.as_micros() as u64,
            "group commit"
        );
        for (req, res) in batch.drain(..).zip(results) {
            let _ = req.reply.send(res);
        }
    }
    tracing::debug!("writer: channel closed, stopping");
}

/// After an erasure: give every freed page back to the file system and truncate the WAL, so
/// removed bytes are left in neither file (secure_delete already zeroed them in the pages).
/// Failures are logged: the space is reclaimed next time.
fn reclaim(conn: &Connection) {
    if let Err(e) = vacuum(conn, None) {
        tracing::warn!(error = %e, "incremental vacuum failed");
    }
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "WAL truncate failed");
    }
}

/// Free up to `pages` free pages (all with None) from the end of the file; how many went.
/// The pragma frees one page per row it returns, so it must be stepped to the end (a single
/// step, as `execute_batch` does, frees one page).
fn vacuum(conn: &Connection, pages: Option<u32>) -> Result<usize, StoreError> {
    let sql = match pages {
        Some(n) => format!("PRAGMA incremental_vacuum({n})"),
        None => "PRAGMA incremental_vacuum".to_string(),
    };
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query([])?;
    let mut freed = 0;
    while rows.next()?.is_some() {
        freed += 1;
    }
    Ok(freed)
}

/// Apply every request in one transaction, then answer. The fast path runs them back to back;
/// only when one fails is the transaction rolled back and the batch redone with a savepoint per
/// request, so a bad request sinks no other (savepoints cost a statement pair and a
/// sub-journal each, which the common case should not pay). A failed commit fails them all:
/// none of them was acknowledged.
fn commit_batch(
    conn: &mut Connection,
    batch: &[Request],
    poison: PoisonRule,
) -> Vec<Result<Done, StoreError>> {
    match run_batch(conn, batch, false, poison) {
        Ok(results) => results,
        Err(BatchFailed::Request) => match run_batch(conn, batch, true, poison) {
            Ok(results) => results,
            Err(BatchFailed::Request) => unreachable!("isolated batches report per request"),
            Err(BatchFailed::Whole(e)) => fail_all(batch, e),
        },
        Err(BatchFailed::Whole(e)) => fail_all(batch, e),
    }
}

enum BatchFailed {
    /// A request failed in SQL on the fast path: redo the batch with isolation.
    Request,
    /// The transaction itself failed: nothing was stored.
    Whole(StoreError),
}

fn fail_all(batch: &[Request], e: StoreError) -> Vec<Result<Done, StoreError>> {
    tracing::error!(error = %e, "writer: transaction failed; nothing in this batch was stored");
    batch.iter().map(|_| Err(clone_err(&e))).collect()
}

fn apply_op(conn: &Connection, op: &Op, poison: PoisonRule) -> Result<Done, StoreError> {
    Ok(match op {
        Op::Ingest(rec) => Done::Ingested(apply::ingest(conn, rec, poison)?),
        Op::Change(c) => Done::Changed(Box::new(apply::change(conn, c)?)),
        Op::Group(a) => Done::Group(apply::group_action(conn, a)?),
        Op::Claim(c) => Done::Claimed(apply::claim(conn, c)?),
        Op::Finish(f) => Done::Finished(apply::finish(conn, f)?),
        Op::Recover {
            now_ms,
            only_expired,
        } => Done::Recovered(apply::recover(conn, *now_ms, *only_expired)?),
        Op::Sweep(step) => Done::Swept(retention::sweep(conn, step)?),
        Op::Erase(e) => Done::Erased(retention::erase(conn, e)?),
        Op::CreateJob(j) => Done::JobCreated(jobs::create(conn, j)?),
        Op::MoveJob(m) => Done::JobMoved(jobs::apply_move(conn, m)?),
        Op::Vacuum { pages } => Done::Vacuumed(vacuum(conn, Some(*pages))?),
        Op::SetCounter { name, value } => {
            enrich::set_counter(conn, name, *value)?;
            Done::CounterSet
        }
        Op::Enrich(e) => {
            enrich::apply(conn, e)?;
            Done::Enriched
        }
        Op::Import(b) => {
            let (done, conflicts) = export::import(conn, &b.lines, b.compress_above, b.zstd_level)?;
            Done::Imported(done, conflicts)
        }
        Op::SetItem(o) => {
            jobs::set_item(conn, o)?;
            Done::ItemSet
        }
    })
}

fn run_batch(
    conn: &mut Connection,
    batch: &[Request],
    isolate: bool,
    poison: PoisonRule,
) -> Result<Vec<Result<Done, StoreError>>, BatchFailed> {
    let closed =
        |f: &dyn Fn(&mut Vec<i64>)| apply::CLOSED_AFTER_MS.with(|c| f(&mut c.borrow_mut()));
    closed(&|c| c.clear());
    let mut tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| BatchFailed::Whole(e.into()))?;
    let mut results = Vec::with_capacity(batch.len());
    for req in batch {
        if isolate {
            let before = apply::CLOSED_AFTER_MS.with(|c| c.borrow().len());
            let res = (|| -> Result<Done, StoreError> {
                let sp = tx.savepoint()?;
                let out = apply_op(&sp, &req.op, poison)?;
                sp.commit()?;
                Ok(out)
            })();
            if res.is_err() {
                // Rolled back to the savepoint: what it closed did not happen.
                closed(&|c| c.truncate(before));
            }
            results.push(res);
        } else {
            match apply_op(&tx, &req.op, poison) {
                Ok(out) => results.push(Ok(out)),
                // Refusals are checked before anything is written: nothing to undo.
                Err(e) if e.is_refusal() => results.push(Err(e)),
                // Dropping `tx` rolls the whole batch back.
                Err(_) => return Err(BatchFailed::Request),
            }
        }
    }
    tx.commit().map_err(|e| BatchFailed::Whole(e.into()))?;
    closed(&|c| {
        for ms in c.drain(..) {
            crate::metrics::METRICS
                .age
                .observe(ms.max(0) as f64 / 1000.0);
        }
    });
    Ok(results)
}

fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::DiskFull(m) => StoreError::DiskFull(m.clone()),
        other => StoreError::Corrupt(format!("write failed: {other}")),
    }
}
