//! tracing to stderr plus daily rolling files (tracing-appender) that keep `keep_files` days.
//! Nothing here ever sees a payload: callers log ids, classes and counts, not bodies.
//! An unwritable log directory is a warning, not a crash.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::fmt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LoggingConfig;

/// Keep alive for as long as logs should reach the file (drop flushes it).
pub struct LogGuard {
    _file: Option<WorkerGuard>,
}

/// Logging for `serve`: stderr (if configured) and the rolling files.
pub fn init_server(cfg: &LoggingConfig) -> LogGuard {
    let filter = || EnvFilter::try_new(&cfg.level).unwrap_or_else(|_| EnvFilter::new("info"));
    let mut warning = None;
    let file = match std::fs::create_dir_all(&cfg.dir)
        .map_err(|e| e.to_string())
        .and_then(|_| {
            tracing_appender::rolling::Builder::new()
                .rotation(tracing_appender::rolling::Rotation::DAILY)
                .filename_prefix("deadletter")
                .filename_suffix("log")
                .max_log_files(cfg.keep_files)
                .build(&cfg.dir)
                .map_err(|e| e.to_string())
        }) {
        Ok(appender) => Some(tracing_appender::non_blocking(appender)),
        Err(e) => {
            warning = Some(format!(
                "cannot write logs to {}: {e}; logging to stderr only",
                cfg.dir.display()
            ));
            None
        }
    };
    let (file_layer, guard) = match file {
        Some((writer, guard)) => (
            Some(
                fmt::layer()
                    .with_ansi(false)
                    .with_writer(writer)
                    .with_filter(filter()),
            ),
            Some(guard),
        ),
        None => (None, None),
    };
    let stderr_layer = (cfg.stderr || file_layer.is_none()).then(|| {
        fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .with_filter(filter())
    });
    let _ = tracing_subscriber::registry()
        .with(file_layer)
        .with(stderr_layer)
        .try_init();
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    LogGuard { _file: guard }
}

/// Logging for the one-shot commands: warnings and errors to stderr.
pub fn init_cli() {
    let _ = tracing_subscriber::registry()
        .with(fmt::layer().with_writer(std::io::stderr).with_filter(
            EnvFilter::try_from_env("DEADLETTER_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
        ))
        .try_init();
}
