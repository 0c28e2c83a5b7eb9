//! `serve(config, listener, shutdown)`: open the store, build the router, serve until the
//! shutdown future resolves, then let the writer drain. Used by `deadletter serve` and by the
//! bench harness alike; background tasks (retries, retention, alerts) will start here too.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::http::{router, AppState};
use crate::ingest::Ingestor;
use crate::replay::Scheduler;
use crate::store::{PoisonRule, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("HTTP server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Open the store for `config` (migrating it) without serving: lets `main` fail fast, before it
/// prints the listening line, when the database cannot be used.
pub fn open_store(config: &Config) -> Result<Store, ServerError> {
    let poison = PoisonRule {
        threshold: config.triage.poison_threshold,
        window_ms: i64::try_from(config.triage.poison_window.as_millis()).unwrap_or(i64::MAX),
    };
    Ok(Store::open(&config.storage, poison)?)
}

pub async fn serve(
    config: Config,
    store: Store,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let config = Arc::new(config);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let scheduler = if config.delivery.enabled {
        let s = Scheduler::new(config.clone(), store.clone()).map_err(std::io::Error::other)?;
        Some(s)
    } else {
        tracing::info!("delivery.enabled = false: records wait in retry_scheduled");
        None
    };
    let scheduler_task = scheduler.clone().map(|s| tokio::spawn(s.run(stop_rx)));
    let state = AppState {
        ingestor: Arc::new(Ingestor::new(&config)),
        config,
        store,
        scheduler,
    };
    let app = router(state.clone());
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    tracing::info!("HTTP server stopped; finishing sends in flight");
    let _ = stop_tx.send(true);
    if let Some(task) = scheduler_task {
        let _ = task.await;
    }
    tracing::info!("draining the writer");
    // Dropping the last writer handle joins the writer thread after its final commit.
    let AppState {
        store, scheduler, ..
    } = state;
    drop(scheduler);
    tokio::task::spawn_blocking(move || drop(store))
        .await
        .map_err(|e| ServerError::Io(std::io::Error::other(e)))?;
    Ok(())
}
