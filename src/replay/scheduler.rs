//! The retry loop. Every `delivery.tick` it returns expired leases to their queues, takes the
//! records whose `next_attempt_at` has come (oldest first; auth failures never), and for each
//! whose target's gate allows it — breaker not open, a rate token, a free concurrency slot —
//! claims it with a lease through the writer, sends it, and moves it on:
//! success → replayed; transient → retry_scheduled again after the class's backoff (or the
//! target's `Retry-After` plus up to 250 ms of jitter) until `max_attempts`, then review;
//! permanent → review, with the target's answer kept.
//!
//! At start every lease left over is released: only one deadletter runs on a data dir, so a
//! leased record belongs to a process that died — its send may or may not have reached the
//! target, so it is sent again, with the same `Idempotency-Key` (at-least-once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::dispatcher::{Dispatcher, Outgoing, Sent, Verdict};
use super::gate::{BreakerState, Gate};
use super::target::{ResolvedTarget, Targets};
use crate::config::Config;
use crate::model::delivery::{shape_body, BodyMode};
use crate::model::{FailureClass, Status};
use crate::store::{AttemptRecord, Claim, Claimed, Finish, Next, RecordSummary, Store, StoreError};

/// How many due records one tick looks at.
const DUE_PER_TICK: usize = 64;
/// The most jitter added to a target's `Retry-After`.
const RETRY_AFTER_JITTER: Duration = Duration::from_millis(250);

pub struct Scheduler {
    pub(super) store: Store,
    pub(super) config: Arc<Config>,
    pub(super) targets: Targets,
    pub(super) dispatcher: Dispatcher,
    gates: Mutex<HashMap<String, Gate>>,
    /// Names this process's leases: `<pid>-<start ms>/<claim number>`.
    instance: String,
    claims: AtomicU64,
    /// Replay jobs being worked on now, with what each is waiting for (if anything).
    pub(super) active_jobs: Mutex<HashMap<i64, Option<String>>>,
    /// Wakes the job loop when a job is created, approved or resumed.
    pub(super) job_wakeup: tokio::sync::Notify,
}

/// A target's pacing, as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct GateView {
    pub target: String,
    pub rate_per_second: f64,
    pub breaker: BreakerState,
    pub breaker_opened_total: u64,
    pub paused_total: u64,
    pub in_flight: usize,
}

/// One send, as the attempts table keeps it.
pub(super) fn attempt_record(
    attempt: i64,
    started_at_ms: i64,
    target: &ResolvedTarget,
    idempotency_key: String,
    payload_version: i64,
    sent: &Sent,
) -> AttemptRecord {
    AttemptRecord {
        attempt,
        started_at_ms,
        target: target.name.clone(),
        url: target.url.clone(),
        idempotency_key,
        payload_version: Some(payload_version),
        outcome: sent.verdict.as_str(),
        status_code: sent.status,
        latency_ms: sent.latency.as_millis() as i64,
        error: sent.error.clone(),
        response_excerpt: sent.excerpt.clone(),
        retry_after_ms: sent.retry_after.map(|d| d.as_millis() as i64),
        downstream_execution_id: sent.downstream_execution_id.clone(),
    }
}

