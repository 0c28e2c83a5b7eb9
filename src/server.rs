//! `serve(config, listener, shutdown)`: open the store, build the router, serve until the
//! shutdown future resolves, then let the writer drain. Used by `deadletter serve` and by the
//! bench harness alike; background tasks (retries, retention, alerts) will start here too.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::http::{router, AppState, Tokens};
use crate::ingest::Ingestor;
use crate::replay::Scheduler;
use crate::store::{PoisonRule, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("HTTP server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Refused(String),
}

/// Why deadletter will not listen on a non-loopback address without tokens.
pub fn open_refusal(addr: std::net::SocketAddr) -> String {
    format!(
        "refusing to listen on {addr} with no API token configured: anyone who can reach it could \
         read payloads and replay them. Listen on 127.0.0.1, or add an [[auth.tokens]] entry (see \
         `deadletter config init`)."
    )
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
    let tokens = Tokens::resolve(&config.auth).map_err(ServerError::Refused)?;
    let addr = listener.local_addr()?;
    if tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(ServerError::Refused(open_refusal(addr)));
    }
    let config = Arc::new(config);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let scheduler = if config.delivery.enabled {
        let s = Scheduler::new(config.clone(), store.clone()).map_err(std::io::Error::other)?;
        Some(s)
    } else {
        tracing::info!("delivery.enabled = false: records wait in retry_scheduled");
        None
    };
    let scheduler_task = scheduler
        .clone()
        .map(|s| tokio::spawn(s.run(stop_rx.clone())));
    crate::metrics::METRICS.set_max_partitions(config.metrics.max_partitions);
    let alerter = tokio::spawn(crate::alerts::run(
        store.clone(),
        config.alerts.clone(),
        stop_rx.clone(),
    ));
    let sweeper = tokio::spawn(crate::retention::run(
        store.clone(),
        config.retention.clone(),
        Some((config.logging.dir.clone(), config.logging.max_age)),
        stop_rx.clone(),
    ));
    let state = AppState {
        ingestor: Arc::new(Ingestor::new(&config)),
        config,
        store,
        scheduler,
        tokens,
    };
    let enricher = tokio::spawn(crate::n8n::run(
        state.store.clone(),
        state.config.n8n.clone(),
        state.ingestor.clone(),
        stop_rx.clone(),
    ));
    let app = router(state.clone());
    let bound = state.config.server.shutdown_timeout;
    let (asked_tx, mut asked_rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = asked_tx.send(true);
    });
    // Stop within `shutdown_timeout` of the signal, whatever clients or targets do.
    let deadline = async move {
        let _ = asked_rx.wait_for(|asked| *asked).await;
        tokio::time::sleep(bound).await;
    };
    tokio::select! {
        r = server => r?,
        _ = deadline => tracing::warn!(?bound, "requests still in flight at the shutdown deadline; stopping anyway"),
    }
    tracing::info!("HTTP server stopped; finishing sends in flight");
    let _ = stop_tx.send(true);
    if let Some(task) = scheduler_task {
        if tokio::time::timeout(bound, task).await.is_err() {
            tracing::warn!(?bound, "sends still in flight at the shutdown deadline; their leases will release them on the next start");
        }
    }
    if tokio::time::timeout(bound, sweeper).await.is_err() {
        tracing::warn!("the retention sweep was still running at the shutdown deadline");
    }
    // Alerts never hold up a shutdown: a message in flight is dropped; nor does a fetch from
    // n8n (the record stays as it was and is fetched on the next start).
    alerter.abort();
    enricher.abort();
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
