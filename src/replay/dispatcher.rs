//! One send to a target, and what its answer means.
//!
//! Every send carries `Idempotency-Key` (the record's key, so a repeat after a crash is
//! recognisable downstream), `X-Deadletter-Id`, `X-Deadletter-Attempt` and
//! `X-Deadletter-Replay: true`; a replay with a new key also names the key it supersedes
//! (`X-Deadletter-Supersedes`). 2xx is success; 408, 429, 5xx, timeouts and connection errors
//! are transient (with `Retry-After` honoured); any other status — redirects included: a
//! replayed POST must not silently become a GET elsewhere — is permanent. At most
//! `EXCERPT_BYTES` of the answer are kept, redacted.

use std::time::{Duration, Instant};

use axum::http::{HeaderName, HeaderValue};

use super::target::ResolvedTarget;
use crate::redact::Redactor;

/// How much of a target's answer is kept with the attempt.
pub const EXCERPT_BYTES: usize = 2048;
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Transient,
    Permanent,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Success => "success",
            Verdict::Transient => "transient",
            Verdict::Permanent => "permanent",
        }
    }
}

/// What one send did.
#[derive(Debug, Clone)]
pub struct Sent {
    pub verdict: Verdict,
    pub status: Option<u16>,
    pub latency: Duration,
    pub error: Option<String>,
    pub excerpt: Option<String>,
    pub retry_after: Option<Duration>,
    /// The n8n execution the send started, when the answer names it (`executionId`).
    pub downstream_execution_id: Option<String>,
}

/// One send's inputs.
pub struct Outgoing<'a> {
    pub target: &'a ResolvedTarget,
    pub body: Vec<u8>,
    pub idempotency_key: &'a str,
    pub record_id: i64,
    pub attempt: i64,
    /// The key this send replaces (a replay with a new key), sent as `X-Deadletter-Supersedes`.
    pub supersedes: Option<&'a str>,
}

pub struct Dispatcher {
    http: reqwest::Client,
    redactor: Redactor,
}

impl Dispatcher {
    pub fn new(redactor: Redactor) -> Result<Dispatcher, reqwest::Error> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("deadletter/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Dispatcher { http, redactor })
    }

    pub async fn send(&self, out: Outgoing<'_>) -> Sent {
        let started = Instant::now();
        let s = &out.target.settings;
        let mut req = self
            .http
            .request(
                reqwest::Method::from_bytes(s.method.as_bytes()).unwrap_or(reqwest::Method::POST),
                &out.target.url,
            )
            .timeout(s.timeout)
            .header("content-type", "application/json")
            .header("idempotency-key", out.idempotency_key)
            .header("x-deadletter-id", out.record_id.to_string())
            .header("x-deadletter-attempt", out.attempt.to_string())
            .header("x-deadletter-replay", "true");
        if let Some(old) = out.supersedes {
            req = req.header("x-deadletter-supersedes", old);
        }
        for (k, v) in &s.headers {
            req = req.header(k, v);
        }
        for (k, source) in &s.secret_headers {
            match source.read() {
                Ok(v) => match (
                    HeaderName::from_bytes(k.as_bytes()),
                    HeaderValue::from_str(&v),
                ) {
                    (Ok(name), Ok(mut value)) => {
                        value.set_sensitive(true);
                        req = req.header(name, value);
                    }
                    _ => {
                        return self.refused(
                            started,
                            format!("secret header {k}: not a valid header value"),
                        )
                    }
                },
                Err(e) => return self.refused(started, format!("secret header {k}: {e}")),
            }
        }
        let res = match req.body(out.body).send().await {
            Ok(r) => r,
            Err(e) => {
                let what = if e.is_timeout() {
                    format!("timed out after {:?}", s.timeout)
                } else if e.is_connect() {
                    format!("cannot connect: {}", root_cause(&e))
                } else {
                    format!("request failed: {}", root_cause(&e))
                };
                return Sent {
                    verdict: Verdict::Transient,
                    status: None,
                    latency: started.elapsed(),
                    error: Some(what),
                    excerpt: None,
                    retry_after: None,
                    downstream_execution_id: None,
                };
            }
        };
        let status = res.status().as_u16();
        let retry_after = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let excerpt = self.excerpt(res, s.timeout).await;
        let verdict = match status {
            200..=299 => Verdict::Success,
            408 | 429 | 500..=599 => Verdict::Transient,
            _ => Verdict::Permanent,
        };
        Sent {
            verdict,
            status: Some(status),
            latency: started.elapsed(),
            error: (verdict != Verdict::Success).then(|| format!("the target answered {status}")),
            downstream_execution_id: excerpt.as_deref().and_then(execution_id),
            excerpt,
            retry_after,
        }
    }

    fn refused(&self, started: Instant, why: String) -> Sent {
        Sent {
            verdict: Verdict::Permanent,
            status: None,
            latency: started.elapsed(),
            error: Some(why),
            excerpt: None,
            retry_after: None,
            downstream_execution_id: None,
        }
    }

    /// The first `EXCERPT_BYTES` of the answer, redacted; the rest is not read.
    async fn excerpt(&self, mut res: reqwest::Response, timeout: Duration) -> Option<String> {
        let mut buf = Vec::new();
        let read = async {
            while buf.len() < EXCERPT_BYTES {
                match res.chunk().await {
                    Ok(Some(c)) => buf.extend_from_slice(&c),
                    _ => break,
                }
            }
        };
        let _ = tokio::time::timeout(timeout, read).await;
        if buf.is_empty() {
            return None;
        }
        buf.truncate(EXCERPT_BYTES);
        let text = String::from_utf8_lossy(&buf);
        Some(self.redactor.redact_str(&text).into_owned())
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// An n8n execution id in a target's JSON answer (`executionId`, `execution_id`, or
/// `data.executionId`), as text.
pub fn execution_id(answer: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(answer).ok()?;
    let found = v
        .get("executionId")
        .or_else(|| v.get("execution_id"))
        .or_else(|| v.pointer("/data/executionId"))
        // n8n's retry answers with the new execution itself.
        .or_else(|| v.get("retryOf").and(v.get("id")))?;
    match found {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `Retry-After: 120` or an HTTP date; capped at `MAX_RETRY_AFTER`.
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    let d = if let Ok(secs) = v.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
        (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO)
    };
    Some(d.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_n8n_execution_id_is_found_in_the_answer() {
        assert_eq!(
            execution_id(r#"{"executionId":"77"}"#).as_deref(),
            Some("77")
        );
        assert_eq!(
            execution_id(r#"{"data":{"executionId":12}}"#).as_deref(),
            Some("12")
        );
        assert_eq!(execution_id(r#"{"message":"Workflow was started"}"#), None);
        assert_eq!(execution_id("not json"), None);
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after("999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
