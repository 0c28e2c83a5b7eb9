//! Secrets planted in every place n8n puts them never reach the database file or the logs.

use serde_json::json;

use crate::harness::Server;

const SECRETS: &[&str] = &[
    "sk_live_HEADER_0001",
    "COOKIE_SECRET_0002",
    "QUERY_APIKEY_0003",
    "BODY_PASSWORD_0004",
    "NODE_PARAM_0005",
    "JSONBODY_SECRET_0006",
    "CURL_BEARER_0007",
    "URL_PASS_0008",
    "PAYLOAD_TOKEN_0009",
    "MESSAGE_BEARER_0010",
    "REFRESH_0011",
    "XAPIKEY_0012",
];

fn grep_dir(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in walk(dir) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            hits.push(entry.display().to_string());
        }
    }
    hits
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.file_name().is_some_and(|n| n != "deadletter.toml") {
            out.push(p);
        }
    }
    out
}

#[test]
fn planted_secrets_reach_neither_the_database_nor_the_logs() {
    let mut s = Server::start_with("[logging]\nlevel = \"trace\"\n");
    let trigger = json!({
        "execution": {
            "id": "77", "url": "http://127.0.0.1:5678/workflow/w/executions/77", "mode": "webhook",
            "lastNodeExecuted": "Call API",
            "error": {
                "name": "NodeApiError", "httpCode": "401",
                "message": "Authorization failed - Bearer MESSAGE_BEARER_0010 was refused",
                "context": {"request": {
                    "headers": {"Authorization": "Bearer sk_live_HEADER_0001", "Cookie": "sid=COOKIE_SECRET_0002",
                                "X-API-KEY": "XAPIKEY_0012", "accept": "application/json"},
                    "uri": "https://api.example.test/v1/orders?api_key=QUERY_APIKEY_0003&page=1",
                    "body": {"user": "bob", "password": "BODY_PASSWORD_0004"},
                    "method": "POST"}},
                "node": {"name": "Call API", "type": "n8n-nodes-base.httpRequest", "parameters": {
                    "headerParameters": {"parameters": [{"name": "Authorization", "value": "NODE_PARAM_0005"}]},
                    "jsonBody": "{\"client_secret\": \"JSONBODY_SECRET_0006\"}",
                    "curlImport": "curl -H 'Authorization: Bearer CURL_BEARER_0007' https://admin:URL_PASS_0008@api.example.test/"
                }}
            }
        },
        "workflow": {"id": "wfSecret00000001", "name": "Secrets"}
    });
    let r = s.post("/v1/n8n/error-trigger", trigger.to_string());
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json["failure_class"], "auth");

    let envelope = json!({
        "item": {"headers": {"authorization": "Bearer sk_live_HEADER_0001", "cookie": "COOKIE_SECRET_0002",
                             "x-api-key": "XAPIKEY_0012"},
                 "body": {"orderId": "S-1", "auth": {"refresh_token": "REFRESH_0011", "token": "PAYLOAD_TOKEN_0009"}},
                 "webhookUrl": "http://127.0.0.1:5678/webhook/orders"},
        "error": {"message": "401 - token PAYLOAD_TOKEN_0009 expired", "status": 401},
        "replay_url": "https://admin:URL_PASS_0008@127.0.0.1:5678/webhook/orders",
        "workflow": {"id": "wfSecret00000002"}
    });
    let r = s.post("/v1/dead-letters", envelope.to_string());
    assert_eq!(r.status, 201, "{}", r.text);
    let id = r.json["id"].as_i64().unwrap();

    // What can be read back is redacted but otherwise intact.
    let rec = s.get(&format!("/v1/dead-letters/{id}")).json;
    assert_eq!(rec["payload"]["headers"]["authorization"], "[REDACTED]");
    assert_eq!(rec["payload"]["body"]["orderId"], "S-1");
    assert!(rec["replay_url"]
        .as_str()
        .unwrap()
        .contains("admin:[REDACTED]@"));
    let rec1 = s.get("/v1/dead-letters/1").json;
    assert_eq!(
        rec1["error"]["context"]["request"]["headers"]["accept"],
        "application/json"
    );
    assert!(rec1["error"]["context"]["request"]["uri"]
        .as_str()
        .unwrap()
        .contains("page=1"));

    let check = |when: &str, s: &Server| {
        for secret in SECRETS {
            let hits = grep_dir(&s.dir, secret);
            assert!(hits.is_empty(), "{when}: {secret} found in {hits:?}");
        }
    };
    check("while running", &s);
    let (status, log) = s.terminate();
    assert!(status.success());
    check("after shutdown", &s);
    for secret in SECRETS {
        assert!(!log.contains(secret), "{secret} in stderr log");
    }
    assert!(
        !grep_dir(&s.dir.join("logs"), "ingested").is_empty(),
        "the log file was written"
    );
}
