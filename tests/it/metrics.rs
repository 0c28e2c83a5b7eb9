//! `GET /metrics`: the exposition is parsed and every figure checked against what the test
//! did — ingests, repeats, replays that worked and failed, a resolution, an erasure — with
//! partitions beyond the configured count folded into "other", and the token switch.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::harness::{eventually, Server};
use crate::target::{ok, status, Target};

/// One sample line: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

fn parse(text: &str) -> Vec<Sample> {
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            (name.to_owned(), labels, value.parse().unwrap())
        })
        .collect()
}

/// The value of `name` with exactly these labels (None: no such series).
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples
        .iter()
        .find(|(n, l, _)| n == name && *l == want)
        .map(|(_, _, v)| *v)
}

fn scrape(s: &Server) -> Vec<Sample> {
    let r = s.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.text);
    parse(&r.text)
}

#[test]
fn metrics_count_what_happened_exactly() {
    // The first replay is accepted, the second refused for good.
    let target = Target::start(vec![ok()], status(422));
    let s = Server::start_with(&format!(
        "[delivery]\ntick = \"50ms\"\nrate_initial = 100.0\nrate_max = 100.0\n\
         [triage]\npoison_threshold = 1000\n[metrics]\nmax_partitions = 2\n\
         [[targets]]\nname = \"orders\"\nurl = \"{}\"\npartitions = [\"orders\"]\n",
        target.url
    ));
    let post = |n: i64, partition: &str| {
        let r = s.post(
            "/v1/dead-letters",
            json!({"payload": {"n": n}, "error": {"message": "field is required", "status": 422},
                   "partition": partition, "idempotency_key": format!("key-{n}")})
            .to_string(),
        );
        assert!(r.status == 201 || r.status == 200, "{}", r.text);
        r.json["id"].as_i64().unwrap()
    };
    let o1 = post(1, "orders");
    let o2 = post(2, "orders");
    let _o3 = post(3, "orders");
    let b = post(4, "billing");
    let m = post(5, "misc");
    post(1, "orders"); // a repeat

    // Replay o1 (accepted) and o2 (refused: 422, permanent).
    for id in [o1, o2] {
        let r = crate::replays::replay(&s, json!({"ids": [id]}), "ana");
        assert_eq!(r.status, 201, "{}", r.text);
        let job = r.json["id"].as_i64().unwrap();
        eventually("the job ends", Duration::from_secs(20), || {
            let j = s.get(&format!("/v1/replays/{job}")).json;
            (j["status"] == "done" || j["status"] == "stopped").then_some(())
        });
    }
    assert_eq!(
        s.patch(b, json!({"status": "resolved"}), "ana", None)
            .status,
        200
    );
    let r = s
        .client
        .delete(s.url(&format!("/v1/dead-letters?ids={m}")))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let x = scrape(&s);
    let v = |name: &str, labels: &[(&str, &str)]| value(&x, name, labels);
    // Ingress: the third partition folds into "other".
    assert_eq!(
        v(
            "dlq_ingress_total",
            &[("partition", "orders"), ("failure_class", "validation")]
        ),
        Some(3.0)
    );
    assert_eq!(
        v(
            "dlq_ingress_total",
            &[("partition", "billing"), ("failure_class", "validation")]
        ),
        Some(1.0)
    );
    assert_eq!(
        v(
            "dlq_ingress_total",
            &[("partition", "other"), ("failure_class", "validation")]
        ),
        Some(1.0)
    );
    assert_eq!(v("dlq_deduplicated_total", &[]), Some(1.0));
    assert_eq!(
        v("dlq_replay_success_total", &[("target", "orders")]),
        Some(1.0)
    );
    assert_eq!(
        v(
            "dlq_replay_failure_total",
            &[("target", "orders"), ("reason", "permanent")]
        ),
        Some(1.0)
    );
    // Closed: o1 replayed, b resolved (the erased one was never closed).
    assert_eq!(v("dlq_age_seconds_count", &[]), Some(2.0));
    assert_eq!(v("dlq_expired_total", &[("reason", "erasure")]), Some(1.0));
    // Depth by partition and status, from the kept totals.
    assert_eq!(
        v(
            "dlq_depth",
            &[("partition", "orders"), ("status", "replayed")]
        ),
        Some(1.0)
    );
    let depth: Vec<_> = x.iter().filter(|(n, _, _)| n == "dlq_depth").collect();
    assert_eq!(
        v(
            "dlq_depth",
            &[("partition", "orders"), ("status", "review")]
        ),
        Some(1.0),
        "{depth:?}"
    );
    assert_eq!(
        v(
            "dlq_depth",
            &[("partition", "orders"), ("status", "replay_failed")]
        ),
        Some(1.0)
    );
    assert_eq!(
        v(
            "dlq_depth",
            &[("partition", "billing"), ("status", "resolved")]
        ),
        Some(1.0)
    );
    assert!(
        !x.iter()
            .any(|(n, l, _)| n == "dlq_depth" && l["partition"] == "misc"),
        "the erased partition's record is gone from depth"
    );
    assert!(v("dlq_oldest_open_age_seconds", &[("partition", "orders")]).unwrap() >= 0.0);
    assert_eq!(
        v("dlq_oldest_open_age_seconds", &[("partition", "billing")]),
        None,
        "nothing open"
    );
    assert_eq!(v("dlq_retry_scheduled", &[]), Some(0.0));
    assert_eq!(v("dlq_breaker_state", &[("target", "orders")]), Some(0.0));
    assert_eq!(
        v(
            "dlq_http_requests_total",
            &[
                ("method", "POST"),
                ("route", "/v1/dead-letters"),
                ("status", "201")
            ]
        ),
        Some(5.0)
    );
    assert_eq!(
        v(
            "dlq_http_requests_total",
            &[
                ("method", "POST"),
                ("route", "/v1/dead-letters"),
                ("status", "200")
            ]
        ),
        Some(1.0),
        "the repeat"
    );
    assert!(
        x.iter().all(|(n, l, _)| !n.starts_with("dlq_http")
            || !l["route"]
                .replace("/v1/", "")
                .contains(|c: char| c.is_ascii_digit())),
        "routes are the matched pattern, never a raw path with an id"
    );
    assert!(v("dlq_writer_batch_size_count", &[]).unwrap() >= 1.0);
    assert!(v("dlq_writer_commit_seconds_count", &[]).unwrap() >= 1.0);
}

