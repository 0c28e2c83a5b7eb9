//! Automatic retries against real local HTTP targets: headers, Retry-After, backoff to review,
//! 4xx to review, hangs and resets, the breaker, secrets read at send time, and kill -9 in the
//! middle of sending.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::{eventually, Server};
use crate::target::{ok, status, Behave, Target};

/// Fast retries to `url` for partition `orders`.
fn config(url: &str, extra: &str) -> String {
    format!(
        "[delivery]\ntick = \"50ms\"\nlease = \"30s\"\nrate_initial = 50.0\nrate_max = 100.0\n{}{extra}\n\
         [triage]\npoison_threshold = 1000\n\
         [policy.transient]\nretry_base = \"50ms\"\nretry_cap = \"200ms\"\nmax_attempts = 4\n\
         [policy.rate_limited]\nretry_base = \"50ms\"\nretry_cap = \"200ms\"\n\
         [[targets]]\nname = \"orders\"\nurl = \"{url}\"\npartitions = [\"orders\"]\n",
        if extra.contains("timeout") { "" } else { "timeout = \"2s\"\n" }
    )
}

fn webhook_item(order: &str) -> Value {
    json!({"headers": {"host": "127.0.0.1:5678", "content-type": "application/json"}, "params": {}, "query": {},
           "body": {"orderId": order, "amount": 5}, "webhookUrl": "http://127.0.0.1:5678/webhook/orders", "executionMode": "production"})
}

fn post(s: &Server, body: Value) -> i64 {
    let r = s.post("/v1/dead-letters", body.to_string());
    assert_eq!(r.status, 201, "{}", r.text);
    r.json["id"].as_i64().unwrap()
}

