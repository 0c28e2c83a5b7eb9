//! The HTTP client the operator verbs use: they change records, so they go through the running
//! server and its single writer (reads go straight to the file). Errors carry the server's
//! `{"error":{"code","message"}}`.

use std::time::Duration;

use anyhow::{anyhow, Context};
use serde_json::Value;

use crate::config::Config;

pub struct Client {
    base: String,
    actor: String,
    token: Option<String>,
    http: reqwest::blocking::Client,
}

/// The server's refusal of one request.
#[derive(Debug)]
pub struct Refusal {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} {})", self.message, self.status, self.code)
    }
}

impl std::error::Error for Refusal {}

impl Client {
    /// `server`, `actor` and `token_file` as the global flags give them.
    pub fn new(
        server: Option<&str>,
        actor: Option<&str>,
        token_file: Option<&std::path::Path>,
        config: &Config,
    ) -> anyhow::Result<Client> {
        let token = match token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading the token file {}", p.display()))?
                    .trim()
                    .to_owned(),
            ),
            None => std::env::var("DEADLETTER_TOKEN")
                .ok()
                .filter(|t| !t.is_empty()),
        };
        let base = match server {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!("http://{}", config.server.listen),
        };
        let actor = actor
            .map(str::to_owned)
            .or_else(|| std::env::var("USER").ok())
            .or_else(|| std::env::var("USERNAME").ok())
            .unwrap_or_else(|| "cli".into());
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        Ok(Client {
            base,
            actor,
            token,
            http,
        })
    }

    fn send(
        &self,
        req: reqwest::blocking::RequestBuilder,
    ) -> anyhow::Result<Result<(Value, Option<String>), Refusal>> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let res = req
            .header("x-deadletter-actor", &self.actor)
            .send()
            .with_context(|| {
                format!(
                    "cannot reach the deadletter server at {} (is `deadletter serve` running?)",
                    self.base
                )
            })?;
        let status = res.status().as_u16();
        let etag = res
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim_matches('"').to_owned());
        let body: Value = res.json().unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(Ok((body, etag)));
        }
        Ok(Err(Refusal {
            status,
            code: body["error"]["code"].as_str().unwrap_or("error").to_owned(),
            message: body["error"]["message"]
                .as_str()
                .unwrap_or("the server refused")
                .to_owned(),
        }))
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Result<(Value, Option<String>), Refusal>> {
        self.send(self.http.get(format!("{}{path}", self.base)))
    }

    pub fn post(&self, path: &str, body: Option<&Value>) -> anyhow::Result<Result<Value, Refusal>> {
        let mut req = self.http.post(format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(b);
        }
        Ok(self.send(req)?.map(|(v, _)| v))
    }

    pub fn delete(&self, path_and_query: &str) -> anyhow::Result<Result<Value, Refusal>> {
        Ok(self
            .send(self.http.delete(format!("{}{path_and_query}", self.base)))?
            .map(|(v, _)| v))
    }

    pub fn patch(
        &self,
        id: &str,
        body: &Value,
        if_match: Option<&str>,
    ) -> anyhow::Result<Result<Value, Refusal>> {
        let mut req = self
            .http
            .patch(format!("{}/v1/dead-letters/{id}", self.base))
            .json(body);
        if let Some(v) = if_match {
            req = req.header("if-match", format!("\"{v}\""));
        }
        Ok(self.send(req)?.map(|(v, _)| v))
    }
}

/// Apply one PATCH body to several ids; print a line (or a JSON result) per id; fail if any
/// was refused.
pub fn each(
    client: &Client,
    ids: &[String],
    body: &Value,
    json: bool,
    done: &str,
) -> anyhow::Result<()> {
    let mut results = Vec::new();
    let mut failed = 0;
    for id in ids {
        match client.patch(id, body, None)? {
            Ok(rec) => {
                if !json {
                    super::emit(&format!(
                        "{id}: {done} (now {})\n",
                        rec["status"].as_str().unwrap_or("?")
                    ))?;
                }
                results.push(serde_json::json!({"id": id, "ok": true, "record": rec}));
            }
            Err(r) => {
                failed += 1;
                if !json {
                    super::emit(&format!("{id}: refused: {r}\n"))?;
                }
                results.push(serde_json::json!({"id": id, "ok": false, "error": {"code": r.code, "message": r.message}}));
            }
        }
    }
    if json {
        super::emit(&(serde_json::to_string_pretty(&results)? + "\n"))?;
    }
    if failed > 0 {
        return Err(anyhow!("{failed} of {} refused", ids.len()));
    }
    Ok(())
}
