//! Ingest as n8n does it: every fixture, Retry On Fail repeats, batches with bad items, and
//! bad input that must get a 4xx JSON error while the server keeps serving.

use serde_json::{json, Value};

use crate::harness::{fixture, Server};

const TRIGGERS: &[&str] = &[
    "error-trigger-body.raw.json",
    "error-trigger-body.dlqHttp500Wf0001.raw.json",
    "error-trigger-body.dlqHttpRefWf0001.raw.json",
];

#[test]
fn every_error_trigger_fixture_ingests_and_reads_back() {
    let s = Server::start();
    let expect = [
        ("dlqMainWf0000001", "1", "Process order", "unknown", None),
        (
            "dlqHttp500Wf0001",
            "4",
            "Call downstream",
            "transient",
            Some(500),
        ),
        (
            "dlqHttpRefWf0001",
            "5",
            "Call downstream",
            "transient",
            None,
        ),
    ];
    for (name, (wf, exec, node, class, status)) in TRIGGERS.iter().zip(expect) {
        let body = fixture(name);
        let r = s.post("/v1/n8n/error-trigger", body.clone());
        assert_eq!(r.status, 201, "{name}: {}", r.text);
        assert_eq!(
            r.json["status"], "retry_scheduled",
            "transient and unknown failures are retried by default"
        );
        assert_eq!(r.json["failure_class"], class, "{name}");
        let id = r.json["id"].as_i64().unwrap();

        let rec = s.get(&format!("/v1/dead-letters/{id}"));
        assert_eq!(rec.status, 200);
        let j = &rec.json;
        assert_eq!(j["workflow_id"], wf);
        assert_eq!(j["execution_id"], exec);
        assert_eq!(j["node_name"], node);
        assert_eq!(j["execution_mode"], "webhook");
        assert_eq!(j["source"], "n8n_error_trigger");
        assert_eq!(
            j["http_status"],
            status.map(Value::from).unwrap_or(Value::Null)
        );
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(j["execution_url"], sent["execution"]["url"]);
        assert_eq!(j["workflow_name"], sent["workflow"]["name"]);
        // The whole error object is kept (these fixtures hold no secrets to redact).
        assert_eq!(j["error"], sent["execution"]["error"], "{name}");
        assert_eq!(j["payload"], Value::Null);
        assert_eq!(j["events"][0]["kind"], "created");
        assert_eq!(j["events"][0]["to_status"], "retry_scheduled");
    }
    let r = s.get("/v1/dead-letters/3");
    assert_eq!(r.json["error_code"], "ECONNREFUSED");
    assert_eq!(r.json["class_rule"], "transient-code");
}

#[test]
fn a_trigger_failure_without_execution_is_captured() {
    let s = Server::start();
    let body = json!({
        "trigger": {"error": {"message": "401 - Unauthorized: the access token has expired",
                              "name": "NodeApiError", "httpCode": "401",
                              "node": {"name": "Gmail Trigger", "type": "n8n-nodes-base.gmailTrigger"}},
                    "mode": "trigger"},
        "workflow": {"id": "wfTrig0000000001", "name": "Mail intake"},
        "someFutureField": {"n8n": "adds things"}
    });
    let r = s.post("/v1/n8n/error-trigger", body.to_string());
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["failure_class"], "auth");
    let rec = s.get(&format!("/v1/dead-letters/{}", r.json["id"]));
    assert_eq!(rec.json["execution_id"], Value::Null);
    assert_eq!(rec.json["execution_mode"], "trigger");
    assert_eq!(rec.json["node_name"], "Gmail Trigger");
    assert_eq!(rec.json["node_type"], "n8n-nodes-base.gmailTrigger");
    assert_eq!(rec.json["http_status"], 401);
}