fn wait_for(s: &Server, id: i64, want: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
        if rec["status"] == want {
            return rec;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "record {id} is not {want} after 20 s: {}\ntargets: {}",
            serde_json::to_string_pretty(&rec).unwrap(),
            s.get("/v1/targets").text
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_transient_failure_is_retried_until_delivered_with_idempotency_headers() {
    let target = Target::start(vec![status(503)], ok());
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(
        &s,
        json!({"item": webhook_item("C-1"), "error": {"status": 503}, "partition": "orders", "idempotency_key": "order-C-1"}),
    );
    let rec = wait_for(&s, id, "replayed");

    let got = target.got();
    assert_eq!(got.len(), 2, "one 503, then the delivery");
    for (n, g) in got.iter().enumerate() {
        assert_eq!((g.method.as_str(), g.path.as_str()), ("POST", "/hook"));
        assert_eq!(g.header("idempotency-key"), Some("order-C-1"));
        assert_eq!(g.header("x-deadletter-id"), Some(id.to_string().as_str()));
        assert_eq!(
            g.header("x-deadletter-attempt"),
            Some((n + 1).to_string().as_str())
        );
        assert_eq!(g.header("x-deadletter-replay"), Some("true"));
        // body mode auto: an n8n webhook item goes back as its body.
        assert_eq!(
            serde_json::from_str::<Value>(&g.body).unwrap(),
            json!({"orderId": "C-1", "amount": 5})
        );
    }
    let d = rec["deliveries"].as_array().unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0]["outcome"].as_str(), d[0]["status_code"].as_i64()),
        (Some("transient"), Some(503))
    );
    assert_eq!(
        (d[1]["outcome"].as_str(), d[1]["status_code"].as_i64()),
        (Some("success"), Some(200))
    );
    assert!(d[1]["response_excerpt"]
        .as_str()
        .unwrap()
        .contains("executionId"));
    assert_eq!(d[1]["target"], "orders");
    assert_eq!(rec["attempts"], 2);
    // The audit trail shows deadletter's own moves.
    let moves: Vec<String> = rec["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "status_changed")
        .map(|e| {
            format!(
                "{}>{} by {}",
                e["from_status"].as_str().unwrap(),
                e["to_status"].as_str().unwrap(),
                e["actor"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        moves,
        [
            "retry_scheduled>retrying by deadletter",
            "retrying>retry_scheduled by deadletter",
            "retry_scheduled>retrying by deadletter",
            "retrying>replayed by deadletter",
        ]
    );
}

#[test]
fn retry_after_is_honoured() {
    let target = Target::start(
        vec![Behave::Answer(
            429,
            vec![("retry-after", "1".into())],
            "{}".into(),
        )],
        ok(),
    );
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(
        &s,
        json!({"payload": {"n": 1}, "error": {"status": 429}, "partition": "orders"}),
    );
    let rec = wait_for(&s, id, "replayed");
    let got = target.got();
    assert_eq!(got.len(), 2);
    let gap = got[1].at - got[0].at;
    assert!(
        gap >= Duration::from_millis(1000),
        "retried after {gap:?}, before Retry-After"
    );
    assert!(gap < Duration::from_millis(3000), "{gap:?}");
    assert_eq!(rec["deliveries"][0]["retry_after_ms"], 1000);
    assert_eq!(rec["failure_class"], "rate_limited");
}

#[test]
fn exhausted_attempts_go_to_review_with_the_last_error() {
    let target = Target::start(vec![], status(500));
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(
        &s,
        json!({"payload": {"n": 1}, "error": {"status": 500}, "partition": "orders"}),
    );
    let rec = wait_for(&s, id, "review");
    assert_eq!(target.got().len(), 4, "max_attempts = 4");
    assert_eq!(rec["attempts"], 4);
    assert!(
        rec["last_error"]
            .as_str()
            .unwrap()
            .starts_with("gave up after 4 attempt(s): the target answered 500"),
        "{}",
        rec["last_error"]
    );
}

#[test]
fn a_refusal_goes_to_review_with_the_targets_answer() {
    let target = Target::start(
        vec![Behave::Answer(
            422,
            vec![],
            r#"{"error":"customer email is invalid","token":"secret-token-123"}"#.into(),
        )],
        ok(),
    );
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(
        &s,
        json!({"payload": {"n": 1}, "error": {"status": 503}, "partition": "orders"}),
    );
    let rec = wait_for(&s, id, "review");
    assert_eq!(target.got().len(), 1, "a 4xx is not retried");
    let excerpt = rec["deliveries"][0]["response_excerpt"].as_str().unwrap();
    assert!(excerpt.contains("customer email is invalid"), "{excerpt}");
    assert!(
        !excerpt.contains("secret-token-123"),
        "the excerpt is redacted: {excerpt}"
    );
    assert!(rec["last_error"]
        .as_str()
        .unwrap()
        .contains("refused it: the target answered 422"));
}

#[test]
fn hangs_and_resets_are_transient() {
    let target = Target::start(
        vec![Behave::Hang(Duration::from_secs(3)), Behave::Close],
        ok(),
    );
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(
        &s,
        json!({"payload": {"n": 1}, "error": {"status": 503}, "partition": "orders"}),
    );
    let rec = wait_for(&s, id, "replayed");
    let d = rec["deliveries"].as_array().unwrap();
    assert_eq!(d.len(), 3, "{d:?}");
    assert!(
        d[0]["error"].as_str().unwrap().contains("timed out"),
        "{}",
        d[0]["error"]
    );
    assert_eq!(d[0]["outcome"], "transient");
    assert_eq!(d[1]["outcome"], "transient");
    assert!(d[1]["status_code"].is_null());
}

#[test]
fn records_without_a_target_or_payload_go_to_review_saying_why() {
    let target = Target::start(vec![], ok());
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(
        &s,
        json!({"payload": {"n": 1}, "error": {"status": 503}, "partition": "elsewhere"}),
    );
    let rec = wait_for(&s, id, "review");
    assert!(
        rec["last_error"]
            .as_str()
            .unwrap()
            .contains("no replay target"),
        "{}",
        rec["last_error"]
    );
    // An Error Trigger record has a target (its partition's) but nothing to send.
    let r = s.post(
        "/v1/n8n/error-trigger?partition=orders",
        crate::harness::fixture("error-trigger-body.dlqHttp500Wf0001.raw.json"),
    );
    assert_eq!(r.json["status"], "retry_scheduled");
    let rec = wait_for(&s, r.json["id"].as_i64().unwrap(), "review");
    assert!(
        rec["last_error"]
            .as_str()
            .unwrap()
            .contains("no payload to send"),
        "{}",
        rec["last_error"]
    );
    assert!(target.got().is_empty(), "nothing was sent");
}

#[test]
fn the_breaker_opens_on_a_failing_target_and_closes_when_it_recovers() {
    let target = Target::start(vec![status(503), status(503), status(503)], ok());
    let s = Server::start_with(&config(
        &target.url,
        "breaker_failures = 2\nbreaker_cooldown = \"700ms\"\nconcurrency_per_target = 1",
    ));
    let ids: Vec<i64> = (0..4)
        .map(|n| {
            post(
                &s,
                json!({"payload": {"n": n}, "error": {"status": 503}, "partition": "orders"}),
            )
        })
        .collect();
    let opened = eventually("the breaker to open", Duration::from_secs(10), || {
        let t = s.get("/v1/targets").json;
        let live = t["live"]
            .as_array()?
            .iter()
            .find(|g| g["target"] == "orders")?
            .clone();
        (live["breaker"] == "open").then_some(live)
    });
    assert_eq!(opened["breaker_opened_total"], 1);
    for id in &ids {
        wait_for(&s, *id, "replayed");
    }
    let t = s.get("/v1/targets").json;
    let live = t["live"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["target"] == "orders")
        .unwrap()
        .clone();
    assert_eq!(live["breaker"], "closed");
    assert!(
        live["paused_total"].as_i64().unwrap() > 0,
        "records waited while it was open: {live}"
    );
    // Nothing was sent while open: after the 2nd failure, the next send came after the cooldown.
    let got = target.got();
    let gap = got[2].at - got[1].at;
    assert!(
        gap >= Duration::from_millis(650),
        "sent {gap:?} after the breaker opened"
    );
}

#[test]
fn secret_headers_are_read_at_send_time_and_never_stored() {
    let target = Target::start(vec![], ok());
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("token");
    std::fs::write(&secret, "Bearer s3cret-from-file-42\n").unwrap();
    let extra = format!(
        "secret_headers = {{ Authorization = {{ file = \"{}\" }} }}",
        secret.display()
    );
    let cfg = config(&target.url, "").replace(
        "partitions = [\"orders\"]\n",
        &format!("partitions = [\"orders\"]\n{extra}\n"),
    );
    let mut s = Server::start_with(&cfg);
    let id = post(
        &s,
        json!({"payload": {"n": 1}, "error": {"status": 503}, "partition": "orders"}),
    );
    wait_for(&s, id, "replayed");
    assert_eq!(
        target.got()[0].header("authorization"),
        Some("Bearer s3cret-from-file-42")
    );
    let (st, log) = s.terminate();
    assert!(st.success());
    assert!(!log.contains("s3cret-from-file-42"));
    for f in ["deadletter.db", "deadletter.db-wal"] {
        let bytes = std::fs::read(s.dir.join(f)).unwrap_or_default();
        assert!(
            !bytes.windows(18).any(|w| w == b"s3cret-from-file-4"),
            "secret in {f}"
        );
    }
}

#[test]
fn kill_9_while_sending_loses_nothing_and_repeats_carry_the_same_key() {
    // A slow target, so that sends are in flight when the process dies.
    let target = Target::start(vec![], Behave::Answer(200, vec![], "{}".into()));
    for _ in 0..6 {
        target.push(Behave::Hang(Duration::from_millis(400)));
    }
    let cfg = config(&target.url, "concurrency_per_target = 3\ntimeout = \"5s\"");
    let mut s = Server::start_with(&cfg);
    let ids: Vec<i64> = (0..20)
        .map(|n| post(&s, json!({"payload": {"n": n}, "error": {"status": 503}, "partition": "orders", "idempotency_key": format!("k-{n}")})))
        .collect();
    eventually("sends in flight", Duration::from_secs(10), || {
        (!target.got().is_empty()).then_some(())
    });
    s.kill9();

    let s2 = Server::start_in(&s.dir, &cfg).unwrap();
    for id in &ids {
        wait_for(&s2, *id, "replayed");
    }
    let list = s2.get("/v1/dead-letters?status=retrying").json;
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        0,
        "none stuck in retrying"
    );
    let got = target.got();
    for n in 0..20 {
        let key = format!("k-{n}");
        let sends: Vec<_> = got
            .iter()
            .filter(|g| g.body == format!("{{\"n\":{n}}}"))
            .collect();
        assert!(!sends.is_empty(), "record {n} never reached the target");
        assert!(
            sends
                .iter()
                .all(|g| g.header("idempotency-key") == Some(key.as_str())),
            "record {n}: a repeat with another key"
        );
    }
    // At least one record was in flight at the kill and was sent again after the restart.
    assert!(
        got.len() > 20,
        "expected repeats after the crash, got {} sends",
        got.len()
    );
}

#[test]
fn a_target_that_answers_garbage_or_gigabytes_does_not_hurt() {
    let target = Target::start(vec![Behave::Garbage, Behave::Huge(4 << 30)], ok());
    let s = Server::start_with(&config(&target.url, ""));
    let id = post(
        &s,
        json!({"payload": {"n": 1}, "error": {"status": 503}, "partition": "orders"}),
    );
    let rec = wait_for(&s, id, "replayed");
    let d = rec["deliveries"].as_array().unwrap();
    assert_eq!(
        d[0]["outcome"], "transient",
        "garbage is a transient failure: {}",
        d[0]
    );
    assert_eq!(
        d[1]["outcome"], "success",
        "a 4 GiB answer is a 200 whose rest is never read"
    );
    assert_eq!(d[1]["response_excerpt"].as_str().unwrap().len(), 2048);
    assert!(d[1]["latency_ms"].as_i64().unwrap() < 10_000);
    assert_eq!(s.get("/healthz").status, 200);
}
