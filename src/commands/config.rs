//! `deadletter config init [PATH]` and `deadletter config check FILE`.

use anyhow::{bail, Context};

use super::emit;
use crate::cli::ConfigCommand;
use crate::config::{Config, EXAMPLE};

pub fn run(cmd: ConfigCommand) -> anyhow::Result<()> {
    match cmd {
        ConfigCommand::Init { path: None, .. } => emit(EXAMPLE)?,
        ConfigCommand::Init {
            path: Some(path),
            force,
        } => {
            if path.exists() && !force {
                bail!("{} exists; pass --force to overwrite it", path.display());
            }
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::write(&path, EXAMPLE)
                .with_context(|| format!("writing {}", path.display()))?;
            emit(&format!("wrote {}\n", path.display()))?;
        }
        ConfigCommand::Check { path } => {
            let c = Config::load(&path)?;
            emit(&format!(
                "{} is valid: listen {}, data in {}\n",
                path.display(),
                c.server.listen,
                c.storage.data_dir.display()
            ))?;
        }
    }
    Ok(())
}
