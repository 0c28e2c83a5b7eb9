//! `deadletter service install|uninstall|status [--system] [--dry-run]`: carries out the plan
//! `crate::service` makes — a launchd agent/daemon on macOS, a systemd unit on Linux.
//! `--dry-run` prints the unit file and the exact commands instead of touching anything.

use std::path::PathBuf;

use anyhow::{bail, Context};

use super::emit;
use crate::cli::{ServiceAction, ServiceArgs};
use crate::service::{shell_line, Plan, Platform, Setup, DEFAULT_LABEL};

fn setup(args: &ServiceArgs) -> anyhow::Result<Setup> {
    let platform = match args.platform.as_deref() {
        None => Platform::native(),
        Some("launchd") => Platform::Launchd,
        Some("systemd") => Platform::Systemd,
        Some(other) => bail!("--platform: `{other}` is not launchd or systemd"),
    };
    let binary = match &args.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe()
            .context("finding this binary's path")?
            .canonicalize()
            .context("finding this binary's path")?,
    };
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .context("HOME is not set")?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    Ok(Setup {
        platform,
        system: args.system,
        label: args.label.clone().unwrap_or_else(|| DEFAULT_LABEL.into()),
        binary,
        home,
        uid,
        user_name: args.user.clone(),
    })
}

fn print(plan: &Plan) -> String {
    let mut out = String::new();
    for d in &plan.dirs {
        out.push_str(&format!("# mkdir -p {}\n", d.display()));
    }
    if let Some(c) = &plan.config {
        out.push_str(&format!(
            "# write the default config to {} unless it exists\n",
            c.display()
        ));
    }
    for (path, text) in &plan.write {
        out.push_str(&format!("# {}\n{text}", path.display()));
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    for r in &plan.remove {
        out.push_str(&format!("# rm {}\n", r.display()));
    }
    for c in plan.run.iter().chain(&plan.after) {
        out.push_str(&shell_line(c));
        out.push('\n');
    }
    out
}

fn run(argv: &[String], tolerate_failure: bool) -> anyhow::Result<()> {
    let status = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .status()
        .with_context(|| format!("running {}", shell_line(argv)))?;
    if !status.success() && !tolerate_failure {
        bail!("`{}` failed ({status})", shell_line(argv));
    }
    Ok(())
}

pub fn service(args: ServiceArgs) -> anyhow::Result<()> {
    let setup = setup(&args)?;
    let plan = match args.action {
        ServiceAction::Install => setup.install(),
        ServiceAction::Uninstall => setup.uninstall(),
        ServiceAction::Status => setup.status(),
    };
    if args.dry_run {
        return emit(&print(&plan));
    }
    for d in &plan.dirs {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    if let Some(c) = &plan.config {
        if !c.exists() {
            std::fs::write(c, crate::config::EXAMPLE)
                .with_context(|| format!("writing {}", c.display()))?;
            emit(&format!("wrote the default config to {}\n", c.display()))?;
        }
    }
    for (path, text) in &plan.write {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        emit(&format!("wrote {}\n", path.display()))?;
    }
    let is_bootout = |c: &[String]| c.get(1).is_some_and(|a| a == "bootout");
    for c in &plan.run {
        // Taking out a service that is not loaded is fine (first install, or already gone).
        run(
            c,
            is_bootout(c) || matches!(args.action, ServiceAction::Uninstall),
        )?;
    }
    for r in &plan.remove {
        match std::fs::remove_file(r) {
            Ok(()) => emit(&format!("removed {}\n", r.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", r.display())),
        }
    }
    for c in &plan.after {
        run(c, true)?;
    }
    Ok(())
}
