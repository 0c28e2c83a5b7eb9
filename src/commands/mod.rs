//! One file per subcommand, each with `run(…) -> anyhow::Result<()>`. The only place that
//! prints for humans. Exit codes live in `ExitCode`.

pub mod assign;
pub mod backup;
pub mod client;
pub mod config;
pub mod edit;
pub mod erase;
pub mod export;
pub mod groups;
pub mod list;
pub mod note;
pub mod reopen;
pub mod replay;
pub mod resolve;
pub mod retention;
pub mod serve;
pub mod service;
pub mod show;
pub mod skip;
pub mod stats;

use std::path::PathBuf;

use anyhow::Context;

use crate::cli::Cli;
use crate::config::Config;
use crate::store::ReadPool;

/// Meaningful exit codes, beside 0 (success), 1 (any other failure) and 2 (bad usage, clap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    ConfigInvalid = 3,
    NotFound = 4,
}

/// The config the global flags name: `--config` or the embedded default, then `--data-dir`.
pub fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut config = match &cli.config {
        Some(path) => {
            let c = Config::load(path)?;
            warn_if_exposed(path, &c);
            c
        }
        None => Config::default_config()?,
    };
    if let Some(dir) = &cli.data_dir {
        config.set_data_dir(dir.clone());
    }
    Ok(config)
}

/// A config file that holds literal secret headers should not be readable by others.
fn warn_if_exposed(path: &std::path::Path, config: &Config) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        if meta.permissions().mode() & 0o044 == 0 {
            return;
        }
        let redactor = crate::redact::Redactor::new(&config.redact.keys);
        let secret = config
            .targets
            .iter()
            .map(|t| &t.settings)
            .chain(std::iter::once(&config.delivery.defaults))
            .flat_map(|s| s.headers.iter())
            .find(|(k, _)| redactor.is_sensitive_key(k));
        if let Some((k, _)) = secret {
            eprintln!(
                "deadletter: warning: {} holds a literal `{k}` header and others can read it; \
                 `chmod 600` it, or move the value to secret_headers (env or file)",
                path.display()
            );
        }
    }
}

/// A reader on the database (the CLI reads directly; it works with or without the server).
pub fn open_readers(config: &Config) -> anyhow::Result<ReadPool> {
    let path: PathBuf = config.storage.db_path();
    ReadPool::open(&path, config.storage.busy_timeout).context("opening the database")
}

/// Write to standard output. A closed pipe (`deadletter list | head`) ends the output quietly
/// instead of panicking like `print!` would.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

// Formatting helpers shared with the web page live in `crate::text`.
pub use crate::text::{ago, clip, span, until, urlencode};
