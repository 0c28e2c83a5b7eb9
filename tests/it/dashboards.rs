//! The Grafana dashboard and the Prometheus alerting rules in packaging/ use only series that
//! a real deadletter exposes, and promtool accepts the rules.

use std::collections::BTreeSet;
use std::path::Path;

use std::time::Duration;

use serde_json::json;

use crate::harness::Server;
use crate::target::{ok, status, Target};

/// Every series name in an exposition: counters with `_total`, histograms with `_bucket`,
/// `_sum`, `_count`, gauges as they are. (A family with no series yet is left out of the text,
/// so the server under test is made to do a bit of everything first.)
fn exposed(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// A server that has ingested, deduplicated, retried (one send accepted, then failures that
/// open the target's breaker and pause its drain), erased, and fired, held back and failed
/// alerts.
fn busy_server() -> (Server, Target, Target) {
    let target = Target::start(vec![ok()], status(503));
    let hook = Target::start(vec![ok()], status(500));
    let s = Server::start_with(&format!(
        "[delivery]\ntick = \"50ms\"\nrate_initial = 100.0\nrate_max = 100.0\nbreaker_failures = 1\n\
         [policy.transient]\nretry_base = \"50ms\"\nretry_cap = \"100ms\"\nmax_attempts = 50\n\
         [triage]\npoison_threshold = 1000\n\
         [[targets]]\nname = \"t\"\nurl = \"{}\"\npartitions = [\"default\"]\n\
         [alerts]\nwebhook_url = \"{}\"\nevaluate_every = \"50ms\"\ninclude_defaults = false\n\
         [[alerts.rules]]\nname = \"held\"\nkind = \"depth\"\nover = 0\n\
         [[alerts.rules]]\nname = \"loud\"\nkind = \"retry_storm\"\nover = 0\nthrottle = \"0s\"\n",
        target.url, hook.url
    ));
    for n in 0..6 {
        let body = json!({"payload": {"n": n}, "idempotency_key": format!("k{n}"),
                          "error": {"message": "upstream answered 503", "status": 503}});
        assert_eq!(s.post("/v1/dead-letters", body.to_string()).status, 201);
    }
    let again = json!({"payload": {"n": 0}, "idempotency_key": "k0", "error": {"status": 503}});
    s.post("/v1/dead-letters", again.to_string());
    let r = s.post(
        "/v1/dead-letters",
        json!({"payload": {"n": 9}, "tenant_id": "gone", "error": {"status": 401}}).to_string(),
    );
    assert_eq!(r.status, 201);
    let del = s
        .client
        .delete(s.url("/v1/dead-letters?tenant_id=gone"))
        .send()
        .unwrap();
    assert_eq!(del.status().as_u16(), 200);
    (s, target, hook)
}

/// `dlq_…` identifiers in a PromQL expression.
fn used(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("dlq_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        out.push(expr[start..end].to_owned());
        i = end;
    }
    out
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_dashboard_and_the_rules_use_only_series_deadletter_exposes() {
    let dash: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("packaging/grafana/deadletter.json")).unwrap(),
    )
    .unwrap();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 12, "{} panels", panels.len());
    let mut needed = BTreeSet::new();
    for p in panels {
        assert!(p["datasource"]["uid"] == "${datasource}", "{p}");
        for t in p["targets"].as_array().unwrap() {
            needed.extend(used(t["expr"].as_str().unwrap()));
        }
    }
    for must in [
        "dlq_depth",
        "dlq_ingress_total",
        "dlq_age_seconds_bucket",
        "dlq_replay_failure_total",
        "dlq_expired_total",
        "dlq_breaker_state",
    ] {
        assert!(needed.contains(must), "the dashboard shows no {must}");
    }
    let rules =
        std::fs::read_to_string(root().join("packaging/prometheus/deadletter-rules.yml")).unwrap();
    needed.extend(used(&rules));

    let (s, _target, _hook) = busy_server();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let have = exposed(&s.get("/metrics").text);
        let missing: Vec<&String> = needed.iter().filter(|n| !have.contains(*n)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "used but never exposed: {missing:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_committed_dashboard_is_what_its_script_writes() {
    // Regenerating it gives the committed file.
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("make-dashboard.py");
    std::fs::copy(root().join("packaging/grafana/make-dashboard.py"), &script).unwrap();
    let st = std::process::Command::new("python3")
        .arg(&script)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("deadletter.json")).unwrap(),
        std::fs::read_to_string(root().join("packaging/grafana/deadletter.json")).unwrap(),
        "deadletter.json is stale: run python3 packaging/grafana/make-dashboard.py"
    );
}

#[test]
fn the_prometheus_rules_pass_promtool() {
    let rules = root().join("packaging/prometheus/deadletter-rules.yml");
    let o = std::process::Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules)
        .output()
        .expect("promtool (Debian's prometheus package; .ci/run installs it)");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&rules).unwrap();
    assert!(used(&text).len() >= 6);
    for alert in [
        "CredentialIncident",
        "OldestOpenOverSla",
        "Backlog",
        "ReplaySuccessLow",
        "RetryStorm",
    ] {
        assert!(
            text.contains(&format!("alert: Deadletter{alert}")),
            "{alert} missing"
        );
    }
}
