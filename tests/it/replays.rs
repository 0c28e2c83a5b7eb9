//! Operator replay jobs against a scripted local target: explicit ids, a filter with the
//! expected count, dry run, canary and automatic stop, idempotency skips, the two-person rule,
//! pause/cancel, and a job that survives kill -9.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::Server;
use crate::target::{ok, status, Behave, Target};

fn config(url: &str, extra: &str) -> String {
    format!(
        "[delivery]\ntick = \"50ms\"\nrate_initial = 100.0\nrate_max = 100.0\n\
         [triage]\npoison_threshold = 1000\n\
         [replay]\nbatch_size = 3\n{extra}\n\
         [[targets]]\nname = \"orders\"\nurl = \"{url}\"\npartitions = [\"orders\", \"billing\"]\n"
    )
}

/// Records that wait for a person (validation class → review).
fn post(s: &Server, n: i64, partition: &str) -> i64 {
    let r = s.post(
        "/v1/dead-letters",
        json!({"payload": {"n": n}, "error": {"message": format!("field {n} is required"), "status": 422},
               "partition": partition, "idempotency_key": format!("key-{n}")})
        .to_string(),
    );
    assert_eq!(
        (r.status, r.json["status"].as_str()),
        (201, Some("review")),
        "{}",
        r.text
    );
    r.json["id"].as_i64().unwrap()
}

pub(crate) fn replay(s: &Server, body: Value, actor: &str) -> crate::harness::Reply {
    let res = s
        .client
        .post(s.url("/v1/replays"))
        .header("content-type", "application/json")
        .header("x-deadletter-actor", actor)
        .body(body.to_string())
        .send()
        .unwrap();
    crate::harness::reply(res)
}

fn act(s: &Server, job: i64, action: &str, actor: &str) -> crate::harness::Reply {
    let res = s
        .client
        .post(s.url(&format!("/v1/replays/{job}/{action}")))
        .header("x-deadletter-actor", actor)
        .send()
        .unwrap();
    crate::harness::reply(res)
}