#[test]
fn the_error_output_item_comes_back_byte_for_byte() {
    let s = Server::start();
    let body = fixture("error-output-item.raw.json");
    let r = s.post("/v1/dead-letters", body.clone());
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["failure_class"], "transient");
    let id = r.json["id"].as_i64().unwrap();

    let sent: Value = serde_json::from_slice(&body).unwrap();
    let raw = s.get(&format!("/v1/dead-letters/{id}/payload"));
    assert_eq!(raw.status, 200);
    // The item's exact bytes, as they stood inside the posted body.
    let text = String::from_utf8(body.clone()).unwrap();
    assert!(
        text.contains(&raw.text),
        "payload bytes differ from what was posted"
    );
    assert_eq!(raw.json, sent["item"]);

    let rec = s.get(&format!("/v1/dead-letters/{id}"));
    assert_eq!(rec.json["payload"], sent["item"]);
    assert_eq!(
        rec.json["payload_info"]["codec"], "zstd-n8n1",
        "a 2 KB item is compressed"
    );
    assert_eq!(rec.json["payload_info"]["size"], raw.text.len());
    assert_eq!(rec.json["error"], sent["item"]["error"]);
    assert_eq!(rec.json["workflow_id"], "dlqErrOutWf00001");
    assert_eq!(rec.json["node_name"], "Call downstream");
    assert_eq!(rec.json["error_code"], "ERR_BAD_RESPONSE");
    assert_eq!(rec.json["http_status"], 500);
}

#[test]
fn envelope_fields_are_kept() {
    let s = Server::start();
    let body = json!({
        "payload": {"orderId": "Z-9", "lines": [1, 2, 3]},
        "error": {"message": "422 - customer email is required", "status": 422},
        "partition": "billing", "idempotency_key": "order-Z-9-v1", "external_event_id": "evt_77",
        "correlation_id": "corr-1", "tenant_id": "acme", "contract_version": "2",
        "business_object_type": "order", "business_object_id": "Z-9",
        "replay_url": "http://127.0.0.1:5678/webhook/orders",
        "workflow": {"id": 42, "name": "Billing"}, "node": "Create invoice", "node_type": "n8n-nodes-base.httpRequest",
        "unknown_extra": true
    });
    let r = s.post("/v1/dead-letters", body.to_string());
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["failure_class"], "validation");
    let j = s.get(&format!("/v1/dead-letters/{}", r.json["id"])).json;
    for (k, v) in [
        ("partition", json!("billing")),
        ("idempotency_key", json!("order-Z-9-v1")),
        ("external_event_id", json!("evt_77")),
        ("correlation_id", json!("corr-1")),
        ("tenant_id", json!("acme")),
        ("contract_version", json!("2")),
        ("business_object_type", json!("order")),
        ("business_object_id", json!("Z-9")),
        ("replay_url", json!("http://127.0.0.1:5678/webhook/orders")),
        ("workflow_id", json!("42")),
        ("node_name", json!("Create invoice")),
        ("http_status", json!(422)),
    ] {
        assert_eq!(j[k], v, "{k}");
    }
    assert_eq!(j["payload"], body["payload"]);
}

#[test]
fn retry_on_fail_repeats_are_one_record() {
    let s = Server::start();
    // n8n's Retry On Fail resends the identical body, with no key, up to 5 times.
    let body = fixture("error-trigger-body.dlqHttp500Wf0001.raw.json");
    let first = s.post("/v1/n8n/error-trigger", body.clone());
    assert_eq!(first.status, 201);
    for n in 2..=5 {
        let r = s.post("/v1/n8n/error-trigger", body.clone());
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json["deduplicated"], true);
        assert_eq!(r.json["id"], first.json["id"]);
        assert_eq!(r.json["occurrences"], n);
    }
    // The same for the error-output envelope, and for the captured Retry On Fail bodies posted
    // as the payload of an envelope that names nothing (deduplicated by the body itself).
    let item = fixture("error-output-item.raw.json");
    let a = s.post("/v1/dead-letters", item.clone());
    let b = s.post("/v1/dead-letters", item);
    assert_eq!((a.status, b.status), (201, 200));
    let capture = String::from_utf8(fixture("retry-on-fail-capture.jsonl")).unwrap();
    let mut ids = Vec::new();
    for line in capture.lines() {
        let sent: Value = serde_json::from_str(line).unwrap();
        let payload: Value = serde_json::from_str(sent["body"].as_str().unwrap()).unwrap();
        let r = s.post(
            "/v1/dead-letters",
            json!({"payload": payload, "error": {"status": 503}}).to_string(),
        );
        assert!(r.status == 201 || r.status == 200, "{}", r.text);
        ids.push(r.json["id"].clone());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");

    let list = s.get("/v1/dead-letters");
    let items = list.json["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{}", list.text);
    let trig = items.iter().find(|i| i["id"] == first.json["id"]).unwrap();
    assert_eq!(trig["occurrences"], 5);
    assert!(trig["last_seen_at"].as_str() >= trig["first_seen_at"].as_str());
    let captured = items.iter().find(|i| i["id"] == ids[0]).unwrap();
    assert_eq!(captured["occurrences"], 3);
}

