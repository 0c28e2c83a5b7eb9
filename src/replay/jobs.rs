//! Replay jobs: an operator's request to send chosen records back, worked through by the same
//! scheduler (same targets, rate limits and breakers as automatic retries).
//!
//! A running job sends one item first (the canary), then batches of `batch_size`; after each
//! batch it stops itself when more than `stop_failure_ratio` of what it sent failed (a failed
//! canary stops it at once). Before each send it checks the record again: closed or in-flight
//! records are skipped, and so is a record whose idempotency key already succeeded (in it or
//! any other record). A record that is not ready_for_replay is moved there first, as the job's
//! operator. It waits — "paused: breaker open" — while its target's breaker is open, and looks
//! at the job's status between sends, so pause and cancel take effect at once. Jobs persist;
//! after a restart, running ones carry on with their pending items.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;

use super::dispatcher::{Outgoing, Verdict};
use super::scheduler::{attempt_record, now_ms, Scheduler};
use crate::model::delivery::shape_body;
use crate::model::Status;
use crate::store::jobs::{ItemOutcome, JobMove, JobStatus, JobView};
use crate::store::{Change, Finish, Next, StoreError, SYSTEM};

enum ItemResult {
    Succeeded(serde_json::Value),
    Failed(serde_json::Value),
    Skipped(String),
    /// The job was paused or cancelled while the item waited: leave it pending.
    Interrupted,
}

impl Scheduler {
    /// Wake the job loop (a job was created, approved or resumed).
    pub fn wake_jobs(&self) {
        self.job_wakeup.notify_one();
    }

    /// What a job being worked on waits for now ("paused: breaker open"), if anything.
    pub fn job_note(&self, id: i64) -> Option<String> {
        self.active_jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            .flatten()
    }

