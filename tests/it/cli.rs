//! `deadletter list` and `deadletter show` as an operator runs them.

use serde_json::Value;

use crate::harness::{fixture, stderr, stdout, Server, BIN};

#[test]
fn list_shows_a_table_and_json_with_the_same_filters() {
    let s = Server::start();
    for f in [
        "error-trigger-body.raw.json",
        "error-trigger-body.dlqHttp500Wf0001.raw.json",
    ] {
        assert_eq!(s.post("/v1/n8n/error-trigger", fixture(f)).status, 201);
    }
    assert_eq!(
        s.post("/v1/dead-letters", fixture("error-output-item.raw.json"))
            .status,
        201
    );

    let o = s.cli(&["list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("STATUS") && lines[0].contains("CLASS"),
        "{out}"
    );
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[1].starts_with("3 ") && lines[1].contains("Orders with per-node error"),
        "{out}"
    );
    assert!(lines[3].contains("order processing failed"), "{out}");

    let o = s.cli(&["list", "--class", "transient", "--json"]);
    let page: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ids: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, vec![3, 2]);
    // Same as the API.
    assert_eq!(
        page["items"],
        s.get("/v1/dead-letters?failure_class=transient").json["items"]
    );

    let o = s.cli(&["list", "--limit", "1"]);
    assert!(
        stdout(&o).contains("more: deadletter list --cursor 3"),
        "{}",
        stdout(&o)
    );
    let o = s.cli(&["list", "--cursor", "3", "--json"]);
    let page: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);

    let o = s.cli(&["list", "--class", "sad"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--class"), "{}", stderr(&o));
    let o = s.cli(&["list", "--partition", "none-such"]);
    assert!(stdout(&o).contains("no dead letters match"));
}

#[test]
fn show_prints_the_record_its_payload_and_events() {
    let s = Server::start();
    assert_eq!(
        s.post("/v1/dead-letters", fixture("error-output-item.raw.json"))
            .status,
        201
    );
    let o = s.cli(&["show", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "status            retry_scheduled",
        "class             transient (rule transient-status)",
        "Call downstream",
        "\"orderId\": \"C-3003\"",
        "created",
        "payload (version 1",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    let o = s.cli(&["show", "1", "--json"]);
    let j: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j, s.get("/v1/dead-letters/1").json);

    let o = s.cli(&["show", "42"]);
    assert_eq!(o.status.code(), Some(4), "not found has its own exit code");
    assert!(stderr(&o).contains("no dead letter with id 42"));
}

#[test]
fn list_without_a_database_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(BIN)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("list")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no database at"), "{}", stderr(&o));
}