#[test]
fn the_same_key_in_another_partition_is_another_record() {
    let s = Server::start();
    let a = s.post(
        "/v1/dead-letters",
        r#"{"payload":1,"idempotency_key":"k","partition":"a"}"#,
    );
    let b = s.post(
        "/v1/dead-letters",
        r#"{"payload":2,"idempotency_key":"k","partition":"b"}"#,
    );
    let c = s.post(
        "/v1/dead-letters?partition=a",
        r#"{"payload":3,"idempotency_key":"k"}"#,
    );
    assert_eq!((a.status, b.status, c.status), (201, 201, 200));
    assert_eq!(c.json["id"], a.json["id"]);
    // The Idempotency-Key header works for the Error Trigger endpoint, whose body has no room.
    let r1 = s
        .client
        .post(s.url("/v1/n8n/error-trigger"))
        .header("content-type", "application/json")
        .header("idempotency-key", "hdr-1")
        .body(fixture("error-trigger-body.raw.json"))
        .send()
        .unwrap();
    let r2 = s
        .client
        .post(s.url("/v1/n8n/error-trigger"))
        .header("content-type", "application/json")
        .header("idempotency-key", "hdr-1")
        .body(fixture("error-trigger-body.dlqHttp500Wf0001.raw.json"))
        .send()
        .unwrap();
    assert_eq!((r1.status().as_u16(), r2.status().as_u16()), (201, 200));
}

