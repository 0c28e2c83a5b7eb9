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
