//! Reading: filters and cursor pagination that stays stable while inserts happen.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Value};

use crate::harness::{fixture, Server};

fn ids(page: &Value) -> Vec<i64> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_i64().unwrap())
        .collect()
}

#[test]
fn pagination_is_stable_while_inserts_happen() {
    let s = Server::start();
    let batch: Vec<Value> = (0..120)
        .map(|i| json!({"payload": {"n": i}, "idempotency_key": format!("p-{i}")}))
        .collect();
    assert_eq!(
        s.post("/v1/dead-letters/batch", Value::from(batch).to_string())
            .json["created"],
        120
    );
    let before: HashSet<i64> = (1..=120).collect();

    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let inserter = scope.spawn(|| {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = s.post(
                    "/v1/dead-letters",
                    json!({"payload": {"late": n}, "idempotency_key": format!("late-{n}")})
                        .to_string(),
                );
                assert_eq!(r.status, 201);
                n += 1;
            }
            n
        });
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let path = match &cursor {
                Some(c) => format!("/v1/dead-letters?limit=7&cursor={c}"),
                None => "/v1/dead-letters?limit=7".into(),
            };
            let page = s.get(&path).json;
            seen.extend(ids(&page));
            pages += 1;
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        stop.store(true, Ordering::Relaxed);
        let inserted = inserter.join().unwrap();
        assert!(inserted > 0, "no insert ran during paging");
        assert!(pages >= 18);
        let unique: HashSet<i64> = seen.iter().copied().collect();
        assert_eq!(unique.len(), seen.len(), "a record appeared on two pages");
        assert!(
            before.is_subset(&unique),
            "a record present before paging was skipped"
        );
        assert!(seen.windows(2).all(|w| w[0] > w[1]), "not newest first");
    });
}

#[test]
fn filters_narrow_the_list() {
    let s = Server::start();
    for f in [
        "error-trigger-body.raw.json",
        "error-trigger-body.dlqHttp500Wf0001.raw.json",
        "error-trigger-body.dlqHttpRefWf0001.raw.json",
    ] {
        assert_eq!(s.post("/v1/n8n/error-trigger", fixture(f)).status, 201);
    }
    assert_eq!(s.post("/v1/dead-letters", r#"{"payload":{"a":1},"partition":"billing","error":{"message":"Customer already exists","status":409}}"#).status, 201);

    let q = |query: &str| -> Vec<i64> {
        let r = s.get(&format!("/v1/dead-letters?{query}"));
        assert_eq!(r.status, 200, "{query}: {}", r.text);
        ids(&r.json)
    };
    assert_eq!(q("failure_class=transient"), vec![3, 2]);
    assert_eq!(q("failure_class=conflict"), vec![4]);
    assert_eq!(q("partition=billing"), vec![4]);
    assert_eq!(q("partition=default"), vec![3, 2, 1]);
    assert_eq!(q("workflow=dlqMainWf0000001"), vec![1]);
    assert_eq!(q("workflow=Orders%20via%20HTTP%20500%20(fails)"), vec![2]);
    assert_eq!(q("status=retry_scheduled"), vec![3, 2, 1]);
    assert_eq!(q("status=review"), vec![4], "conflicts wait for a person");
    assert_eq!(q("status=resolved"), Vec::<i64>::new());
    assert_eq!(q("q=REFUSED"), vec![3]);
    assert_eq!(q("q=100%25"), Vec::<i64>::new());
    assert_eq!(q("since=2000-01-01&until=2999-01-01").len(), 4);
    assert_eq!(q("since=2999-01-01T00:00:00Z"), Vec::<i64>::new());
    let fp = s.get("/v1/dead-letters/2").json["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(q(&format!("fingerprint={fp}")), vec![2]);
    assert_eq!(q("limit=2"), vec![4, 3]);

    for (query, field) in [
        ("status=nope", "status"),
        ("failure_class=sad", "failure_class"),
        ("since=yesterday", "since"),
        ("limit=0", "limit"),
        ("limit=100000", "limit"),
        ("fingerprint=xyz", "fingerprint"),
        ("cursor=abc", "cursor"),
    ] {
        let r = s.get(&format!("/v1/dead-letters?{query}"));
        assert_eq!(r.status, 422, "{query}: {}", r.text);
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("`{field}`")),
            "{}",
            r.text
        );
    }
}

#[test]
fn health_and_readiness_answer() {
    let s = Server::start();
    assert_eq!(s.get("/healthz").json["status"], "ok");
    let r = s.get("/readyz");
    assert_eq!(r.status, 200);
    assert_eq!(r.json["checks"]["writer"], true);
    assert_eq!(r.json["checks"]["database"], true);
}
