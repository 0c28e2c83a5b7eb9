//! tracing to stderr plus daily rolling files (tracing-appender); the retention sweeper removes
//! the files older than `logging.max_age` (`prune`), on its schedule.
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
                .filename_prefix(PREFIX.trim_end_matches('.'))
                .filename_suffix(SUFFIX.trim_start_matches('.'))
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

/// The prefix and suffix of the rolling files (`deadletter.2026-11-30.log`).
const PREFIX: &str = "deadletter.";
const SUFFIX: &str = ".log";

/// Remove the rolling log files in `dir` last written before `cutoff`; how many went.
/// Only files named like ours are touched.
pub fn prune(dir: &std::path::Path, cutoff: std::time::SystemTime) -> std::io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(PREFIX) && name.ends_with(SUFFIX)) {
            continue;
        }
        let meta = entry.metadata()?;
        if meta.is_file() && meta.modified()? < cutoff {
            std::fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Logging for the one-shot commands: warnings and errors to stderr.
pub fn init_cli() {
    let _ = tracing_subscriber::registry()
        .with(fmt::layer().with_writer(std::io::stderr).with_filter(
            EnvFilter::try_from_env("DEADLETTER_LOG").unwrap_or_else(|_| EnvFilter::new("warn")),
        ))
        .try_init();
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    #[test]
    fn prune_removes_only_our_old_files() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let day = Duration::from_secs(86_400);
        for (name, age_days) in [
            ("deadletter.2026-01-01.log", 20),
            ("deadletter.2026-01-19.log", 2),
            ("deadletter.2026-01-02.log", 19),
            ("other.log", 30),
            ("deadletter.db", 30),
        ] {
            let f = std::fs::File::create(dir.path().join(name)).unwrap();
            f.set_modified(now - day * age_days).unwrap();
        }
        assert_eq!(super::prune(dir.path(), now - day * 14).unwrap(), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["deadletter.2026-01-19.log", "deadletter.db", "other.log"]
        );
    }
}
