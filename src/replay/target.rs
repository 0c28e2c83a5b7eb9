//! Which target a record goes back to.

use serde_json::Value;

use crate::config::{Config, TargetConfig, TargetSettings};
use crate::model::delivery::is_webhook_item;
use crate::store::RecordSummary;

/// A target chosen for one record.
#[derive(Debug, Clone)]
pub struct ResolvedTarget {
    /// The configured target's name, `replay_url`, or `payload_webhook`: the key of its rate
    /// limiter and breaker together with the URL's host.
    pub name: String,
    pub url: String,
    pub settings: TargetSettings,
}

/// The configured targets and the rules for choosing among them.
#[derive(Debug, Clone)]
pub struct Targets {
    targets: Vec<TargetConfig>,
    defaults: TargetSettings,
    use_payload_webhook_url: bool,
    /// n8n connector: an Error Trigger record whose payload is a webhook item (from n8n's API)
    /// goes back to that webhook by default.
    n8n_webhook: bool,
    /// n8n connector: n8n's retry of the execution, for an Error Trigger record without one.
    n8n_retry: Option<N8nRetry>,
}

#[derive(Debug, Clone)]
struct N8nRetry {
    base_url: String,
    key: crate::config::SecretSource,
    load_workflow: bool,
}

impl Targets {
    pub fn new(config: &Config) -> Targets {
        Targets {
            targets: config.targets.clone(),
            defaults: config.delivery.defaults.clone(),
            use_payload_webhook_url: config.delivery.use_payload_webhook_url,
            n8n_webhook: config.n8n.replay_to_webhook,
            n8n_retry: config
                .n8n
                .api_key
                .clone()
                .filter(|_| config.n8n.replay_with_retry)
                .map(|key| N8nRetry {
                    base_url: config.n8n.base_url.clone(),
                    key,
                    load_workflow: config.n8n.retry_load_workflow,
                }),
        }
    }

    /// The record's own replay_url first, then the first configured target whose partitions
    /// or workflows (id or name) match, then the webhook the item came from — by default for
    /// an Error Trigger record whose payload is n8n's webhook item (`n8n.replay_to_webhook`),
    /// for any record with `delivery.use_payload_webhook_url`.
    pub fn resolve(&self, rec: &RecordSummary, payload: Option<&Value>) -> Option<ResolvedTarget> {
        if let Some(url) = &rec.facts.replay_url {
            return Some(ResolvedTarget {
                name: format!("replay_url {}", host(url)),
                url: url.clone(),
                settings: self.defaults.clone(),
            });
        }
        let wf = |w: &String| {
            Some(w) == rec.facts.workflow_id.as_ref() || Some(w) == rec.facts.workflow_name.as_ref()
        };
        if let Some(t) = self
            .targets
            .iter()
            .find(|t| t.partitions.contains(&rec.partition) || t.workflows.iter().any(wf))
        {
            return Some(ResolvedTarget {
                name: t.name.clone(),
                url: t.url.clone(),
                settings: t.settings.clone(),
            });
        }
        let from_error_trigger =
            self.n8n_webhook && rec.source == crate::model::Source::ErrorTrigger.as_str();
        if self.use_payload_webhook_url || from_error_trigger {
            if let Some(url) = payload
                .filter(|p| is_webhook_item(p))
                .and_then(|p| p["webhookUrl"].as_str())
                .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
            {
                let mut settings = self.defaults.clone();
                settings
                    .headers
                    .extend(safe_webhook_headers(payload.unwrap_or(&Value::Null)));
                return Some(ResolvedTarget {
                    name: format!("webhook {}", host(url)),
                    url: url.to_owned(),
                    settings,
                });
            }
        }
        // Last: n8n retries the execution itself (not for an edited payload: n8n would run
        // the original data, not the fix).
        if let (Some(r), Some(exec)) = (&self.n8n_retry, &rec.facts.execution_id) {
            let edited = rec.payload_version.is_some_and(|v| v > 1);
            if rec.source == crate::model::Source::ErrorTrigger.as_str() && !edited {
                let mut settings = self.defaults.clone();
                settings.method = "POST".into();
                settings.body = crate::model::delivery::BodyMode::N8nRetry {
                    load_workflow: r.load_workflow,
                };
                settings
                    .secret_headers
                    .push(("X-N8N-API-KEY".into(), r.key.clone()));
                let id: String = exec
                    .chars()
                    .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                return Some(ResolvedTarget {
                    name: format!("n8n retry {}", host(&r.base_url)),
                    url: format!("{}/api/v1/executions/{id}/retry", r.base_url),
                    settings,
                });
            }
        }
        None
    }
}

/// The original request's headers worth sending again with a webhook replay: the caller's own
/// `x-…` headers (an event type, a request id), never anything that authenticates, identifies
/// a session or describes the old connection, and never a value redaction replaced. (The body
/// goes as JSON, as n8n parsed it; deadletter's own `x-deadletter-*` headers say it is a replay.)
pub fn safe_webhook_headers(item: &Value) -> Vec<(String, String)> {
    const SENSITIVE: &[&str] = &[
        "auth",
        "token",
        "key",
        "secret",
        "signature",
        "cookie",
        "session",
        "password",
        "csrf",
    ];
    let Some(headers) = item.get("headers").and_then(Value::as_object) else {
        return Vec::new();
    };
    headers
        .iter()
        .filter_map(|(k, v)| {
            let name = k.to_ascii_lowercase();
            let value = v.as_str()?;
            let forward = name.starts_with("x-")
                && !name.starts_with("x-forwarded-")
                && !name.starts_with("x-deadletter-")
                && !name.starts_with("x-real-ip")
                && !SENSITIVE.iter().any(|s| name.contains(s))
                && !value.contains(crate::redact::REDACTED)
                && axum::http::HeaderName::from_bytes(name.as_bytes()).is_ok()
                && axum::http::HeaderValue::from_str(value).is_ok();
            forward.then(|| (name, value.to_owned()))
        })
        .collect()
}

/// `scheme://host:port` of a URL (what rate limits and breakers are about).
fn host(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    match url[after..].find('/') {
        Some(i) => &url[..after + i],
        None => url,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_replay_carries_the_callers_own_headers_but_nothing_sensitive() {
        let item = serde_json::json!({"headers": {
            "host": "127.0.0.1:5678", "content-type": "application/json", "user-agent": "curl/8",
            "x-github-event": "push", "X-Request-Id": "r-1", "x-api-key": "k", "x-hub-signature-256": "s",
            "x-forwarded-for": "10.0.0.1", "x-custom": "[REDACTED]", "authorization": "Bearer t",
            "cookie": "a=b"}, "body": {}, "webhookUrl": "http://127.0.0.1:5678/webhook/x"});
        let mut h = safe_webhook_headers(&item);
        h.sort();
        assert_eq!(
            h,
            [
                ("x-github-event".to_string(), "push".to_string()),
                ("x-request-id".into(), "r-1".into())
            ]
        );
    }

    #[test]
    fn host_is_scheme_host_and_port() {
        assert_eq!(
            host("http://127.0.0.1:5678/webhook/orders"),
            "http://127.0.0.1:5678"
        );
        assert_eq!(host("https://x.test"), "https://x.test");
    }
}
