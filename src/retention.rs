//! The sweeper: every `retention.sweep_every`, it removes what retention says must go — records
//! older than `max_age`, closed records older than `closed_max_age`, tombstones older than
//! `tombstone_max_age` — in transactions of `retention.batch` records, with a short pause
//! between them so ingest never waits long behind it. Every removal leaves a tombstone (see
//! `store::retention`). Time is passed in (`sweep_once(now)`), so tests move it.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::RetentionConfig;
use crate::store::retention::{SweepStep, Swept};
use crate::store::{Store, StoreError};

/// Sweep everything due at `now_ms`, batch by batch; the totals.
pub async fn sweep_once(
    store: &Store,
    cfg: &RetentionConfig,
    now_ms: i64,
) -> Result<Swept, StoreError> {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let mut total = Swept::default();
    loop {
        let step = store
            .writer
            .sweep(SweepStep {
                now_ms,
                max_age_ms: ms(cfg.max_age),
                closed_max_age_ms: ms(cfg.closed_max_age),
                tombstone_max_age_ms: ms(cfg.tombstone_max_age),
                batch: cfg.batch,
            })
            .await?;
        total.age += step.age;
        total.closed_age += step.closed_age;
        total.tombstones += step.tombstones;
        if step.total() < cfg.batch {
            return Ok(total);
        }
        // Let waiting ingests through between batches.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub async fn run(store: Store, cfg: RetentionConfig, mut shutdown: watch::Receiver<bool>) {
    loop {
        match sweep_once(&store, &cfg, chrono::Utc::now().timestamp_millis()).await {
            Ok(s) if s.total() > 0 => tracing::info!(
                age = s.age,
                closed_age = s.closed_age,
                tombstones = s.tombstones,
                "retention sweep removed records (tombstones kept)"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "retention sweep failed; it runs again later"),
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.sweep_every) => {}
            _ = shutdown.changed() => return,
        }
    }
}
