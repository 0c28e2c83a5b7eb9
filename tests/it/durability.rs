//! "A 201 means committed to disk": kill -9 right after many concurrent 201s loses none.

use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::harness::Server;

#[test]
fn kill_9_right_after_500_concurrent_201s_loses_none() {
    let mut s = Server::start();
    let acked = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for t in 0..32 {
            let (s, acked) = (&s, acked.clone());
            scope.spawn(move || {
                let client = reqwest::blocking::Client::new();
                let mut i = t;
                while i < 500 {
                    let body = json!({
                        "payload": {"orderId": format!("K-{i}"), "pad": "x".repeat(1500)},
                        "idempotency_key": format!("kill9-{i}"),
                        "error": {"message": "503 - busy", "status": 503}
                    });
                    let r = client
                        .post(s.url("/v1/dead-letters"))
                        .header("content-type", "application/json")
                        .body(body.to_string())
                        .send()
                        .unwrap();
                    assert_eq!(r.status().as_u16(), 201);
                    let id = r.json::<serde_json::Value>().unwrap()["id"]
                        .as_i64()
                        .unwrap();
                    acked.lock().unwrap().push((i, id));
                    i += 32;
                }
            });
        }
    });
    // Straight after the last 201: no graceful anything.
    s.kill9();
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), 500);

    let s2 = Server::start_in(&s.dir, "").unwrap();
    let mut seen = std::collections::HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/dead-letters?limit=500&cursor={c}"),
            None => "/v1/dead-letters?limit=500".into(),
        };
        let page = s2.get(&path).json;
        for item in page["items"].as_array().unwrap() {
            seen.insert(item["id"].as_i64().unwrap());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    for (i, id) in &acked {
        assert!(
            seen.contains(id),
            "record {id} (item {i}) was acknowledged but is gone"
        );
        let rec = s2.get(&format!("/v1/dead-letters/{id}")).json;
        assert_eq!(rec["payload"]["orderId"], format!("K-{i}"));
    }
    assert_eq!(seen.len(), 500);
}

#[test]
fn sigterm_stops_cleanly_and_keeps_everything() {
    let mut s = Server::start();
    for i in 0..20 {
        assert_eq!(
            s.post("/v1/dead-letters", json!({"payload": {"i": i}}).to_string())
                .status,
            201
        );
    }
    let (status, log) = s.terminate();
    assert!(status.success(), "exit {status:?}; log:\n{log}");
    assert!(log.contains("shutdown requested"), "{log}");
    let s2 = Server::start_in(&s.dir, "").unwrap();
    assert_eq!(
        s2.get("/v1/dead-letters?limit=100").json["items"]
            .as_array()
            .unwrap()
            .len(),
        20
    );
}
