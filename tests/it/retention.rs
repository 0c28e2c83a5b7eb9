//! Erasure: an admin removes a person's records now; their bytes are in neither the database
//! nor the WAL afterwards, and a tombstone says what went, when, why and who asked.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::harness::{stderr, stdout, Server};

const ADMIN: &str = "retention-admin-token-0123456789";
const OPS: &str = "retention-ops-token-0123456789ab";

fn grep(path: &std::path::Path, needle: &[u8]) -> bool {
    std::fs::read(path)
        .unwrap_or_default()
        .windows(needle.len())
        .any(|w| w == needle)
}

#[test]
fn an_erasure_destroys_the_payload_bytes_and_leaves_a_tombstone() {
    let digest = |t: &str| hex::encode(Sha256::digest(t.as_bytes()));
    let s = Server::start_with(&format!(
        "[[auth.tokens]]\nname = \"dpo\"\nrole = \"admin\"\nsha256 = \"{}\"\n[[auth.tokens]]\nname = \"ops\"\nrole = \"operator\"\nsha256 = \"{}\"\n",
        digest(ADMIN),
        digest(OPS)
    ));
    let marker = "ERASE-ME-7f3a9c-personal-data";
    let post = |body: Value| {
        let r = s
            .client
            .post(s.url("/v1/dead-letters"))
            .bearer_auth(OPS)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        r.json::<Value>().unwrap()["id"].as_i64().unwrap()
    };
    // Small enough to be stored uncompressed, so its bytes can be looked for in the files.
    let gone = post(
        json!({"payload": {"customer": marker}, "external_event_id": "evt-erase", "tenant_id": "acme"}),
    );
    let kept = post(json!({"payload": {"customer": "someone else"}, "tenant_id": "other"}));
    assert!(
        grep(&s.dir.join("deadletter.db-wal"), marker.as_bytes())
            || grep(&s.dir.join("deadletter.db"), marker.as_bytes()),
        "the marker must be findable before the erasure, or the test proves nothing"
    );

    let del = |q: &str, token: &str| {
        s.client
            .delete(s.url(&format!("/v1/dead-letters?{q}")))
            .bearer_auth(token)
            .header("x-deadletter-actor", "dpo-officer")
            .send()
            .unwrap()
    };
    assert_eq!(
        del("external_event_id=evt-erase", OPS).status().as_u16(),
        403,
        "operators cannot erase"
    );
    assert_eq!(
        del("tenant_id=acme&ids=1", ADMIN).status().as_u16(),
        422,
        "one selector at a time"
    );
    let r = del("external_event_id=evt-erase", ADMIN);
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().unwrap();
    assert_eq!(
        (body["erased"].as_i64(), body["ids"].clone()),
        (Some(1), json!([gone]))
    );

    for f in ["deadletter.db", "deadletter.db-wal"] {
        assert!(
            !grep(&s.dir.join(f), marker.as_bytes()),
            "the erased payload is still in {f}"
        );
    }
    let get = |p: &str| s.client.get(s.url(p)).bearer_auth(OPS).send().unwrap();
    assert_eq!(
        get(&format!("/v1/dead-letters/{gone}")).status().as_u16(),
        404
    );
    assert_eq!(
        get(&format!("/v1/dead-letters/{kept}")).status().as_u16(),
        200
    );
    let t: Value = get("/v1/tombstones").json().unwrap();
    let t = &t["tombstones"][0];
    assert_eq!(t["record_id"], gone);
    assert_eq!(t["reason"], "erasure");
    assert_eq!(t["actor"], "dpo-officer (dpo)");
    assert_eq!(t["external_event_id"], "evt-erase");
    assert_eq!(t["tenant_id"], "acme");
    assert_eq!(
        t["payload_size"].as_i64().unwrap(),
        json!({"customer": marker}).to_string().len() as i64
    );
    assert_eq!(t["payload_sha256"].as_str().unwrap().len(), 64);

    // The CLI does the same, as an admin.
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), ADMIN).unwrap();
    let o = s.cli(&[
        "--server",
        &s.url(""),
        "--token-file",
        token.path().to_str().unwrap(),
        "erase",
        "--tenant",
        "other",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("erased 1 record(s)"), "{}", stdout(&o));
    assert_eq!(
        get(&format!("/v1/dead-letters/{kept}")).status().as_u16(),
        404
    );
}