    fn note(&self, id: i64, note: Option<String>) {
        if let Some(n) = self
            .active_jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&id)
        {
            *n = note;
        }
    }

    pub(super) async fn run_jobs(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            let readers = self.store.readers.clone();
            match tokio::task::spawn_blocking(move || readers.running_jobs()).await {
                Ok(Ok(ids)) => {
                    for id in ids {
                        let fresh = self
                            .active_jobs
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(id, None)
                            .is_none();
                        if fresh {
                            let me = Arc::clone(&self);
                            let stop = shutdown.clone();
                            tokio::spawn(async move {
                                if let Err(e) = me.run_job(id, stop).await {
                                    tracing::error!(job = id, error = %e, "replay job failed");
                                }
                                me.active_jobs
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .remove(&id);
                            });
                        }
                    }
                }
                Ok(Err(e)) => tracing::error!(error = %e, "cannot list replay jobs"),
                Err(e) => tracing::error!(error = %e, "cannot list replay jobs"),
            }
            tokio::select! {
                _ = self.job_wakeup.notified() => {}
                _ = tokio::time::sleep(self.config.delivery.tick) => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    async fn job(&self, id: i64) -> Result<JobView, StoreError> {
        let readers = self.store.readers.clone();
        tokio::task::spawn_blocking(move || readers.job(id))
            .await
            .map_err(|e| StoreError::Corrupt(e.to_string()))?
    }

    async fn run_job(
        self: &Arc<Self>,
        id: i64,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), StoreError> {
        loop {
            let job = self.job(id).await?;
            if job.status != JobStatus::Running || *shutdown.borrow() {
                return Ok(());
            }
            let pending: Vec<(i64, i64)> = job
                .items
                .iter()
                .filter(|i| i.state == "pending")
                .map(|i| (i.seq, i.record_id))
                .collect();
            if pending.is_empty() {
                self.move_job(id, JobStatus::Done, None).await?;
                tracing::info!(
                    job = id,
                    succeeded = job.counts.succeeded,
                    failed = job.counts.failed,
                    skipped = job.counts.skipped,
                    "replay job done"
                );
                return Ok(());
            }
            let sent_so_far = job.counts.succeeded + job.counts.failed;
            // One item alone first: a broken target or payload costs one send, not a batch.
            let batch = if sent_so_far == 0 {
                1
            } else {
                job.batch_size.max(1) as usize
            };
            for (seq, record_id) in pending.into_iter().take(batch) {
                let result = self.replay_item(&job, record_id, &shutdown).await?;
                let (state, detail) = match result {
                    ItemResult::Succeeded(d) => ("succeeded", d),
                    ItemResult::Failed(d) => ("failed", d),
                    ItemResult::Skipped(why) => ("skipped", json!({"reason": why})),
                    ItemResult::Interrupted => return Ok(()),
                };
                self.store
                    .writer
                    .set_item(ItemOutcome {
                        job_id: id,
                        seq,
                        state,
                        detail,
                    })
                    .await?;
            }
            let job = self.job(id).await?;
            let sent = job.counts.succeeded + job.counts.failed;
            if job.counts.failed > 0
                && job.counts.failed as f64 / sent as f64 > job.stop_failure_ratio
            {
                let why = format!(
                    "stopped by itself: {} of {} sent item(s) failed (more than {:.0} %)",
                    job.counts.failed,
                    sent,
                    job.stop_failure_ratio * 100.0
                );
                tracing::warn!(job = id, "{why}");
                self.move_job(id, JobStatus::Stopped, Some(why)).await?;
                return Ok(());
            }
        }
    }

    async fn move_job(
        &self,
        id: i64,
        to: JobStatus,
        reason: Option<String>,
    ) -> Result<(), StoreError> {
        match self
            .store
            .writer
            .move_job(JobMove {
                id,
                actor: SYSTEM.into(),
                token: None,
                at_ms: now_ms(),
                to,
                reason,
            })
            .await
        {
            // An operator moved it meanwhile (paused, cancelled): theirs wins.
            Err(StoreError::Invalid(_)) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    async fn replay_item(
        self: &Arc<Self>,
        job: &JobView,
        record_id: i64,
        shutdown: &watch::Receiver<bool>,
    ) -> Result<ItemResult, StoreError> {
        let readers = self.store.readers.clone();
        let rec = match tokio::task::spawn_blocking(move || readers.summary(record_id)).await {
            Ok(Ok(r)) => r,
            Ok(Err(StoreError::NotFound(_))) => {
                return Ok(ItemResult::Skipped("the record is gone".into()))
            }
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(StoreError::Corrupt(e.to_string())),
        };
        if !rec.status.is_open() {
            return Ok(ItemResult::Skipped(format!(
                "the record is {}: reopen it to replay it",
                rec.status
            )));
        }
        if matches!(rec.status, Status::Retrying | Status::Replaying) {
            return Ok(ItemResult::Skipped(format!(
                "the record is being sent ({})",
                rec.status
            )));
        }
        let original = rec
            .facts
            .idempotency_key
            .clone()
            .unwrap_or_else(|| format!("deadletter-{}", rec.id));
        let key = if job.new_keys {
            format!("{original}-replay-{}", job.id)
        } else {
            original.clone()
        };
        let readers = self.store.readers.clone();
        let (k, version) = (key.clone(), rec.payload_version);
        let (done_by, payload) = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
            Ok((
                readers.key_succeeded(&k)?,
                readers.payload(record_id, version)?,
            ))
        })
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))??;
        if let Some(other) = done_by {
            return Ok(ItemResult::Skipped(format!(
                "idempotency key {key} was already delivered (record {other})"
            )));
        }
        let value = payload
            .as_ref()
            .and_then(|p| serde_json::from_str(&p.json).ok());
        let Some(target) = self.targets.resolve(&rec, value.as_ref()) else {
            return Ok(ItemResult::Skipped(
                "no replay target: give the record a replay_url or add a [[targets]] entry".into(),
            ));
        };
        let (payload_version, payload_json) = match payload {
            Some(p) => (p.version, p.json),
            // n8n's retry needs no payload: n8n has the execution's data.
            None if matches!(
                target.settings.body,
                crate::model::delivery::BodyMode::N8nRetry { .. }
            ) =>
            {
                (0, String::new())
            }
            None => {
                return Ok(ItemResult::Skipped(
                    "no payload to send (an Error Trigger record carries only the error; give deadletter an n8n API key to fetch it)".into(),
                ))
            }
        };
        // Re-validate: the body must still be buildable from the payload.
        let body = match shape_body(target.settings.body, &payload_json, rec.id) {
            Ok(b) => b,
            Err(e) => {
                return Ok(ItemResult::Failed(
                    json!({"error": format!("the payload cannot be sent: {e}")}),
                ))
            }
        };
        let actor = job
            .approved_by
            .clone()
            .unwrap_or_else(|| job.created_by.clone());
        if rec.status != Status::ReadyForReplay {
            let moved = self
                .store
                .writer
                .change(Change {
                    id: rec.id,
                    actor,
                    at_ms: now_ms(),
                    status: Some((
                        Status::ReadyForReplay,
                        Some(format!("replay job {}", job.id)),
                    )),
                    ..Change::default()
                })
                .await;
            match moved {
                Ok(_) => {}
                Err(e) if e.is_refusal() => return Ok(ItemResult::Skipped(e.to_string())),
                Err(e) => return Err(e),
            }
        }
        // Wait for the target's gate, looking at the job between tries.
        loop {
            if self.enter(&target) {
                self.note(job.id, None);
                break;
            }
            let paused = self
                .gates()
                .iter()
                .any(|g| g.target == target.name && g.breaker != super::gate::BreakerState::Closed);
            self.note(
                job.id,
                paused.then(|| format!("paused: breaker open for {}", target.name)),
            );
            tokio::time::sleep(Duration::from_millis(50).min(self.config.delivery.tick)).await;
            if *shutdown.borrow() || self.job(job.id).await?.status != JobStatus::Running {
                return Ok(ItemResult::Interrupted);
            }
        }
        let (owner, claimed) = match self
            .claim(rec.id, Status::ReadyForReplay, Status::Replaying)
            .await
        {
            Ok(c) => c,
            Err(e) if e.is_refusal() => {
                self.leave(&target.name, None);
                return Ok(ItemResult::Skipped(e.to_string()));
            }
            Err(e) => {
                self.leave(&target.name, None);
                return Err(e);
            }
        };
        let started_at_ms = now_ms();
        let sent = self
            .dispatcher
            .send(Outgoing {
                target: &target,
                body,
                idempotency_key: &key,
                record_id: rec.id,
                attempt: claimed.attempt,
                supersedes: job.new_keys.then_some(original.as_str()),
            })
            .await;
        self.sent(&target.name, &sent);
        let why = sent.error.clone().unwrap_or_default();
        let next = if sent.verdict == Verdict::Success {
            Next::Delivered
        } else {
            Next::Failed(format!("replay job {}: {why}", job.id))
        };
        tracing::info!(
            job = job.id,
            id = rec.id,
            outcome = sent.verdict.as_str(),
            status = sent.status,
            "replay sent"
        );
        let detail = json!({
            "target": target.name, "status_code": sent.status, "attempt": claimed.attempt,
            "idempotency_key": key, "error": sent.error, "payload_version": payload_version,
        });
        self.store
            .writer
            .finish(Finish {
                id: rec.id,
                owner,
                at_ms: now_ms(),
                attempt: attempt_record(
                    claimed.attempt,
                    started_at_ms,
                    &target,
                    key.clone(),
                    payload_version,
                    &sent,
                ),
                next,
            })
            .await?;
        Ok(if sent.verdict == Verdict::Success {
            ItemResult::Succeeded(detail)
        } else {
            ItemResult::Failed(detail)
        })
    }
}
