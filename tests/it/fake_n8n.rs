//! A fake n8n public API for the connector tests: `GET /api/v1/executions/{id}` answers with
//! the execution captured from a real n8n 2.8.4 (its id set to the one asked for, and a secret
//! planted in the webhook item's headers), 404 for id `404` (pruned), 401 for a wrong
//! `X-N8N-API-KEY`, and slowly for id `slow`. It records what it was asked.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const KEY: &str = "n8n-api-key-for-tests";
pub const PLANTED: &str = "Bearer planted-n8n-secret-5f2c";

pub struct FakeN8n {
    pub url: String,
    asked: Arc<Mutex<Vec<String>>>,
}

/// Failed executions the list endpoint pages through (newest first), two per page.
pub type Failed = Vec<(u64, &'static str)>;

impl FakeN8n {
    pub fn start() -> FakeN8n {
        FakeN8n::with_failed(Vec::new())
    }

    pub fn with_failed(failed: Failed) -> FakeN8n {
        FakeN8n::serving(failed, None)
    }

    /// With the webhook item's `webhookUrl` pointing at `webhook` (a test target).
    pub fn serving(failed: Failed, webhook: Option<String>) -> FakeN8n {
        let failed = Arc::new(failed);
        let webhook = Arc::new(webhook);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let log = asked.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let log = log.clone();
                let failed = failed.clone();
                let webhook = webhook.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_err() {
                        return;
                    }
                    let method = line.split_whitespace().next().unwrap_or("").to_owned();
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let mut key = None;
                    let mut length = 0usize;
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("x-n8n-api-key") {
                                key = Some(v.trim().to_owned());
                            }
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body_in = vec![0u8; length];
                    let _ = std::io::Read::read_exact(&mut reader, &mut body_in);
                    if method == "POST" {
                        log.lock()
                            .unwrap()
                            .push(format!("POST {path} {}", String::from_utf8_lossy(&body_in)));
                    } else {
                        log.lock().unwrap().push(path.clone());
                    }
                    let id = path
                        .strip_prefix("/api/v1/executions/")
                        .and_then(|r| r.split('?').next())
                        .unwrap_or("");
                    let (status, body) = if key.as_deref() != Some(KEY) {
                        (401, r#"{"message":"unauthorized"}"#.to_string())
                    } else if let Some(query) = path.strip_prefix("/api/v1/executions?") {
                        assert!(query.contains("status=error"), "{query}");
                        let page: usize = query
                            .split('&')
                            .find_map(|kv| kv.strip_prefix("cursor=p"))
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(0);
                        let data: Vec<serde_json::Value> = failed
                            .iter()
                            .skip(page * 2)
                            .take(2)
                            .map(|(id, wf)| {
                                serde_json::json!({"id": id.to_string(), "status": "error", "mode": "webhook",
                                                   "workflowId": wf, "finished": false})
                            })
                            .collect();
                        let next =
                            (failed.len() > (page + 1) * 2).then(|| format!("p{}", page + 1));
                        (
                            200,
                            serde_json::json!({"data": data, "nextCursor": next}).to_string(),
                        )
                    } else if let Some(retried) = id.strip_suffix("/retry") {
                        (
                            200,
                            serde_json::json!({"id": "555", "retryOf": retried, "status": "success",
                                               "mode": "retry", "finished": true})
                            .to_string(),
                        )
                    } else if id == "404" {
                        (404, r#"{"message":"Not Found"}"#.to_string())
                    } else {
                        if id == "slow" {
                            std::thread::sleep(Duration::from_secs(3));
                        }
                        let mut exec: serde_json::Value = serde_json::from_str(include_str!(
                            "../fixtures/n8n/public-api-execution.json"
                        ))
                        .unwrap();
                        exec["id"] = serde_json::json!(id);
                        if let Some((_, wf)) = failed.iter().find(|(f, _)| f.to_string() == id) {
                            exec["workflowId"] = serde_json::json!(wf);
                            exec["workflowData"]["id"] = serde_json::json!(wf);
                        }
                        exec["data"]["resultData"]["runData"]["Webhook"][0]["data"]["main"][0][0]
                            ["json"]["headers"]["authorization"] = serde_json::json!(PLANTED);
                        if let Some(w) = webhook.as_ref() {
                            exec["data"]["resultData"]["runData"]["Webhook"][0]["data"]["main"]
                                [0][0]["json"]["webhookUrl"] = serde_json::json!(w);
                        }
                        (200, exec.to_string())
                    };
                    let reason = match status {
                        200 => "OK",
                        401 => "Unauthorized",
                        _ => "Not Found",
                    };
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        FakeN8n { url, asked }
    }

    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}