#[test]
fn a_backup_taken_while_ingesting_is_consistent_and_checks_clean() {
    let s = Server::start();
    let ingest = |range: std::ops::Range<i64>| {
        for n in range {
            let r = s.post(
                "/v1/dead-letters",
                json!({"payload": {"n": n}, "idempotency_key": format!("b{n}")}).to_string(),
            );
            assert_eq!(r.status, 201);
        }
    };
    ingest(0..50);
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("deadletter.db");
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| ingest(50..300));
        let o = s.cli(&["backup", copy.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("checked"), "{}", stdout(&o));
        writer.join().unwrap();
    });
    let o = std::process::Command::new(crate::harness::BIN)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("check")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).ends_with(": ok\n"));
    let o = std::process::Command::new(crate::harness::BIN)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["list", "--json", "--limit", "1000"])
        .output()
        .unwrap();
    let n = serde_json::from_slice::<Value>(&o.stdout).unwrap()["items"]
        .as_array()
        .unwrap()
        .len();
    assert!(
        (50..=300).contains(&n),
        "the backup holds {n} records: a snapshot from between the first 50 and all 300"
    );
    let o = s.cli(&["backup", copy.to_str().unwrap()]);
    assert!(!o.status.success(), "a backup never overwrites a file");
    let o = s.cli(&["check"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Everything after the header line (which carries the export's own time).
fn body_lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .map(str::to_owned)
        .collect()
}

#[test]
fn export_then_import_round_trips_and_importing_again_changes_nothing() {
    use crate::harness::fixture;
    let s = Server::start();
    // A mix: n8n's shapes, a big (compressed) payload, an edit, a resolution, an erasure.
    let trigger = s.post(
        "/v1/n8n/error-trigger",
        fixture("error-trigger-body.dlqHttp500Wf0001.raw.json"),
    );
    assert_eq!(trigger.status, 201, "{}", trigger.text);
    let item = s.post("/v1/dead-letters", fixture("error-output-item.raw.json"));
    let item = item.json["id"].as_i64().unwrap();
    let big = json!({"partition": "billing", "payload": {"lines": (0..300).map(|n| json!({"sku": format!("SKU-{n}"), "qty": n})).collect::<Vec<_>>()}});
    let big = s.post("/v1/dead-letters", big.to_string()).json["id"]
        .as_i64()
        .unwrap();
    let gone = s
        .post(
            "/v1/dead-letters",
            json!({"payload": {"who": "erase me"}, "tenant_id": "t-gone"}).to_string(),
        )
        .json["id"]
        .as_i64()
        .unwrap();
    let mut edited: Value =
        serde_json::from_str(&s.get(&format!("/v1/dead-letters/{item}/payload")).text).unwrap();
    edited["body"]["amount"] = json!(1);
    assert_eq!(
        s.patch(item, json!({"payload": edited}), "ana", Some(1))
            .status,
        200
    );
    assert_eq!(
        s.patch(big, json!({"status": "resolved"}), "ana", None)
            .status,
        200
    );
    let r = s
        .client
        .delete(s.url("/v1/dead-letters?tenant_id=t-gone"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // Retention's view, over HTTP and in the CLI.
    let st = s.get("/v1/retention").json;
    assert_eq!(st["removed"]["erasure"], 1);
    assert_eq!(st["tombstones"], 1);
    let billing = st["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["partition"] == "billing")
        .unwrap();
    assert_eq!(
        (billing["records"].as_i64(), billing["open"].as_i64()),
        (Some(1), Some(0))
    );
    assert!(billing["bytes"].as_i64().unwrap() > 100);
    let o = s.cli(&["retention"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("erasure 1"), "{}", stdout(&o));
    assert!(stdout(&o).contains("billing"), "{}", stdout(&o));

    // Export while the server runs.
    let work = tempfile::tempdir().unwrap();
    let first = work.path().join("first.jsonl");
    let o = s.cli(&["export", "--out", first.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("exported 3 record(s) and 1 tombstone(s)"),
        "{}",
        stdout(&o)
    );

    // Import into a fresh data dir, export that: the same lines.
    let fresh = work.path().join("fresh");
    let cli = |dir: &std::path::Path, args: &[&str]| {
        std::process::Command::new(crate::harness::BIN)
            .arg("--data-dir")
            .arg(dir)
            .args(args)
            .output()
            .unwrap()
    };
    let o = cli(&fresh, &["import", first.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("imported 3 record(s) and 1 tombstone(s)"),
        "{}",
        stdout(&o)
    );
    let second = work.path().join("second.jsonl");
    let o = cli(&fresh, &["export", "-o", second.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(body_lines(&first), body_lines(&second));
    // Again: nothing changes.
    let o = cli(&fresh, &["import", first.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("imported 0 record(s) and 0 tombstone(s); 3 already here"),
        "{}",
        stdout(&o)
    );
    let o = cli(&fresh, &["check"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // The imported copy serves: both payload versions, and new records get new ids.
    let mut copy = Server::start_in(&fresh, "").unwrap();
    let v1 = copy
        .get(&format!("/v1/dead-letters/{item}/payload?version=1"))
        .text;
    let v2 = copy.get(&format!("/v1/dead-letters/{item}/payload")).text;
    assert_eq!(
        v1,
        s.get(&format!("/v1/dead-letters/{item}/payload?version=1"))
            .text
    );
    assert_ne!(v1, v2);
    assert_eq!(v2, s.get(&format!("/v1/dead-letters/{item}/payload")).text);
    assert!(copy.get(&format!("/v1/dead-letters/{gone}")).status == 404);
    let newer = copy.post("/v1/dead-letters", json!({"payload": {"n": 1}}).to_string());
    assert!(
        newer.json["id"].as_i64().unwrap() > gone,
        "no id is reused, not even an erased one's"
    );
    // Erase a record in the copy: importing the old export does not bring it back.
    let r = copy
        .client
        .delete(copy.url(&format!("/v1/dead-letters?ids={big}")))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Import needs the data dir to itself.
    let o = cli(&fresh, &["import", first.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("stop the server"), "{}", stderr(&o));
    copy.terminate();
    let o = cli(&fresh, &["import", first.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("1 removed here (left out)"),
        "{}",
        stdout(&o)
    );
    let copy = Server::start_in(&fresh, "").unwrap();
    assert_eq!(copy.get(&format!("/v1/dead-letters/{big}")).status, 404);

    // A damaged export is refused with the line named, and nothing of its batch lands.
    let bad = work.path().join("bad.jsonl");
    let mut text = std::fs::read_to_string(&first).unwrap();
    // The edited payload version, inside its JSON string.
    assert!(text.contains(r#"\"amount\":1"#));
    text = text.replacen(r#"\"amount\":1"#, r#"\"amount\":2"#, 1);
    std::fs::write(&bad, text).unwrap();
    let other = work.path().join("other");
    let o = cli(&other, &["import", bad.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("does not match its sha256"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("lines 2–5"), "{}", stderr(&o));
    let o = cli(&other, &["list", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        listed["items"],
        json!([]),
        "nothing of the failed batch landed"
    );
    drop(copy);
}

#[test]
fn old_log_files_go_on_the_sweepers_schedule_and_expiring_records_are_told() {
    use std::time::{Duration, SystemTime};
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let aged = |name: &str, days: u64| {
        let p = logs.join(name);
        std::fs::File::create(&p)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(days * 86_400))
            .unwrap();
        p
    };
    let old = aged("deadletter.2026-10-01.log", 20);
    let young = aged("deadletter.2026-11-25.log", 5);
    let theirs = aged("someone-elses.log", 90);
    // Logs kept 10 days; records expire after 1 h and are "expiring soon" 2 h ahead: a record
    // ingested now is expiring soon at once.
    let s = Server::start_in(
        tmp.path(),
        "[logging]\nmax_age = \"10d\"\n[retention]\nmax_age = \"1h\"\nwarn_before = \"2h\"\nsweep_every = \"1s\"\n",
    )
    .unwrap();
    crate::harness::eventually(
        "the old log file is removed",
        Duration::from_secs(10),
        || (!old.exists()).then_some(()),
    );
    assert!(young.exists() && theirs.exists());
    let r = s.post("/v1/dead-letters", json!({"payload": {"n": 1}}).to_string());
    assert_eq!(r.status, 201);
    crate::harness::eventually(
        "the record counts as expiring soon",
        Duration::from_secs(10),
        || (s.get("/v1/retention").json["expiring_soon"] == 1).then_some(()),
    );
    // The next sweep says so in the log (read from today's log file).
    crate::harness::eventually("the sweeper warns", Duration::from_secs(10), || {
        std::fs::read_dir(&logs)
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
            .any(|t| t.contains("open records will expire soon") && t.contains("default=1"))
            .then_some(())
    });
}