#[test]
fn a_batch_keeps_its_good_items_and_names_the_bad_ones() {
    let s = Server::start();
    let good = serde_json::from_slice::<Value>(&fixture("error-output-item.raw.json")).unwrap();
    let batch = json!([
        good,
        {"error": "no payload here"},
        {"payload": {"a": 1}, "partition": 7},
        "not an object",
        {"payload": {"b": 2}, "idempotency_key": "batch-k"},
        {"payload": {"b": 3}, "idempotency_key": "batch-k"},
        {"payload": {"c": 4}, "replay_url": "mailto:x"}
    ]);
    let r = s.post("/v1/dead-letters/batch", batch.to_string());
    assert_eq!(r.status, 200, "{}", r.text);
    let res = r.json["results"].as_array().unwrap();
    let kinds: Vec<&str> = res.iter().map(|x| x["result"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "created",
            "rejected",
            "rejected",
            "rejected",
            "created",
            "deduplicated",
            "rejected"
        ]
    );
    assert_eq!(
        (
            r.json["created"].as_i64(),
            r.json["deduplicated"].as_i64(),
            r.json["rejected"].as_i64()
        ),
        (Some(2), Some(1), Some(4))
    );
    assert!(res[1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("payload"));
    assert!(res[2]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`partition`"));
    assert!(res[6]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("replay_url"));
    assert_eq!(res[5]["id"], res[4]["id"]);
    // What was created is really there.
    for i in [0, 4] {
        let id = res[i]["id"].as_i64().unwrap();
        assert_eq!(s.get(&format!("/v1/dead-letters/{id}")).status, 200);
    }
    assert_eq!(
        s.get("/v1/dead-letters").json["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn bad_input_gets_a_4xx_json_error_and_the_server_keeps_serving() {
    let s = Server::start_with("[server]\nbody_limit_bytes = 65536\nbatch_max_items = 10\n");
    let deep = format!(
        "{{\"payload\":{}1{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let deep_trigger = format!(
        "{{\"execution\":{{\"error\":{}{}}}}}",
        "{\"a\":".repeat(10_000),
        "}".repeat(10_000)
    );
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "/v1/dead-letters",
            "application/json",
            b"{\"payload\": ".to_vec(),
            400,
            "malformed_json",
        ),
        (
            "/v1/dead-letters",
            "application/json",
            b"".to_vec(),
            400,
            "malformed_json",
        ),
        (
            "/v1/n8n/error-trigger",
            "application/json",
            b"not json".to_vec(),
            400,
            "malformed_json",
        ),
        (
            "/v1/dead-letters",
            "text/plain",
            br#"{"payload":1}"#.to_vec(),
            415,
            "unsupported_media_type",
        ),
        (
            "/v1/n8n/error-trigger",
            "application/x-www-form-urlencoded",
            b"a=1".to_vec(),
            415,
            "unsupported_media_type",
        ),
        (
            "/v1/dead-letters",
            "application/json",
            vec![b' '; 70_000],
            413,
            "payload_too_large",
        ),
        (
            "/v1/dead-letters",
            "application/json",
            b"{\"payload\":\"\xff\xfe\"}".to_vec(),
            400,
            "malformed_json",
        ),
        (
            "/v1/dead-letters",
            "application/json",
            deep.into_bytes(),
            422,
            "invalid_field",
        ),
        (
            "/v1/n8n/error-trigger",
            "application/json",
            deep_trigger.into_bytes(),
            422,
            "invalid_field",
        ),
        (
            "/v1/dead-letters",
            "application/json",
            br#"{"payload":{},"partition":5}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            "/v1/dead-letters",
            "application/json",
            br#"{"payload":{},"idempotency_key":["x"]}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            "/v1/dead-letters",
            "application/json",
            br#"{"payload":{},"workflow":"wf"}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            "/v1/n8n/error-trigger",
            "application/json",
            br#"{"workflow":{"id":"w"},"execution":"4"}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            "/v1/n8n/error-trigger",
            "application/json",
            br#"{"workflow":{"id":"w"}}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            "/v1/dead-letters/batch",
            "application/json",
            br#"{"payload":1}"#.to_vec(),
            422,
            "invalid_field",
        ),
        (
            "/v1/dead-letters/batch",
            "application/json",
            b"[]".to_vec(),
            422,
            "invalid_field",
        ),
        (
            "/v1/dead-letters/batch",
            "application/json",
            format!("[{}]", ["{\"payload\":1}"; 11].join(",")).into_bytes(),
            413,
            "payload_too_large",
        ),
        (
            "/v1/dead-letters?partition=has%20space",
            "application/json",
            br#"{"payload":1}"#.to_vec(),
            422,
            "invalid_field",
        ),
    ];
    for (path, ct, body, status, code) in cases {
        let preview = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
        let r = s.post_as(path, ct, body);
        assert_eq!(r.status, status, "{path} {preview:?}: {}", r.text);
        assert_eq!(
            r.json["error"]["code"], code,
            "{path} {preview:?}: {}",
            r.text
        );
        assert!(!r.json["error"]["message"].as_str().unwrap_or("").is_empty());
        assert_eq!(
            s.get("/healthz").status,
            200,
            "server stopped serving after {preview:?}"
        );
    }
    // Wrong field types name the field.
    let r = s.post("/v1/dead-letters", r#"{"payload":{},"partition":5}"#);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`partition`"),
        "{}",
        r.text
    );
    let r = s.post("/v1/n8n/error-trigger", r#"{"execution":{"id":{"x":1}}}"#);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`execution.id`"),
        "{}",
        r.text
    );
    // Unknown routes and methods answer JSON too.
    assert_eq!(s.get("/v1/nope").json["error"]["code"], "not_found");
    assert_eq!(
        s.get("/v1/dead-letters/999").json["error"]["code"],
        "not_found"
    );
    assert_eq!(s.get("/v1/dead-letters/abc").status, 404);
    let r = s
        .client
        .delete(s.url("/v1/n8n/error-trigger"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    // And nothing bad was stored; a good one still goes in.
    assert_eq!(
        s.get("/v1/dead-letters").json["items"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    assert_eq!(s.post("/v1/dead-letters", r#"{"payload":1}"#).status, 201);
}