#[test]
fn metrics_are_open_unless_the_config_asks_for_a_token() {
    let token = "metrics-scraper-token-0123456789";
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    let tokens =
        format!("[[auth.tokens]]\nname = \"prom\"\nrole = \"ingest\"\nsha256 = \"{digest}\"\n");
    let open = Server::start_with(&tokens);
    assert_eq!(open.get("/metrics").status, 200);
    assert_eq!(
        open.get("/v1/dead-letters").status,
        401,
        "the API still needs a token"
    );
    let closed = Server::start_with(&format!("{tokens}[metrics]\nrequire_token = true\n"));
    assert_eq!(closed.get("/metrics").status, 401);
    let r = closed
        .client
        .get(closed.url("/metrics"))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
}

#[test]
fn stats_over_http_and_as_a_cli_dashboard() {
    let s = Server::start_with("[metrics]\nmoney_partitions = [\"billing\"]\n");
    for (n, p) in [(1, "billing"), (2, "billing"), (3, "ops")] {
        let r = s.post(
            "/v1/dead-letters",
            json!({"partition": p, "payload": {"n": n}, "workflow": {"id": "wf-9", "name": "Invoices"},
                   "error": {"message": "upstream answered 503", "status": 503}})
            .to_string(),
        );
        assert_eq!(r.status, 201, "{}", r.text);
    }
    let api = s.get("/v1/stats").json;
    assert_eq!(
        (api["total"].as_i64(), api["open"].as_i64()),
        (Some(3), Some(3))
    );
    assert_eq!(api["new_last_hour"], 3);
    assert_eq!(api["business_loss_risk"], 2);
    assert_eq!(
        api["ingress_per_hour"][23], 3,
        "{}",
        api["ingress_per_hour"]
    );
    assert_eq!(api["top_workflows"][0]["workflow_name"], "Invoices");
    let o = s.cli(&["stats", "--json"]);
    let cli: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(cli["by_status"], api["by_status"]);
    let config = s.dir.join("deadletter.toml");
    let o = s.cli(&["--config", config.to_str().unwrap(), "stats"]);
    let text = crate::harness::stdout(&o);
    assert!(o.status.success(), "{}", crate::harness::stderr(&o));
    for want in [
        "records               3 (3 open)",
        "ingress / hour (24h)  |",
        "█| max 3",
        "business-loss risk    2 open in money-impacting partitions",
        "Invoices: upstream answered 503",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
}

#[test]
fn a_credential_incident_is_posted_to_the_alert_webhook_without_its_payload() {
    let hook = Target::start(vec![], ok());
    let slack = Target::start(vec![], ok());
    let marker = "PAYLOAD-MARKER-c0ffee";
    let secret = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(secret.path(), "alert-t0ken\n").unwrap();
    for (t, format) in [(&hook, "generic"), (&slack, "slack")] {
        let s = Server::start_with(&format!(
            "[alerts]\nwebhook_url = \"{}\"\nformat = \"{format}\"\nevaluate_every = \"100ms\"\n\
             [alerts.secret_headers]\nX-Alert-Token = {{ file = \"{}\" }}\n",
            t.url,
            secret.path().display()
        ));
        let r = s.post(
            "/v1/dead-letters",
            json!({"payload": {"customer": marker}, "error": {"message": "Unauthorized", "status": 401}})
                .to_string(),
        );
        assert_eq!(r.status, 201, "{}", r.text);
        // Fires, then (no new incident) resolves.
        eventually("firing and resolved", Duration::from_secs(10), || {
            (t.got().len() >= 2).then_some(())
        });
        let x = scrape(&s);
        assert!(
            value(
                &x,
                "dlq_alerts_sent_total",
                &[("rule", "credential-incident")]
            )
            .unwrap()
                >= 1.0
        );
        assert_eq!(value(&x, "dlq_credential_incidents_total", &[]), Some(1.0));
    }
    let got = hook.got();
    let first: serde_json::Value = serde_json::from_str(&got[0].body).unwrap();
    assert_eq!(first["rule"], "credential-incident");
    assert_eq!(first["state"], "firing");
    assert_eq!(first["value"], 1.0);
    assert_eq!(first["source"], "deadletter");
    assert_eq!(got[0].header("x-alert-token"), Some("alert-t0ken"));
    let second: serde_json::Value = serde_json::from_str(&got[1].body).unwrap();
    assert_eq!(
        (second["rule"].as_str(), second["state"].as_str()),
        (Some("credential-incident"), Some("resolved"))
    );
    let text: serde_json::Value = serde_json::from_str(&slack.got()[0].body).unwrap();
    assert!(
        text["text"]
            .as_str()
            .unwrap()
            .contains("deadletter FIRING: credential-incident"),
        "{text}"
    );
    for g in hook.got().iter().chain(slack.got().iter()) {
        assert!(
            !g.body.contains(marker),
            "an alert carried the payload: {}",
            g.body
        );
    }
}

#[test]
fn a_dead_alert_webhook_costs_ingest_nothing() {
    use crate::target::Behave;
    // A webhook that takes each request and never answers, and rules that fire all the time.
    let hook = Target::start(vec![], Behave::Hang(Duration::from_secs(30)));
    let s = Server::start_with(&format!(
        "[alerts]\nwebhook_url = \"{}\"\ntimeout = \"300ms\"\nevaluate_every = \"50ms\"\nthrottle = \"0s\"\n\
         [[alerts.rules]]\nname = \"storm\"\nkind = \"retry_storm\"\nover = 0\nwindow = \"1m\"\n\
         [[alerts.rules]]\nname = \"any-depth\"\nkind = \"depth\"\nover = 0\n",
        hook.url
    ));
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let s = &s;
                scope.spawn(move || {
                    for n in 0..100 {
                        let r = s.post(
                            "/v1/dead-letters",
                            json!({"payload": {"n": n, "w": w}}).to_string(),
                        );
                        assert_eq!(r.status, 201, "{}", r.text);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    });
    // Alerts kept firing and failing (timeouts, and drops once the queue was full) meanwhile.
    eventually("alert sends fail", Duration::from_secs(10), || {
        let x = scrape(&s);
        (value(&x, "dlq_alerts_failed_total", &[("rule", "storm")]).unwrap_or(0.0) >= 1.0)
            .then_some(())
    });
    let x = scrape(&s);
    assert_eq!(
        value(
            &x,
            "dlq_ingress_total",
            &[("partition", "default"), ("failure_class", "unknown")]
        ),
        Some(400.0)
    );
    assert_eq!(s.get("/readyz").status, 200);
}
