//! Config: the embedded default, `config init` / `config check`, the platform data dir,
//! refusing a newer database, and an unwritable log dir.

use std::process::{Command, Stdio};

use crate::harness::{stderr, stdout, Server, BIN};

#[test]
fn config_init_writes_the_example_and_check_accepts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deadletter.toml");
    let o = Command::new(BIN)
        .args(["config", "init"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("listen = \"127.0.0.1:7680\""));
    let o = Command::new(BIN)
        .args(["config", "init"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "init must not overwrite without --force"
    );
    let o = Command::new(BIN)
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("is valid"));
    let o = Command::new(BIN).args(["config", "init"]).output().unwrap();
    assert_eq!(
        stdout(&o),
        text,
        "init without a path prints the same example"
    );
}

#[test]
fn config_check_names_every_bad_key_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:7680\"\nlistne = 1\n[storage]\ncompress_above = 5\n[[classify.rules]]\nname = \"x\"\nclass = \"auth\"\nerror_text = \"(\"\n",
    )
    .unwrap();
    let o = Command::new(BIN)
        .args(["config", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    for key in [
        "server.listne",
        "storage.compress_above",
        "classify.rules[0].error_text",
    ] {
        assert!(err.contains(key), "{key} not named in: {err}");
    }
    // serve refuses the same file, before listening.
    let o = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    assert!(stdout(&o).is_empty());
}

#[test]
fn serve_runs_with_no_config_in_the_platform_data_dir() {
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("xdg-data");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("DEADLETTER_CONFIG")
        .env_remove("DEADLETTER_DATA_DIR")
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", &data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.starts_with("deadletter listening on http://127.0.0.1:"),
        "{line}"
    );
    assert!(
        data.join("deadletter/deadletter.db").exists(),
        "no database in $XDG_DATA_HOME/deadletter"
    );
    assert!(data.join("deadletter/logs").is_dir());
}

#[test]
fn a_database_from_a_newer_deadletter_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    drop(Server::start_in(&dir, "").unwrap());
    let conn = rusqlite::Connection::open(dir.join("deadletter.db")).unwrap();
    conn.pragma_update(None, "user_version", 999).unwrap();
    drop(conn);
    let err = Server::start_in(&dir, "").err().expect("must refuse");
    assert!(err.contains("newer deadletter"), "{err}");
    let o = Command::new(BIN)
        .arg("--data-dir")
        .arg(&dir)
        .arg("list")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("newer deadletter"), "{}", stderr(&o));
}

#[test]
fn an_unwritable_log_dir_is_a_warning_not_a_crash() {
    let s = Server::start_with("[logging]\ndir = \"/proc/deadletter-cannot-write-here\"\n");
    assert_eq!(s.post("/v1/dead-letters", r#"{"payload":1}"#).status, 201);
    let mut s = s;
    let (status, log) = s.terminate();
    assert!(status.success());
    assert!(log.contains("cannot write logs"), "{log}");
}
