//! Stamps the binary with the git commit it was built from (`deadletter --version`). Outside a
//! git checkout (a release tarball, Homebrew) `DEADLETTER_COMMIT` may say it; else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DEADLETTER_COMMIT");
    let commit = std::env::var("DEADLETTER_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    println!(
        "cargo:rustc-env=DEADLETTER_COMMIT={commit}{}",
        if dirty { "-dirty" } else { "" }
    );
    // A new commit (or a checkout) changes HEAD; an edit changes the index.
    for f in [".git/HEAD", ".git/index"] {
        if std::path::Path::new(f).exists() {
            println!("cargo:rerun-if-changed={f}");
        }
    }
}
