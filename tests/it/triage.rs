//! Triage as operators do it: moves through the table (and only those), every move audited,
//! optimistic concurrency, payload edits that keep the original, class policies, poison
//! escalation, failure groups with bulk actions, and the CLI verbs through the real binary.

use serde_json::{json, Value};

use crate::harness::{fixture, stderr, stdout, Server};

fn post(s: &Server, body: Value) -> i64 {
    let r = s.post("/v1/dead-letters", body.to_string());
    assert_eq!(r.status, 201, "{}", r.text);
    r.json["id"].as_i64().unwrap()
}

fn events(s: &Server, id: i64) -> Vec<Value> {
    s.get(&format!("/v1/dead-letters/{id}")).json["events"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn class_policies_decide_where_a_record_goes() {
    let s = Server::start_with("[policy.validation]\nowner = \"data-team\"\nsla = \"2h\"\n");
    let auth = s.post(
        "/v1/n8n/error-trigger",
        json!({
        "execution": {"id": "9", "error": {"message": "Authorization failed", "httpCode": "401"}},
        "workflow": {"id": "wfA"}})
        .to_string(),
    );
    assert_eq!(
        (
            auth.json["status"].as_str(),
            auth.json["failure_class"].as_str()
        ),
        (Some("review"), Some("auth"))
    );
    let rec = s.get(&format!("/v1/dead-letters/{}", auth.json["id"])).json;
    assert_eq!(rec["credential_incident"], true);
    assert_eq!(rec["events"][0]["detail"]["credential_incident"], true);

    let id = post(
        &s,
        json!({"payload": {"a": 1}, "error": {"message": "email is required", "status": 422}}),
    );
    let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
    assert_eq!(
        (rec["status"].as_str(), rec["owner"].as_str()),
        (Some("review"), Some("data-team"))
    );
    let first =
        chrono::DateTime::parse_from_rfc3339(rec["first_seen_at"].as_str().unwrap()).unwrap();
    let due = chrono::DateTime::parse_from_rfc3339(rec["due_at"].as_str().unwrap()).unwrap();
    assert_eq!(
        (due - first).num_seconds(),
        7200,
        "due_at = first seen + SLA"
    );

    let id = post(&s, json!({"payload": {"a": 2}, "error": {"status": 503}}));
    assert_eq!(
        s.get(&format!("/v1/dead-letters/{id}")).json["status"],
        "retry_scheduled"
    );
}

#[test]
fn moves_follow_the_table_and_each_is_audited() {
    let s = Server::start();
    let id = post(
        &s,
        json!({"payload": {"a": 1}, "error": {"message": "order cancelled"}}),
    );
    assert_eq!(
        s.get(&format!("/v1/dead-letters/{id}")).json["status"],
        "review"
    );

    let r = s.patch(id, json!({"status": "replayed"}), "ana", None);
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (409, Some("illegal_transition"))
    );
    assert_eq!(
        r.json["error"]["message"],
        "review -> replayed is not allowed; from review an operator may move to: retry_scheduled, ready_for_replay, resolved, skipped"
    );
    let r = s.patch(id, json!({"status": "skipped"}), "ana", None);
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (422, Some("reason_required"))
    );
    let r = s.patch(id, json!({"status": "bogus"}), "ana", None);
    assert_eq!(r.status, 422);
    let r = s.patch(id, json!({"stauts": "resolved"}), "ana", None);
    assert_eq!(r.status, 422, "unknown fields are refused: {}", r.text);

    let r = s.patch(
        id,
        json!({"status": "resolved", "reason": "refunded by hand"}),
        "ana",
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["status"], "resolved");
    let r = s.patch(id, json!({"status": "review"}), "bo", None);
    assert_eq!(r.status, 422, "reopening needs a reason");
    let r = s.patch(
        id,
        json!({"status": "review", "reason": "customer wrote again"}),
        "bo",
        None,
    );
    assert_eq!(r.status, 200);

    // Owner, tags and notes, each audited; `null` takes the owner away.
    let r = s.patch(id, json!({"owner": "ana", "tags": ["refund", "vip", "refund"], "note": "checking with billing"}), "bo", None);
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        (r.json["owner"].as_str(), r.json["tags"].clone()),
        (Some("ana"), json!(["refund", "vip"]))
    );
    assert_eq!(
        s.get("/v1/dead-letters?owner=ana").json["items"][0]["id"],
        id
    );
    let r = s.patch(id, json!({"owner": null}), "bo", None);
    assert_eq!(r.json["owner"], Value::Null);
    let r = s.patch(id, json!({"owner": null}), "bo", None);
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (422, Some("invalid_change")),
        "nothing to change"
    );
    let r = s.patch(id, json!({"tags": vec!["t"; 40]}), "bo", None);
    assert_eq!(r.status, 422);
    let trail = events(&s, id);
    let kinds: Vec<&str> = trail.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "created",
            "status_changed",
            "status_changed",
            "assigned",
            "tagged",
            "noted",
            "assigned"
        ]
    );

    let ev = events(&s, id);
    let moves: Vec<(&str, &str, &str, &str)> = ev
        .iter()
        .filter(|e| e["kind"] == "status_changed")
        .map(|e| {
            (
                e["from_status"].as_str().unwrap(),
                e["to_status"].as_str().unwrap(),
                e["actor"].as_str().unwrap(),
                e["detail"]["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        moves,
        vec![
            ("review", "resolved", "ana", "refunded by hand"),
            ("resolved", "review", "bo", "customer wrote again")
        ]
    );
}

/// A deterministic walk of random moves: whatever is accepted is in the table and audited,
/// whatever is refused leaves the record as it was.
#[test]
fn random_operator_commands_never_leave_the_table_and_every_accepted_one_is_audited() {
    let s = Server::start();
    let id = post(
        &s,
        json!({"payload": {"a": 1}, "error": {"message": "order cancelled"}}),
    );
    let states = [
        "new",
        "retry_scheduled",
        "retrying",
        "review",
        "ready_for_replay",
        "replaying",
        "replayed",
        "replay_failed",
        "resolved",
        "skipped",
    ];
    let mut seed: u64 = 0x5eed;
    let mut status = "review".to_owned();
    let mut accepted = 0;
    for _ in 0..80 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let to = states[(seed >> 33) as usize % states.len()];
        let with_reason = (seed >> 20) & 1 == 1;
        let body = if with_reason {
            json!({"status": to, "reason": "walk"})
        } else {
            json!({"status": to})
        };
        let r = s.patch(id, body, "walker", None);
        match r.status {
            200 => {
                accepted += 1;
                assert_eq!(r.json["status"], to);
                status = to.to_owned();
            }
            409 | 422 => {
                assert_eq!(
                    s.get(&format!("/v1/dead-letters/{id}")).json["status"],
                    status.as_str()
                );
            }
            other => panic!("unexpected {other}: {}", r.text),
        }
    }
    assert!(
        accepted >= 10,
        "the walk should move a fair bit ({accepted})"
    );
    let ev = events(&s, id);
    let audited: Vec<_> = ev
        .iter()
        .filter(|e| e["kind"] == "status_changed")
        .collect();
    assert_eq!(audited.len(), accepted);
    for pair in audited.windows(2) {
        assert_eq!(
            pair[0]["to_status"], pair[1]["from_status"],
            "the audit trail is a chain"
        );
    }
    let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
    assert_eq!(
        rec["version"],
        1 + accepted as i64,
        "every change bumps the version"
    );
}

#[test]
fn concurrent_patches_on_one_record_exactly_one_wins() {
    let s = Server::start();
    let id = post(
        &s,
        json!({"payload": {"a": 1}, "error": {"message": "order cancelled"}}),
    );
    let version = s.get(&format!("/v1/dead-letters/{id}")).json["version"]
        .as_i64()
        .unwrap();
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let s = &s;
                scope.spawn(move || {
                    s.patch(
                        id,
                        json!({"owner": format!("op-{i}")}),
                        &format!("op-{i}"),
                        Some(version),
                    )
                    .status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 412).count(),
        11,
        "{statuses:?}"
    );
    let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
    let assigned: Vec<_> = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "assigned")
        .collect();
    assert_eq!(assigned.len(), 1);
    assert_eq!(rec["owner"], assigned[0]["detail"]["owner"]);
    // The ETag is the version, and a stale one is refused.
    let res = s
        .client
        .get(s.url(&format!("/v1/dead-letters/{id}")))
        .send()
        .unwrap();
    assert_eq!(
        res.headers()["etag"].to_str().unwrap(),
        format!("\"{}\"", version + 1)
    );
    let r = s.patch(id, json!({"note": "late"}), "x", Some(version));
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (412, Some("stale_version"))
    );
}

