//! `deadletter serve`: the server, until SIGINT or SIGTERM.

use std::io::Write;

use anyhow::Context;

use crate::cli::ServeArgs;
use crate::config::Config;
use crate::logging;
use crate::server;

pub fn run(mut config: Config, args: ServeArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.listen {
        config.server.listen = addr;
    }
    // Refuse before anything is opened or printed.
    if config.auth.tokens.is_empty() && !config.server.listen.ip().is_loopback() {
        anyhow::bail!(server::open_refusal(config.server.listen));
    }
    crate::http::Tokens::resolve(&config.auth).map_err(anyhow::Error::msg)?;
    // Everything deadletter creates (data dir, database, WAL, logs) is the user's alone.
    #[cfg(unix)]
    // SAFETY: umask only sets this process's file-creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
    let _log = logging::init_server(&config.logging);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("deadletter-rt")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let store = server::open_store(&config).with_context(|| {
            format!(
                "opening the database in {}",
                config.storage.data_dir.display()
            )
        })?;
        let listener = tokio::net::TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.server.listen))?;
        let addr = listener.local_addr()?;
        // The first line on stdout names the bound address (tests and scripts read it).
        let mut out = std::io::stdout();
        writeln!(out, "deadletter listening on http://{addr}")?;
        out.flush()?;
        tracing::info!(%addr, db = %store.path.display(), "serving");
        server::serve(config, store, listener, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown requested");
}
