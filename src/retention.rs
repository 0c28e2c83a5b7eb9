//! The sweeper: every `retention.sweep_every`, it removes what retention says must go —
//! records older than their partition's `max_age`, closed records older than `closed_max_age`,
//! the oldest records of a partition over its `max_bytes` and of the database over
//! `max_total_bytes`, tombstones older than `tombstone_max_age` — in transactions of
//! `retention.batch` records, with a short pause between them so ingest never waits long behind
//! it. Every removal leaves a tombstone (see `store::retention`). The same schedule removes log
//! files older than `logging.max_age` and warns about open records about to expire. Time is
//! passed in (`sweep_once(now)`), so tests move it.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::RetentionConfig;
use crate::store::retention::{Policies, Policy, RetentionStatus, SweepStep, Swept};
use crate::store::{Store, StoreError};

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn bytes(b: Option<u64>) -> Option<i64> {
    b.map(|b| i64::try_from(b).unwrap_or(i64::MAX))
}

/// The configured policies, in the store's terms.
pub fn policies(cfg: &RetentionConfig) -> Policies {
    Policies {
        default: Policy {
            max_age_ms: ms(cfg.max_age),
            closed_max_age_ms: ms(cfg.closed_max_age),
            max_bytes: bytes(cfg.max_bytes),
        },
        partitions: cfg
            .partitions
            .iter()
            .map(|(name, p)| {
                (
                    name.clone(),
                    Policy {
                        max_age_ms: ms(p.max_age),
                        closed_max_age_ms: ms(p.closed_max_age),
                        max_bytes: bytes(p.max_bytes),
                    },
                )
            })
            .collect(),
    }
}

/// Sweep everything due at `now_ms`, batch by batch; the totals.
pub async fn sweep_once(
    store: &Store,
    cfg: &RetentionConfig,
    now_ms: i64,
) -> Result<Swept, StoreError> {
    let step = SweepStep {
        now_ms,
        policies: policies(cfg),
        tombstone_max_age_ms: ms(cfg.tombstone_max_age),
        max_total_bytes: bytes(cfg.max_total_bytes),
        batch: cfg.batch,
        budget: STEP_BUDGET,
    };
    let mut total = Swept::default();
    loop {
        let swept = store.writer.sweep(step.clone()).await?;
        total.add(swept);
        if !swept.more {
            break;
        }
        // Let waiting ingests through between batches.
        tokio::time::sleep(PAUSE).await;
    }
    if total.total() > 0 {
        // Give the space back, a bounded number of pages per transaction.
        while store.writer.vacuum(VACUUM_PAGES).await? == VACUUM_PAGES as usize {
            tokio::time::sleep(PAUSE).await;
        }
    }
    Ok(total)
}

/// How long one sweep transaction may remove records (the ingests queued behind it wait).
const STEP_BUDGET: Duration = Duration::from_millis(3);
/// Between two sweep or vacuum transactions: room for the ingests queued behind them.
const PAUSE: Duration = Duration::from_millis(5);
/// Pages freed per vacuum transaction (1 MiB at the default page size).
const VACUUM_PAGES: u32 = 256;

/// What retention holds and has removed, at `now_ms`.
pub async fn status(
    store: &Store,
    cfg: &RetentionConfig,
    now_ms: i64,
) -> Result<RetentionStatus, StoreError> {
    let (policies, cap, warn) = (
        policies(cfg),
        bytes(cfg.max_total_bytes),
        ms(cfg.warn_before),
    );
    let readers = store.readers.clone();
    tokio::task::spawn_blocking(move || {
        readers.with(|c| crate::store::retention::status(c, &policies, cap, now_ms, warn))
    })
    .await
    .map_err(|e| StoreError::Corrupt(format!("status task failed: {e}")))?
}

/// The sweeper's loop, until shutdown: records, then log files, then the expiring-soon count.
pub async fn run(
    store: Store,
    cfg: RetentionConfig,
    logs: Option<(PathBuf, Duration)>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut warned = 0;
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        match sweep_once(&store, &cfg, now).await {
            Ok(s) if s.total() > 0 => tracing::info!(
                age = s.age,
                closed_age = s.closed_age,
                size = s.size,
                tombstones = s.tombstones,
                "retention sweep removed records (tombstones kept)"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "retention sweep failed; it runs again later"),
        }
        if let Some((dir, max_age)) = &logs {
            let dir = dir.clone();
            let cutoff = std::time::SystemTime::now() - *max_age;
            match tokio::task::spawn_blocking(move || crate::logging::prune(&dir, cutoff)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(files = n, "removed old log files"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not prune log files"),
                Err(_) => {}
            }
        }
        match status(&store, &cfg, now).await {
            // Said when the number changes, not every sweep.
            Ok(s) if s.expiring_soon != warned => {
                warned = s.expiring_soon;
                if s.expiring_soon > 0 {
                    let parts: Vec<String> = s
                        .partitions
                        .iter()
                        .filter(|p| p.expiring_soon > 0)
                        .map(|p| format!("{}={}", p.partition, p.expiring_soon))
                        .collect();
                    tracing::warn!(
                        open = s.expiring_soon,
                        partitions = %parts.join(","),
                        within = %humantime::format_duration(cfg.warn_before),
                        "open records will expire soon: triage or replay them first"
                    );
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention status failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.sweep_every) => {}
            _ = shutdown.changed() => return,
        }
    }
}