#[test]
fn a_payload_edit_keeps_the_original_and_records_a_json_patch() {
    let s = Server::start();
    let body = fixture("error-output-item.raw.json");
    let r = s.post("/v1/dead-letters", body.clone());
    let id = r.json["id"].as_i64().unwrap();
    let original = s.get(&format!("/v1/dead-letters/{id}/payload")).text;

    let mut fixed: Value = serde_json::from_str(&original).unwrap();
    fixed["body"]["amount"] = json!(19.99);
    fixed["body"]["currency"] = json!("EUR");
    fixed["headers"]["authorization"] = json!("Bearer edited-in-secret-123");
    let r = s.patch(id, json!({"payload": fixed}), "ana", None);
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (428, Some("version_required"))
    );
    let r = s.patch(id, json!({"payload": fixed}), "ana", Some(1));
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["payload_version"], 2);

    let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
    assert_eq!(
        rec["payload"]["body"]["amount"], 19.99,
        "the record shows what a replay would send"
    );
    assert_eq!(
        rec["payload"]["headers"]["authorization"], "[REDACTED]",
        "edits are redacted too"
    );
    assert_eq!(rec["payload_versions"].as_array().unwrap().len(), 2);
    assert_eq!(
        s.get(&format!("/v1/dead-letters/{id}/payload?version=1"))
            .text,
        original,
        "the original is untouched"
    );
    let edit = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "payload_edited")
        .unwrap();
    assert_eq!(edit["actor"], "ana");
    let diff = edit["detail"]["diff"].as_array().unwrap();
    assert!(
        diff.contains(&json!({"op": "replace", "path": "/body/amount", "value": 19.99})),
        "{diff:?}"
    );
    assert!(
        diff.contains(&json!({"op": "add", "path": "/body/currency", "value": "EUR"})),
        "{diff:?}"
    );
    // Applying the recorded patch to version 1 gives version 2.
    let mut v1: Value = serde_json::from_str(&original).unwrap();
    json_patch::patch(
        &mut v1,
        &serde_json::from_value::<json_patch::Patch>(edit["detail"]["diff"].clone()).unwrap(),
    )
    .unwrap();
    assert_eq!(v1, rec["payload"]);
    // Editing from a stale base is refused.
    let r = s.patch(id, json!({"payload": {"x": 1}}), "bo", Some(1));
    assert_eq!(r.status, 412);
    let r = s.patch(id, json!({"payload": "{not json"}), "bo", Some(2));
    assert_eq!(
        r.status, 200,
        "a JSON string is a valid payload: {}",
        r.text
    );
    let r = s
        .client
        .patch(s.url(&format!("/v1/dead-letters/{id}")))
        .header("content-type", "application/json")
        .header("if-match", "\"3\"")
        .body(r#"{"payload": {"unclosed": }"#)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}

#[test]
fn a_fingerprint_that_keeps_failing_turns_poison() {
    let s = Server::start();
    let item = |n: i64| {
        json!({"payload": {"orderId": n}, "error": {"message": format!("order {n} failed: 503"), "status": 503},
                               "workflow": {"id": "wfP"}, "node": "Call API"})
    };
    let statuses: Vec<String> = (1..=4)
        .map(|n| {
            let r = s.post("/v1/dead-letters", item(n).to_string());
            r.json["status"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        statuses,
        ["retry_scheduled", "retry_scheduled", "review", "review"]
    );
    let list = s.get("/v1/dead-letters").json;
    let poison: Vec<bool> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["poison"].as_bool().unwrap())
        .collect();
    assert_eq!(poison, [true, true, false, false]);
    let groups = s.get("/v1/groups?poison=true").json;
    let g = &groups["groups"][0];
    assert_eq!(
        (
            g["count"].as_i64(),
            g["open"].as_i64(),
            g["poison"].as_bool()
        ),
        (Some(4), Some(4), Some(true))
    );
    assert_eq!(g["workflow_id"], "wfP");
    assert!(g["poison_since"].is_string());
    let ev = events(&s, 3);
    assert_eq!(ev[0]["detail"]["poison"]["threshold"], 3);
}

#[test]
fn a_group_action_applies_to_every_open_record_and_audits_each() {
    let s = Server::start();
    let item = |n: i64| json!({"payload": {"n": n}, "error": {"message": format!("customer {n} already exists")}, "workflow": {"id": "wfG"}});
    let ids: Vec<i64> = (1..=3).map(|n| post(&s, item(n))).collect();
    let other = post(
        &s,
        json!({"payload": 1, "error": {"message": "order cancelled"}}),
    );
    assert_eq!(
        s.patch(ids[0], json!({"status": "resolved"}), "x", None)
            .status,
        200
    );
    let fp = s.get(&format!("/v1/dead-letters/{}", ids[1])).json["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();

    let act = |body: Value| {
        s.client
            .post(s.url(&format!("/v1/groups/{fp}/actions")))
            .header("content-type", "application/json")
            .header("x-deadletter-actor", "lead")
            .body(body.to_string())
            .send()
            .unwrap()
    };
    let r = act(json!({"action": "skip"}));
    assert_eq!(r.status().as_u16(), 422, "skip needs a reason");
    let r: Value = act(json!({"action": "assign", "owner": "ana"}))
        .json()
        .unwrap();
    assert_eq!(r["changed"], 2, "{r}");
    let r: Value = act(json!({"action": "skip", "reason": "duplicate customers, merged by hand"}))
        .json()
        .unwrap();
    assert_eq!(
        (r["changed"].as_i64(), r["refused"].as_i64()),
        (Some(2), Some(0)),
        "{r}"
    );
    for id in &ids[1..] {
        let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
        assert_eq!(
            (rec["status"].as_str(), rec["owner"].as_str()),
            (Some("skipped"), Some("ana"))
        );
        let skip = rec["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["to_status"] == "skipped")
            .unwrap()
            .clone();
        assert_eq!(
            (skip["actor"].as_str(), skip["detail"]["reason"].as_str()),
            (Some("lead"), Some("duplicate customers, merged by hand"))
        );
    }
    assert_eq!(
        s.get(&format!("/v1/dead-letters/{other}")).json["status"],
        "review",
        "other groups untouched"
    );
    assert_eq!(
        s.get("/v1/groups?open=true").json["groups"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let r = act(json!({"action": "explode"}));
    assert_eq!(r.status().as_u16(), 422);
    let r = s
        .client
        .post(s.url("/v1/groups/0000000000000000/actions"))
        .header("content-type", "application/json")
        .body(r#"{"action":"resolve"}"#)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

#[test]
fn cli_verbs_work_the_queue() {
    let s = Server::start();
    let ids: Vec<i64> = (1..=4).map(|n| post(&s, json!({"payload": {"orderId": format!("A-{n}")}, "error": {"message": format!("order {n} rejected by rule")}}))).collect();
    let id = |i: usize| ids[i].to_string();

    let o = s.verb(&["resolve", &id(0), &id(1), "--reason", "fixed upstream"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("{}: resolved (now resolved)", ids[0])),
        "{}",
        stdout(&o)
    );
    let o = s.verb(&["resolve", &id(0), &id(2)]);
    assert_eq!(o.status.code(), Some(1), "one refused: non-zero exit");
    assert!(
        stdout(&o).contains("refused: resolved -> resolved is not allowed"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains(&format!("{}: resolved", ids[2])));
    let o = s.verb(&["skip", &id(3)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--reason"));
    let o = s.verb(&["assign", &id(3), "--owner", "ana", "--json"]);
    let j: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j[0]["record"]["owner"], "ana");
    assert!(s
        .verb(&["note", &id(3), "called the customer"])
        .status
        .success());
    assert!(s
        .verb(&["reopen", &id(0), "--reason", "customer asked again"])
        .status
        .success());

    // edit: a scripted editor changes the payload; --yes saves without asking.
    let dir = tempfile::tempdir().unwrap();
    let editor = dir.path().join("ed.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/A-4/A-44/' \"$1\"\n").unwrap();
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = std::process::Command::new(crate::harness::BIN)
        .args([
            "--server",
            &s.url(""),
            "--actor",
            "cli-tester",
            "edit",
            &id(3),
            "--yes",
        ])
        .env("EDITOR", &editor)
        .env_remove("VISUAL")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(r#""path":"/orderId""#),
        "the diff is shown: {}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("saved as payload version 2"),
        "{}",
        stdout(&o)
    );
    // An editor that breaks the JSON saves nothing.
    std::fs::write(&editor, "#!/bin/sh\necho '{broken' > \"$1\"\n").unwrap();
    let o = std::process::Command::new(crate::harness::BIN)
        .args(["--server", &s.url(""), "edit", &id(3), "--yes"])
        .env("EDITOR", &editor)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not JSON"), "{}", stderr(&o));

    let rec = s.get(&format!("/v1/dead-letters/{}", ids[3])).json;
    assert_eq!(rec["payload"]["orderId"], "A-44");
    assert_eq!(rec["payload_version"], 2);
    let kinds: Vec<(&str, &str)> = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("created", "ingest"),
            ("assigned", "cli-tester"),
            ("noted", "cli-tester"),
            ("payload_edited", "cli-tester")
        ]
    );

    let o = s.verb(&["groups"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.lines().next().unwrap().starts_with("FINGERPRINT"),
        "{out}"
    );
    assert!(
        out.contains("[poison]") && out.contains("business"),
        "{out}"
    );
    let o = s.verb(&["groups", "--json"]);
    let g: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(g[0]["count"], 4);

    // show renders the trail readably.
    let o = s.cli(&["show", &id(0)]);
    let out = stdout(&o);
    assert!(
        out.contains("review -> resolved; because: fixed upstream"),
        "{out}"
    );
    assert!(
        out.contains("resolved -> review; because: customer asked again"),
        "{out}"
    );

    // No server: a clear message.
    let o = s.cli(&["--server", "http://127.0.0.1:1", "resolve", "1"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("cannot reach the deadletter server"),
        "{}",
        stderr(&o)
    );
}