fn wait_job(s: &Server, job: i64, want: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let j = s.get(&format!("/v1/replays/{job}")).json;
        if j["status"] == want {
            return j;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {job} not {want}: {j}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_replay_by_ids_sends_each_record_once_and_marks_it_replayed() {
    let target = Target::start(vec![], ok());
    let s = Server::start_with(&config(&target.url, ""));
    let ids: Vec<i64> = (1..=5).map(|n| post(&s, n, "orders")).collect();
    let r = replay(&s, json!({"ids": ids}), "ana");
    assert_eq!(r.status, 201, "{}", r.text);
    let job = r.json["id"].as_i64().unwrap();
    let j = wait_job(&s, job, "done");
    assert_eq!(
        (
            j["counts"]["succeeded"].as_i64(),
            j["counts"]["total"].as_i64()
        ),
        (Some(5), Some(5))
    );
    let got = target.got();
    assert_eq!(got.len(), 5);
    for (n, g) in got.iter().enumerate() {
        assert_eq!(
            g.header("idempotency-key"),
            Some(format!("key-{}", n + 1).as_str()),
            "in order, with the record's key"
        );
        assert_eq!(g.header("x-deadletter-replay"), Some("true"));
    }
    for id in &ids {
        let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
        assert_eq!(rec["status"], "replayed");
        let moves: Vec<&str> = rec["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["to_status"].as_str())
            .collect();
        assert_eq!(
            moves,
            ["review", "ready_for_replay", "replaying", "replayed"]
        );
        assert_eq!(rec["deliveries"][0]["outcome"], "success");
    }
    // When a replayed item fails again, n8n's error output posts it with the headers the replay
    // sent: the new record names the one it came from.
    let again = s.post(
        "/v1/dead-letters",
        json!({"item": {"headers": {"x-deadletter-id": ids[0].to_string()}, "body": {"n": 1}, "webhookUrl": "http://x/webhook/o"},
               "error": {"status": 500}})
        .to_string(),
    );
    assert_eq!(
        s.get(&format!("/v1/dead-letters/{}", again.json["id"]))
            .json["replay_of"],
        ids[0]
    );
    // The same ids again: every key already succeeded, so nothing is sent twice.
    let r = replay(&s, json!({"ids": ids}), "ana");
    let j = wait_job(&s, r.json["id"].as_i64().unwrap(), "done");
    assert_eq!(j["counts"]["skipped"], 5, "{j}");
    assert_eq!(target.got().len(), 5);
}

#[test]
fn a_filter_must_come_with_the_count_the_operator_expects() {
    let target = Target::start(vec![], ok());
    let s = Server::start_with(&config(&target.url, ""));
    for n in 1..=3 {
        post(&s, n, "orders");
    }
    post(&s, 9, "other");
    let r = replay(&s, json!({"filter": {"partition": "orders"}}), "ana");
    assert_eq!(r.status, 422, "{}", r.text);
    let r = replay(
        &s,
        json!({"filter": {"partition": "orders"}, "expected_count": 2}),
        "ana",
    );
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (409, Some("count_mismatch"))
    );
    assert!(r.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("matches 3"));
    let r = replay(&s, json!({}), "ana");
    assert_eq!(r.status, 422, "no replay-everything default: {}", r.text);
    let r = replay(
        &s,
        json!({"filter": {"partition": "orders"}, "expected_count": 3}),
        "ana",
    );
    assert_eq!(r.status, 201, "{}", r.text);
    wait_job(&s, r.json["id"].as_i64().unwrap(), "done");
    assert_eq!(target.got().len(), 3);
}

#[test]
fn a_dry_run_shows_target_key_version_and_diff_and_sends_nothing() {
    let target = Target::start(vec![], ok());
    let s = Server::start_with(&config(&target.url, ""));
    let a = post(&s, 1, "orders");
    let b = post(&s, 2, "nowhere");
    assert_eq!(
        s.patch(
            a,
            json!({"payload": {"n": 1, "fixed": true}}),
            "ana",
            Some(1)
        )
        .status,
        200
    );
    let c = post(&s, 3, "orders");
    assert_eq!(
        s.patch(c, json!({"status": "resolved"}), "ana", None)
            .status,
        200
    );
    let r = replay(&s, json!({"ids": [a, b, c], "dry_run": true}), "ana");
    assert_eq!(r.status, 200, "{}", r.text);
    let items = r.json["items"].as_array().unwrap();
    assert_eq!(r.json["would_send"], 1);
    assert_eq!(items[0]["target"]["name"], "orders");
    assert_eq!(items[0]["idempotency_key"], "key-1");
    assert_eq!(items[0]["payload_version"], 2);
    assert_eq!(
        items[0]["diff_from_original"],
        json!([{"op": "add", "path": "/fixed", "value": true}])
    );
    assert_eq!(items[1]["would_skip"], "no replay target");
    assert!(items[2]["would_skip"]
        .as_str()
        .unwrap()
        .contains("resolved"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(target.got().is_empty(), "a dry run sends nothing");
    assert_eq!(
        s.get(&format!("/v1/dead-letters/{a}")).json["status"],
        "review",
        "and changes nothing"
    );
}

#[test]
fn a_failing_canary_stops_the_job_after_one_send() {
    let target = Target::start(vec![], status(500));
    let s = Server::start_with(&config(&target.url, ""));
    let ids: Vec<i64> = (1..=6).map(|n| post(&s, n, "orders")).collect();
    let r = replay(&s, json!({"ids": ids}), "ana");
    let j = wait_job(&s, r.json["id"].as_i64().unwrap(), "stopped");
    assert_eq!(
        (
            j["counts"]["failed"].as_i64(),
            j["counts"]["pending"].as_i64()
        ),
        (Some(1), Some(5))
    );
    assert!(j["stop_reason"].as_str().unwrap().contains("1 of 1"), "{j}");
    assert_eq!(target.got().len(), 1);
    assert_eq!(
        s.get(&format!("/v1/dead-letters/{}", ids[0])).json["status"],
        "replay_failed"
    );
}

#[test]
fn a_job_stops_when_too_many_of_a_batch_fail() {
    // canary ok, then the batch of 3: two failures → 2 of 4 failed > 20 %.
    let target = Target::start(vec![ok(), status(502), ok(), status(502)], ok());
    let s = Server::start_with(&config(&target.url, ""));
    let ids: Vec<i64> = (1..=8).map(|n| post(&s, n, "orders")).collect();
    let r = replay(&s, json!({"ids": ids}), "ana");
    let j = wait_job(&s, r.json["id"].as_i64().unwrap(), "stopped");
    assert_eq!(
        (
            j["counts"]["succeeded"].as_i64(),
            j["counts"]["failed"].as_i64(),
            j["counts"]["pending"].as_i64()
        ),
        (Some(2), Some(2), Some(4))
    );
    assert_eq!(target.got().len(), 4);
}

#[test]
fn a_partition_that_needs_approval_waits_for_a_second_person() {
    let target = Target::start(vec![], ok());
    let s = Server::start_with(&config(&target.url, "require_approval = [\"billing\"]"));
    let ids: Vec<i64> = (1..=2).map(|n| post(&s, n, "billing")).collect();
    let r = replay(&s, json!({"ids": ids}), "ana");
    assert_eq!(r.json["status"], "awaiting_approval", "{}", r.text);
    let job = r.json["id"].as_i64().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(target.got().is_empty(), "nothing is sent before approval");
    let r = act(&s, job, "approve", "ana");
    assert_eq!(r.status, 409, "the requester cannot approve: {}", r.text);
    assert!(r.text.contains("second person"));
    let r = act(&s, job, "approve", "bo");
    assert_eq!(r.status, 200, "{}", r.text);
    let j = wait_job(&s, job, "done");
    assert_eq!(j["approved_by"], "bo");
    assert_eq!(target.got().len(), 2);
    let rec = s.get(&format!("/v1/dead-letters/{}", ids[0])).json;
    let ready = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["to_status"] == "ready_for_replay")
        .unwrap()
        .clone();
    assert_eq!(ready["actor"], "bo", "the approver moved it");
}

#[test]
fn a_job_can_be_paused_resumed_and_cancelled() {
    let target = Target::start(vec![], ok());
    for _ in 0..4 {
        target.push(Behave::Hang(Duration::from_millis(0)));
    }
    let target_url = target.url.clone();
    let s = Server::start_with(&config(&target_url, "").replace(
        "rate_initial = 100.0\nrate_max = 100.0",
        "rate_initial = 2.0\nrate_max = 2.0",
    ));
    let ids: Vec<i64> = (1..=10).map(|n| post(&s, n, "orders")).collect();
    let r = replay(&s, json!({"ids": ids, "batch_size": 2}), "ana");
    let job = r.json["id"].as_i64().unwrap();
    let r = act(&s, job, "pause", "ana");
    assert_eq!(
        (r.status, r.json["status"].as_str()),
        (200, Some("paused")),
        "{}",
        r.text
    );
    let sent_when_paused = target.got().len();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        target.got().len() <= sent_when_paused + 1,
        "a paused job sends nothing more"
    );
    assert_eq!(
        act(&s, job, "approve", "bo").status,
        409,
        "only a job awaiting approval is approved"
    );
    assert_eq!(act(&s, job, "resume", "ana").json["status"], "running");
    assert_eq!(act(&s, job, "cancel", "ana").json["status"], "cancelled");
    let j = s.get(&format!("/v1/replays/{job}")).json;
    assert!(
        j["counts"]["pending"].as_i64().unwrap() > 0,
        "cancelled with items left: {j}"
    );
    assert_eq!(act(&s, job, "resume", "ana").status, 409);
    assert_eq!(s.get("/v1/replays/999").status, 404);
    // One person has at most 3 jobs open at once.
    for _ in 0..3 {
        let r = replay(&s, json!({"ids": [ids[9]]}), "carl");
        assert_eq!(r.status, 201, "{}", r.text);
        assert_eq!(
            act(&s, r.json["id"].as_i64().unwrap(), "pause", "carl").status,
            200
        );
    }
    let r = replay(&s, json!({"ids": [ids[9]]}), "carl");
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (429, Some("too_many_jobs")),
        "{}",
        r.text
    );
}

#[test]
fn a_replay_with_new_keys_names_what_it_supersedes() {
    let target = Target::start(vec![], ok());
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(&s, 1, "orders");
    let r = replay(&s, json!({"ids": [id], "new_keys": true}), "ana");
    let job = r.json["id"].as_i64().unwrap();
    wait_job(&s, job, "done");
    let g = &target.got()[0];
    assert_eq!(
        g.header("idempotency-key"),
        Some(format!("key-1-replay-{job}").as_str())
    );
    assert_eq!(g.header("x-deadletter-supersedes"), Some("key-1"));
}

#[test]
fn a_running_job_survives_kill_9_and_finishes_without_losing_or_sticking_items() {
    let target = Target::start(vec![], ok());
    for _ in 0..3 {
        target.push(Behave::Hang(Duration::from_millis(600)));
    }
    let cfg = config(&target.url, "").replace(
        "[delivery]\n",
        "[delivery]\ntimeout = \"200ms\"\nlease = \"1s\"\n",
    );
    let mut s = Server::start_with(&cfg);
    let ids: Vec<i64> = (1..=8).map(|n| post(&s, n, "orders")).collect();
    let r = replay(&s, json!({"ids": ids, "stop_failure_ratio": 1.0}), "ana");
    let job = r.json["id"].as_i64().unwrap();
    crate::harness::eventually("a send in flight", Duration::from_secs(10), || {
        (!target.got().is_empty()).then_some(())
    });
    s.kill9();
    let s2 = Server::start_in(&s.dir, &cfg).unwrap();
    let j = wait_job(&s2, job, "done");
    assert_eq!(j["counts"]["pending"], 0);
    let replaying = s2.get("/v1/dead-letters?status=replaying").json;
    assert_eq!(
        replaying["items"].as_array().unwrap().len(),
        0,
        "none stuck in replaying"
    );
    for (n, id) in ids.iter().enumerate() {
        let rec = s2.get(&format!("/v1/dead-letters/{id}")).json;
        let st = rec["status"].as_str().unwrap();
        assert!(
            ["replayed", "replay_failed", "ready_for_replay"].contains(&st),
            "record {id}: {st}"
        );
        let key = format!("key-{}", n + 1);
        assert!(target
            .got()
            .iter()
            .filter(|g| g.body == format!("{{\"n\":{}}}", n + 1))
            .all(|g| g.header("idempotency-key") == Some(key.as_str())));
    }
}

#[test]
fn the_cli_replays_with_a_dry_run_a_wait_and_job_verbs() {
    let target = Target::start(vec![], ok());
    let s = Server::start_with(&config(&target.url, "require_approval = [\"billing\"]"));
    for n in 1..=3 {
        post(&s, n, "orders");
    }
    let o = s.verb(&["replay", "--partition", "orders"]);
    assert!(!o.status.success());
    assert!(
        crate::harness::stderr(&o).contains("--expect"),
        "{}",
        crate::harness::stderr(&o)
    );
    let o = s.verb(&[
        "replay",
        "--partition",
        "orders",
        "--expect",
        "3",
        "--dry-run",
    ]);
    assert!(o.status.success(), "{}", crate::harness::stderr(&o));
    let out = crate::harness::stdout(&o);
    assert!(
        out.starts_with("dry run: 3 record(s), 3 would be sent"),
        "{out}"
    );
    assert!(out.contains("key-1") && out.contains("orders"), "{out}");
    assert!(target.got().is_empty());

    let o = s.verb(&[
        "replay",
        "--partition",
        "orders",
        "--expect",
        "3",
        "--wait",
        "--json",
    ]);
    assert!(o.status.success(), "{}", crate::harness::stderr(&o));
    let job: Value = serde_json::from_str(&crate::harness::stdout(&o)).unwrap();
    assert_eq!(
        (job["status"].as_str(), job["counts"]["succeeded"].as_i64()),
        (Some("done"), Some(3))
    );
    assert_eq!(target.got().len(), 3);

    let b = post(&s, 7, "billing");
    let o = s.verb(&["replay", &b.to_string()]);
    let out = crate::harness::stdout(&o);
    assert!(out.contains("awaiting_approval"), "{out}");
    let job_id = out
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_end_matches(':')
        .to_owned();
    let o = s.verb(&["job", "approve", &job_id]);
    assert!(
        !o.status.success(),
        "the requester (same --actor) cannot approve"
    );
    let o = s.cli(&[
        "--server",
        &s.url(""),
        "--actor",
        "second-person",
        "job",
        "approve",
        &job_id,
    ]);
    assert!(o.status.success(), "{}", crate::harness::stderr(&o));
    wait_job(&s, job_id.parse().unwrap(), "done");
    let o = s.verb(&["job", "show", &job_id]);
    assert!(
        crate::harness::stdout(&o).contains("done — 1 delivered"),
        "{}",
        crate::harness::stdout(&o)
    );
}
