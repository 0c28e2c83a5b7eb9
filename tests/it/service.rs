//! `deadletter service`: the launchd plist is a valid property list with the right keys and
//! the real paths, `--dry-run` prints the exact launchctl / systemctl commands, and a real
//! install (against stand-in launchctl/systemctl that record their arguments) writes the unit
//! and the default config, runs those commands, and can be run again.

use std::path::Path;
use std::process::{Command, Output};

use crate::harness::{stderr, stdout, BIN};

fn dl(home: &Path, path_prefix: Option<&Path>, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.env("HOME", home).args(["service"]).args(args);
    if let Some(p) = path_prefix {
        let path = std::env::var("PATH").unwrap_or_default();
        c.env("PATH", format!("{}:{path}", p.display()));
    }
    c.output().unwrap()
}

/// The plist in a dry run's output, parsed by Python's plistlib, as JSON.
fn plist_of(out: &str) -> serde_json::Value {
    let start = out.find("<?xml").expect("a plist");
    let end = out.find("</plist>").unwrap() + "</plist>".len();
    let mut py = Command::new("python3")
        .args([
            "-c",
            "import json, plistlib, sys; print(json.dumps(plistlib.loads(sys.stdin.buffer.read())))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    py.stdin
        .take()
        .unwrap()
        .write_all(&out.as_bytes()[start..end])
        .unwrap();
    let o = py.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "plistlib refused it:\n{}",
        &out[start..end]
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn commands(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("launchctl ") || l.starts_with("systemctl "))
        .collect()
}

#[test]
fn a_launch_agent_plist_is_valid_with_the_real_paths_and_the_exact_commands() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_str().unwrap();
    let o = dl(
        home.path(),
        None,
        &[
            "install",
            "--dry-run",
            "--platform",
            "launchd",
            "--label",
            "com.example.dlq",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let p = plist_of(&out);
    let bin = std::fs::canonicalize(BIN).unwrap();
    let support = format!("{h}/Library/Application Support/deadletter");
    assert_eq!(p["Label"], "com.example.dlq");
    assert_eq!(
        p["ProgramArguments"],
        serde_json::json!([
            bin.to_str().unwrap(),
            "--config",
            format!("{support}/deadletter.toml"),
            "--data-dir",
            support,
            "serve"
        ])
    );
    assert_eq!(p["RunAtLoad"], true);
    assert_eq!(
        p["KeepAlive"],
        serde_json::json!({"SuccessfulExit": false}),
        "restarted on a crash only"
    );
    assert_eq!(p["ThrottleInterval"], 10);
    assert_eq!(p["WorkingDirectory"], support);
    assert_eq!(
        p["StandardOutPath"],
        format!("{h}/Library/Logs/deadletter/stdout.log")
    );
    assert_eq!(
        p["StandardErrorPath"],
        format!("{h}/Library/Logs/deadletter/stderr.log")
    );
    assert_eq!(p["SoftResourceLimits"]["NumberOfFiles"], 4096);
    assert_eq!(p["ProcessType"], "Standard");
    assert!(p.get("UserName").is_none());
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let plist = format!("{h}/Library/LaunchAgents/com.example.dlq.plist");
    assert_eq!(
        commands(&out),
        [
            format!("launchctl bootout gui/{uid}/com.example.dlq"),
            // (A temp dir's path needs no shell quoting.)
            format!("launchctl bootstrap gui/{uid} {plist}"),
            format!("launchctl enable gui/{uid}/com.example.dlq"),
            format!("launchctl kickstart -k gui/{uid}/com.example.dlq"),
        ]
    );
    assert!(
        !home.path().join("Library").exists(),
        "a dry run writes nothing"
    );

    // The daemon: the system domain, /Library paths, an optional user.
    let o = dl(
        home.path(),
        None,
        &[
            "install",
            "--system",
            "--dry-run",
            "--platform",
            "launchd",
            "--user",
            "_deadletter",
        ],
    );
    let out = stdout(&o);
    let p = plist_of(&out);
    assert_eq!(p["UserName"], "_deadletter");
    assert_eq!(
        p["StandardErrorPath"],
        "/Library/Logs/deadletter/stderr.log"
    );
    assert_eq!(
        commands(&out),
        [
            "launchctl bootout system/com.deadletter.server",
            "launchctl bootstrap system /Library/LaunchDaemons/com.deadletter.server.plist",
            "launchctl enable system/com.deadletter.server",
            "launchctl kickstart -k system/com.deadletter.server",
        ]
    );
    let o = dl(
        home.path(),
        None,
        &["uninstall", "--dry-run", "--platform", "launchd"],
    );
    assert_eq!(
        commands(&stdout(&o)),
        [format!("launchctl bootout gui/{uid}/com.deadletter.server")]
    );
    let o = dl(
        home.path(),
        None,
        &["status", "--dry-run", "--platform", "launchd"],
    );
    assert_eq!(
        commands(&stdout(&o)),
        [format!("launchctl print gui/{uid}/com.deadletter.server")]
    );
}

/// A stand-in for launchctl or systemctl that appends its arguments to a log.
fn fake(dir: &Path, name: &str) -> std::path::PathBuf {
    let log = dir.join(format!("{name}.log"));
    let script = dir.join(name);
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", log.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    log
}

#[test]
fn an_install_writes_the_unit_and_config_runs_the_commands_and_can_run_again() {
    let home = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let log = fake(bin.path(), "systemctl");
    for _ in 0..2 {
        let o = dl(
            home.path(),
            Some(bin.path()),
            &["install", "--platform", "systemd"],
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let unit = home.path().join(".config/systemd/user/deadletter.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    let binary = std::fs::canonicalize(BIN).unwrap();
    assert!(
        text.contains(&format!(
            "ExecStart=\"{}\" --config \"{}/.config/deadletter/deadletter.toml\" --data-dir \"{}/.local/share/deadletter\" serve",
            binary.display(),
            home.path().display(),
            home.path().display()
        )),
        "{text}"
    );
    let config = home.path().join(".config/deadletter/deadletter.toml");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.toml"))
            .unwrap()
    );
    // The config someone edited is never overwritten by a reinstall.
    std::fs::write(&config, "[server]\nlisten = \"127.0.0.1:7799\"\n").unwrap();
    let o = dl(
        home.path(),
        Some(bin.path()),
        &["install", "--platform", "systemd"],
    );
    assert!(o.status.success());
    assert!(std::fs::read_to_string(&config).unwrap().contains("7799"));
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.lines().take(3).collect::<Vec<_>>(),
        [
            "--user daemon-reload",
            "--user enable --now deadletter.service",
            "--user restart deadletter.service"
        ]
    );
    let o = dl(
        home.path(),
        Some(bin.path()),
        &["uninstall", "--platform", "systemd"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!unit.exists());
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls.lines().rev().take(2).collect::<Vec<_>>(),
        [
            "--user daemon-reload",
            "--user disable --now deadletter.service"
        ]
    );

    // launchd the same way.
    let log = fake(bin.path(), "launchctl");
    let o = dl(
        home.path(),
        Some(bin.path()),
        &["install", "--platform", "launchd"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(home
        .path()
        .join("Library/LaunchAgents/com.deadletter.server.plist")
        .exists());
    assert!(home.path().join("Library/Logs/deadletter").is_dir());
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls.lines().count(), 4);
    assert!(calls.lines().nth(1).unwrap().starts_with("bootstrap gui/"));
}

#[test]
fn the_version_names_the_commit() {
    let o = Command::new(BIN).arg("--version").output().unwrap();
    let v = stdout(&o);
    assert!(
        v.starts_with(&format!("deadletter {} (", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    let commit = v.trim().rsplit_once('(').unwrap().1.trim_end_matches(')');
    assert!(commit.len() >= 7 && commit != "unknown", "{v}");
}

#[test]
fn install_sh_installs_the_binary_and_the_service_is_idempotent_and_uninstalls() {
    let home = tempfile::tempdir().unwrap();
    let fakes = tempfile::tempdir().unwrap();
    let log = fake(fakes.path(), "systemctl");
    let _ = fake(fakes.path(), "launchctl");
    let prefix = home.path().join("prefix");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/install.sh");
    let run = |args: &[&str]| {
        let path = std::env::var("PATH").unwrap_or_default();
        let o = Command::new("bash")
            .arg(&script)
            .args(["--prefix", prefix.to_str().unwrap(), "--binary", BIN])
            .args(args)
            .env("HOME", home.path())
            .env("PATH", format!("{}:{path}", fakes.path().display()))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
        stdout(&o)
    };
    let first = run(&[]);
    assert!(first.contains("installed"), "{first}");
    let installed = prefix.join("bin/deadletter");
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(BIN).unwrap()
    );
    let o = Command::new(&installed).arg("--version").output().unwrap();
    assert!(stdout(&o).starts_with("deadletter "));
    let (unit, config) = if cfg!(target_os = "macos") {
        (
            home.path()
                .join("Library/LaunchAgents/com.deadletter.server.plist"),
            home.path()
                .join("Library/Application Support/deadletter/deadletter.toml"),
        )
    } else {
        (
            home.path().join(".config/systemd/user/deadletter.service"),
            home.path().join(".config/deadletter/deadletter.toml"),
        )
    };
    assert!(std::fs::read_to_string(&unit)
        .unwrap()
        .contains(installed.to_str().unwrap()));
    std::fs::write(&config, "# mine\n").unwrap();
    // Again: nothing to replace, the config stays as the operator left it.
    let second = run(&[]);
    assert!(second.contains("is up to date"), "{second}");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), "# mine\n");
    run(&["--uninstall"]);
    assert!(!installed.exists() && !unit.exists());
    assert!(config.exists(), "the config is kept");
    if !cfg!(target_os = "macos") {
        let calls = std::fs::read_to_string(&log).unwrap();
        assert!(
            calls.contains("--user enable --now deadletter.service"),
            "{calls}"
        );
        assert!(
            calls.contains("--user disable --now deadletter.service"),
            "{calls}"
        );
    }
}

#[test]
fn the_homebrew_formula_parses_and_its_service_runs_serve_on_its_config() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/homebrew");
    let o = Command::new("ruby")
        .arg("-c")
        .arg(root.join("deadletter.rb"))
        .output()
        .expect("ruby (Debian's ruby package; .ci/run installs it)");
    assert!(stdout(&o).contains("Syntax OK"), "{}", stderr(&o));
    let o = Command::new("ruby")
        .arg(root.join("check-formula.rb"))
        .arg(root.join("deadletter.rb"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let f: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let prefix = f["prefix"].as_str().unwrap();
    assert_eq!(
        f["service"]["run"],
        serde_json::json!([
            format!("{prefix}/opt/deadletter/bin/deadletter"),
            "--config",
            format!("{prefix}/etc/deadletter/deadletter.toml"),
            "--data-dir",
            format!("{prefix}/var/deadletter"),
            "serve"
        ])
    );
    assert_eq!(
        f["service"]["keep_alive"],
        serde_json::json!({"crashed": true})
    );
    assert_eq!(f["meta"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        f["meta"]["depends_on"],
        serde_json::json!([{"rust": "build"}])
    );
    // install builds with cargo; post_install writes the default config with the binary.
    assert_eq!(f["calls"][0][0], "cargo");
    assert_eq!(
        f["calls"][1],
        serde_json::json!([
            format!("{prefix}/Cellar/deadletter/0.1.0/bin/deadletter"),
            "config",
            "init",
            format!("{prefix}/etc/deadletter/deadletter.toml")
        ])
    );
}
