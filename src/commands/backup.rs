//! `deadletter backup PATH` and `deadletter check`: a consistent copy of the database, and its
//! integrity check. Both read the file directly and work while the server runs.

use std::path::Path;

use anyhow::{bail, Context};

use super::emit;
use crate::config::Config;
use crate::store;

pub fn backup(config: &Config, to: &Path) -> anyhow::Result<()> {
    let from = config.storage.db_path();
    let started = std::time::Instant::now();
    store::backup(&from, to, config.storage.busy_timeout)
        .with_context(|| format!("backing up {} to {}", from.display(), to.display()))?;
    let problems = store::check(to, config.storage.busy_timeout)?;
    if !problems.is_empty() {
        bail!(
            "the backup at {} fails its integrity check: {}",
            to.display(),
            problems.join("; ")
        );
    }
    let size = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    emit(&format!(
        "backed up {} to {} ({:.1} MB, checked, {:.1} s)\n",
        from.display(),
        to.display(),
        size as f64 / 1e6,
        started.elapsed().as_secs_f64()
    ))
}

pub fn check(config: &Config) -> anyhow::Result<()> {
    let path = config.storage.db_path();
    let problems =
        store::check(&path, config.storage.busy_timeout).context("checking the database")?;
    if problems.is_empty() {
        return emit(&format!("{}: ok\n", path.display()));
    }
    for p in &problems {
        emit(&format!("{p}\n"))?;
    }
    bail!("{} problem(s) in {}", problems.len(), path.display())
}