pub(super) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Scheduler {
    pub fn new(config: Arc<Config>, store: Store) -> Result<Arc<Scheduler>, reqwest::Error> {
        let dispatcher = Dispatcher::new(crate::redact::Redactor::new(&config.redact.keys))?;
        Ok(Arc::new(Scheduler {
            targets: Targets::new(&config),
            dispatcher,
            store,
            gates: Mutex::new(HashMap::new()),
            instance: format!("{}-{}", std::process::id(), now_ms()),
            claims: AtomicU64::new(0),
            active_jobs: Mutex::new(HashMap::new()),
            job_wakeup: tokio::sync::Notify::new(),
            config,
        }))
    }

    /// Claim a record for sending under a fresh lease owner; the owner and what was claimed.
    pub(super) async fn claim(
        &self,
        id: i64,
        from: Status,
        to: Status,
    ) -> Result<(String, Claimed), StoreError> {
        let owner = format!(
            "{}/{}",
            self.instance,
            self.claims.fetch_add(1, Ordering::Relaxed)
        );
        let claimed = self
            .store
            .writer
            .claim(Claim {
                id,
                from,
                to,
                owner: owner.clone(),
                lease_until_ms: now_ms() + self.config.delivery.lease.as_millis() as i64,
                at_ms: now_ms(),
            })
            .await?;
        Ok((owner, claimed))
    }

    /// Every target's pacing right now.
    pub fn gates(&self) -> Vec<GateView> {
        let gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<GateView> = gates
            .iter()
            .map(|(name, g)| GateView {
                target: name.clone(),
                rate_per_second: g.rate.rate,
                breaker: g.breaker.state(),
                breaker_opened_total: g.breaker.opened_total,
                paused_total: g.paused_total,
                in_flight: g.in_flight,
            })
            .collect();
        v.sort_by(|a, b| a.target.cmp(&b.target));
        v
    }

    /// Run until `shutdown` turns true; then let the sends in flight finish.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        match self.store.writer.recover(now_ms(), false).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(records = n, "released leases left by a previous run; they will be sent again with the same Idempotency-Key"),
            Err(e) => tracing::error!(error = %e, "cannot release leftover leases"),
        }
        let mut sends = JoinSet::new();
        let jobs = tokio::spawn(Arc::clone(&self).run_jobs(shutdown.clone()));
        let tick = self.config.delivery.tick;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = shutdown.changed() => break,
            }
            if let Err(e) = self.tick(&mut sends).await {
                tracing::error!(error = %e, "retry scheduler tick failed");
            }
            while sends.try_join_next().is_some() {}
        }
        while sends.join_next().await.is_some() {}
        let _ = jobs.await;
    }

    async fn tick(self: &Arc<Self>, sends: &mut JoinSet<()>) -> Result<(), StoreError> {
        let now = now_ms();
        let readers = self.store.readers.clone();
        let expired = tokio::task::spawn_blocking(move || readers.has_expired_leases(now))
            .await
            .map_err(|e| StoreError::Corrupt(e.to_string()))??;
        if expired {
            let released = self.store.writer.recover(now, true).await?;
            tracing::warn!(
                records = released,
                "leases ran out; records returned to their queues"
            );
        }
        let readers = self.store.readers.clone();
        let due = tokio::task::spawn_blocking(move || readers.due(now, DUE_PER_TICK))
            .await
            .map_err(|e| StoreError::Corrupt(e.to_string()))??;
        for rec in due {
            let readers = self.store.readers.clone();
            let (id, version) = (rec.id, rec.payload_version);
            let payload = tokio::task::spawn_blocking(move || readers.payload(id, version))
                .await
                .map_err(|e| StoreError::Corrupt(e.to_string()))??;
            if payload.is_none() && self.awaits_enrichment(&rec).await? {
                // n8n's API may still bring the item (and with it the webhook to replay to).
                continue;
            }
            let value = payload
                .as_ref()
                .and_then(|p| serde_json::from_str(&p.json).ok());
            let Some(target) = self.targets.resolve(&rec, value.as_ref()) else {
                self.give_up(&rec, "no replay target: give the record a replay_url or add a [[targets]] entry that matches it").await?;
                continue;
            };
            let payload = match payload {
                Some(p) => (p.version, p.json),
                // n8n's retry needs no payload: n8n has the execution's data.
                None if matches!(target.settings.body, BodyMode::N8nRetry { .. }) => {
                    (0, String::new())
                }
                None => {
                    self.give_up(&rec, "no payload to send: an Error Trigger record carries only the error; add the payload with an edit, or give deadletter an n8n API key").await?;
                    continue;
                }
            };
            if !self.enter(&target) {
                continue;
            }
            let (owner, claimed) = match self
                .claim(rec.id, Status::RetryScheduled, Status::Retrying)
                .await
            {
                Ok(c) => c,
                Err(e) if e.is_refusal() => {
                    // Someone changed it since it was read (an operator resolved it …).
                    self.leave(&target.name, None);
                    continue;
                }
                Err(e) => {
                    self.leave(&target.name, None);
                    return Err(e);
                }
            };
            let me = Arc::clone(self);
            sends.spawn(async move {
                me.send(rec, target, owner, claimed.attempt, payload.0, payload.1)
                    .await;
            });
        }
        Ok(())
    }

    /// Is this Error Trigger record still waiting for the n8n enricher (configured, and not yet
    /// done with it)? Its retry waits for that rather than giving up or retrying blind.
    async fn awaits_enrichment(&self, rec: &RecordSummary) -> Result<bool, StoreError> {
        let n8n = &self.config.n8n;
        if !(n8n.enrich && n8n.api_key.is_some())
            || rec.source != crate::model::Source::ErrorTrigger.as_str()
            || rec.facts.execution_id.is_none()
        {
            return Ok(false);
        }
        let readers = self.store.readers.clone();
        let id = rec.id;
        let (state, _) = tokio::task::spawn_blocking(move || {
            readers.with(|c| crate::store::enrich::state(c, id))
        })
        .await
        .map_err(|e| StoreError::Corrupt(e.to_string()))??;
        Ok(matches!(state.as_deref(), None | Some("pending")))
    }

    /// Pass the target's gate: concurrency slot, rate token, breaker. False: not now.
    pub(super) fn enter(&self, target: &ResolvedTarget) -> bool {
        let now = Instant::now();
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        let gate = gates
            .entry(target.name.clone())
            .or_insert_with(|| Gate::new(&target.settings, now));
        if gate.in_flight >= self.config.delivery.concurrency_per_target {
            return false;
        }
        if !gate.breaker.would_allow(now) {
            gate.paused_total += 1;
            return false;
        }
        if !gate.rate.try_take(now) {
            return false;
        }
        // Cannot refuse now (checked above, under the same lock): in half-open, this is the probe.
        gate.breaker.allow(now);
        gate.in_flight += 1;
        true
    }

    /// A send went out: leave the gate with its health and count its outcome.
    pub(super) fn sent(&self, target: &str, sent: &Sent) {
        // A 4xx means the target is up: only transient failures count against its health.
        self.leave(target, Some(sent.verdict != Verdict::Transient));
        crate::metrics::METRICS.replayed(
            target,
            (sent.verdict != Verdict::Success).then(|| sent.verdict.as_str()),
        );
    }

    /// Leave the gate: with the send's health, or `None` when nothing was sent.
    pub(super) fn leave(&self, target: &str, ok: Option<bool>) {
        let now = Instant::now();
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = gates.get_mut(target) {
            g.in_flight = g.in_flight.saturating_sub(1);
            match ok {
                Some(ok) => {
                    g.rate.record(ok, now);
                    g.breaker.record(ok, now);
                }
                // A probe that never went out: let the next one try.
                None if g.breaker.state() == BreakerState::HalfOpen => g.breaker.record(true, now),
                None => {}
            }
        }
    }

    async fn send(
        self: Arc<Self>,
        rec: RecordSummary,
        target: ResolvedTarget,
        owner: String,
        attempt: i64,
        payload_version: i64,
        payload: String,
    ) {
        let key = rec
            .facts
            .idempotency_key
            .clone()
            .unwrap_or_else(|| format!("deadletter-{}", rec.id));
        let started_at_ms = now_ms();
        let sent = match shape_body(target.settings.body, &payload, rec.id) {
            Ok(body) => {
                self.dispatcher
                    .send(Outgoing {
                        target: &target,
                        body,
                        idempotency_key: &key,
                        record_id: rec.id,
                        attempt,
                        supersedes: None,
                    })
                    .await
            }
            Err(e) => Sent {
                verdict: Verdict::Permanent,
                status: None,
                latency: Duration::ZERO,
                error: Some(format!("cannot shape the body: {e}")),
                excerpt: None,
                retry_after: None,
                downstream_execution_id: None,
            },
        };
        self.sent(&target.name, &sent);
        let next = self.next(&rec, attempt, &sent);
        tracing::info!(
            id = rec.id,
            attempt,
            target = target.name,
            outcome = sent.verdict.as_str(),
            status = sent.status,
            "retry sent"
        );
        let finish = Finish {
            id: rec.id,
            owner,
            at_ms: now_ms(),
            attempt: attempt_record(attempt, started_at_ms, &target, key, payload_version, &sent),
            next,
        };
        if let Err(e) = self.store.writer.finish(finish).await {
            tracing::error!(id = rec.id, error = %e, "cannot record a retry's outcome; its lease will run out and it will be sent again");
        }
    }

    /// Where a record goes after this send.
    fn next(&self, rec: &RecordSummary, attempt: i64, sent: &Sent) -> Next {
        let why = sent.error.clone().unwrap_or_default();
        match sent.verdict {
            Verdict::Success => Next::Delivered,
            Verdict::Permanent => Next::Review(format!("the target refused it: {why}")),
            Verdict::Transient => {
                let policy = self.config.triage.policy(rec.failure_class);
                if attempt >= i64::from(policy.max_attempts)
                    || rec.failure_class == FailureClass::Auth
                {
                    return Next::Review(format!("gave up after {attempt} attempt(s): {why}"));
                }
                let wait = match sent.retry_after {
                    Some(d) => d + RETRY_AFTER_JITTER.mul_f64(rand::random::<f64>()),
                    None => policy
                        .backoff
                        .delay(attempt as u32 + 1, rand::random::<f64>()),
                };
                Next::RetryAt(now_ms() + wait.as_millis() as i64)
            }
        }
    }

    /// A record that cannot be sent at all goes to review, saying why (claimed first, so the
    /// move is the table's and audited).
    async fn give_up(&self, rec: &RecordSummary, why: &str) -> Result<(), StoreError> {
        let (owner, claimed) = match self
            .claim(rec.id, Status::RetryScheduled, Status::Retrying)
            .await
        {
            Ok(c) => c,
            Err(e) if e.is_refusal() => return Ok(()),
            Err(e) => return Err(e),
        };
        tracing::warn!(id = rec.id, reason = why, "cannot retry; moved to review");
        self.store
            .writer
            .finish(Finish {
                id: rec.id,
                owner,
                at_ms: now_ms(),
                attempt: AttemptRecord {
                    attempt: claimed.attempt,
                    started_at_ms: now_ms(),
                    target: "-".into(),
                    url: "-".into(),
                    idempotency_key: rec
                        .facts
                        .idempotency_key
                        .clone()
                        .unwrap_or_else(|| format!("deadletter-{}", rec.id)),
                    payload_version: claimed.payload_version,
                    outcome: Verdict::Permanent.as_str(),
                    status_code: None,
                    latency_ms: 0,
                    error: Some(why.to_owned()),
                    response_excerpt: None,
                    retry_after_ms: None,
                    downstream_execution_id: None,
                },
                next: Next::Review(why.to_owned()),
            })
            .await?;
        Ok(())
    }
}
