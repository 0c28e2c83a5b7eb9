//! GET /openapi.json documents every route, every reference resolves, and real answers carry
//! no field the document does not describe (so the document cannot drift from the code).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::harness::{fixture, Server};

/// Property names a schema allows, following $ref, allOf, oneOf and anyOf.
fn properties(doc: &Value, schema: &Value, out: &mut BTreeSet<String>) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        let target = &doc["components"]["schemas"][name];
        assert!(!target.is_null(), "unresolved reference {r}");
        return properties(doc, target, out);
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        for s in schema[key].as_array().into_iter().flatten() {
            properties(doc, s, out);
        }
    }
    if let Some(p) = schema["properties"].as_object() {
        out.extend(p.keys().cloned());
    }
}

fn assert_described(doc: &Value, schema: &str, answer: &Value) {
    let mut allowed = BTreeSet::new();
    properties(
        doc,
        &json!({"$ref": format!("#/components/schemas/{schema}")}),
        &mut allowed,
    );
    for key in answer.as_object().unwrap().keys() {
        assert!(
            allowed.contains(key),
            "`{key}` in a {schema} answer is not in the document"
        );
    }
}

fn all_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                out.push(r.to_owned());
            }
            m.values().for_each(|x| all_refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| all_refs(x, out)),
        _ => {}
    }
}

#[test]
fn the_openapi_document_covers_every_route_and_matches_real_answers() {
    let s = Server::start();
    let doc = s.get("/openapi.json").json;
    assert_eq!(doc["openapi"], "3.1.0");
    let paths: BTreeSet<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    for p in [
        "/v1/n8n/error-trigger",
        "/v1/dead-letters",
        "/v1/dead-letters/batch",
        "/v1/dead-letters/{id}",
        "/v1/dead-letters/{id}/payload",
        "/v1/groups",
        "/v1/groups/{fingerprint}/actions",
        "/v1/targets",
        "/v1/replays",
        "/v1/replays/{id}",
        "/v1/replays/{id}/{action}",
        "/healthz",
        "/readyz",
    ] {
        assert!(paths.contains(p), "{p} is not documented");
    }
    assert!(doc["paths"]["/v1/dead-letters/{id}"]["patch"].is_object());
    assert!(
        doc["paths"]["/v1/dead-letters"]["post"].is_object()
            && doc["paths"]["/v1/dead-letters"]["get"].is_object()
    );
    let mut refs = Vec::new();
    all_refs(&doc, &mut refs);
    for r in &refs {
        let name = r.trim_start_matches("#/components/schemas/");
        assert!(
            !doc["components"]["schemas"][name].is_null(),
            "unresolved {r}"
        );
    }
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());

    // Real answers against their schemas.
    let created = s.post("/v1/dead-letters", fixture("error-output-item.raw.json"));
    assert_described(&doc, "IngestAnswer", &created.json);
    let dedup = s.post("/v1/dead-letters", fixture("error-output-item.raw.json"));
    assert_described(&doc, "IngestAnswer", &dedup.json);
    let id = created.json["id"].as_i64().unwrap();
    assert_eq!(
        s.patch(id, json!({"note": "x", "payload": {"a": 1}}), "t", Some(1))
            .status,
        200
    );
    let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
    assert_described(&doc, "RecordDetail", &rec);
    assert_described(
        &doc,
        "FailureFacts",
        &json!({"workflow_id": rec["workflow_id"]}),
    );
    assert_described(&doc, "EventView", &rec["events"][0]);
    assert_described(&doc, "DocumentView", &rec["payload_versions"][0]);
    let list = s.get("/v1/dead-letters").json;
    assert_described(&doc, "ListPage", &list);
    assert_described(&doc, "RecordSummary", &list["items"][0]);
    let batch = s.post("/v1/dead-letters/batch", r#"[{"payload":1},{"x":1}]"#);
    assert_described(&doc, "BatchAnswer", &batch.json);
    for r in batch.json["results"].as_array().unwrap() {
        assert_described(&doc, "BatchResult", r);
    }
    let groups = s.get("/v1/groups").json;
    assert_described(&doc, "Groups", &groups);
    assert_described(&doc, "GroupSummary", &groups["groups"][0]);
    let err = s.get("/v1/dead-letters/999").json;
    assert_described(&doc, "ErrorBody", &err);
    assert_described(&doc, "ErrorDetail", &err["error"]);
    let dry = s
        .client
        .post(s.url("/v1/replays"))
        .header("content-type", "application/json")
        .body(json!({"ids": [id], "dry_run": true}).to_string())
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap();
    assert_described(&doc, "DryRun", &dry);
    let job = s
        .client
        .post(s.url("/v1/replays"))
        .header("content-type", "application/json")
        .body(json!({"ids": [id]}).to_string())
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap();
    assert_described(&doc, "Job", &job);
    assert_described(&doc, "JobCounts", &job["counts"]);
    assert_described(&doc, "JobItemView", &job["items"][0]);
    assert_described(&doc, "Targets", &s.get("/v1/targets").json);
    assert_described(&doc, "Health", &s.get("/readyz").json);
}
