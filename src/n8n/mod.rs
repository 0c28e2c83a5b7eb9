//! n8n's public API, the enrichment side: n8n's Error Trigger says *that* an execution failed,
//! never *with what data*, so for each Error Trigger record with an execution id deadletter
//! fetches `GET /api/v1/executions/{id}?includeData=true` (header `X-N8N-API-KEY`) in the
//! background — never on the ingest path, a few at a time — and keeps the trigger item (for a
//! webhook workflow, the webhook item: what a replay re-posts) as the payload when the record
//! has none, and the failing node's input items, both redacted like any payload.
//!
//! Reconciliation (`reconcile.rs`): every `n8n.reconcile_every`, deadletter pages through n8n's
//! failed executions newer than the last one it saw and creates a record for each one it never
//! heard of — the workflows without an Error Workflow.
//!
//! A 404 means n8n no longer has the execution (pruned, or failed executions not saved): the
//! record becomes `unavailable`, with the reason. n8n down or the key refused: the record stays
//! `pending` and is tried again with backoff, until `n8n.give_up_after`. The API's state is
//! logged once per change (not per record), shown in `/readyz` and counted in
//! `dlq_n8n_api_errors_total{kind}`.

use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinSet;

mod reconcile;
pub use reconcile::{error_trigger_body, reconcile_once, Reconciled};

use crate::config::{N8nConfig, SecretSource};
use crate::ingest::Ingestor;
use crate::metrics::METRICS;
use crate::store::enrich::{Candidate, Enrich, EnrichResult};
use crate::store::Store;

/// What the last call to n8n's API found: shown by /readyz.
pub static API_STATE: LazyLock<Mutex<String>> =
    LazyLock::new(|| Mutex::new("not used".to_string()));

pub(crate) fn set_state(s: &str) {
    let mut cur = API_STATE.lock().unwrap_or_else(|p| p.into_inner());
    if *cur != s {
        if s == "ok" {
            tracing::info!("n8n API: reachable, key accepted");
        } else {
            tracing::warn!(state = s, "n8n API: {s}");
        }
        *cur = s.to_owned();
    }
}

/// Why a fetch did not bring the execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// 404: n8n does not have it (pruned, or failed executions are not saved).
    NotFound,
    /// 401/403: the key is wrong or lacks the scope.
    Refused(u16),
    /// Anything else: n8n down, slow, or answering something unexpected.
    Unreachable(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::NotFound => write!(f, "n8n does not have that execution (404)"),
            FetchError::Refused(s) => write!(f, "the API key was refused ({s})"),
            FetchError::Unreachable(m) => write!(f, "unreachable: {m}"),
        }
    }
}

impl FetchError {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            FetchError::NotFound => "not_found",
            FetchError::Refused(_) => "refused",
            FetchError::Unreachable(_) => "unreachable",
        }
    }
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    key: SecretSource,
}

impl Client {
    pub fn new(cfg: &N8nConfig) -> Option<Client> {
        let key = cfg.api_key.clone()?;
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .build()
            .ok()?;
        Some(Client {
            http,
            base: cfg.base_url.clone(),
            key,
        })
    }

    /// GET with the API key; the answer's JSON, or why not.
    async fn get(&self, req: reqwest::RequestBuilder) -> Result<Value, FetchError> {
        let key = self.key.read().map_err(FetchError::Unreachable)?;
        let res = req
            .header("X-N8N-API-KEY", key)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| FetchError::Unreachable(format!("{e}")))?;
        match res.status().as_u16() {
            200 => res
                .json::<Value>()
                .await
                .map_err(|e| FetchError::Unreachable(format!("not JSON: {e}"))),
            404 => Err(FetchError::NotFound),
            s @ (401 | 403) => Err(FetchError::Refused(s)),
            s => Err(FetchError::Unreachable(format!("n8n answered {s}"))),
        }
    }

    /// One page of failed executions (newest first, no run data) and the cursor of the next.
    pub async fn failed_page(
        &self,
        cursor: Option<&str>,
    ) -> Result<(Vec<Value>, Option<String>), FetchError> {
        let mut req = self
            .http
            .get(format!("{}/api/v1/executions", self.base))
            .query(&[("status", "error"), ("limit", "100")]);
        if let Some(c) = cursor {
            req = req.query(&[("cursor", c)]);
        }
        // No such list is not "no such execution".
        let v = self.get(req).await.map_err(|e| match e {
            FetchError::NotFound => FetchError::Unreachable("n8n answered 404".into()),
            e => e,
        })?;
        let data = v["data"].as_array().cloned().unwrap_or_default();
        let next = v["nextCursor"].as_str().map(str::to_owned);
        Ok((data, next))
    }

    pub async fn execution(&self, id: &str) -> Result<Value, FetchError> {
        let id: String = id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        let url = format!("{}/api/v1/executions/{id}?includeData=true", self.base);
        self.get(self.http.get(url)).await
    }
}

/// What an execution says, in deadletter's terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extracted {
    /// The first item the trigger node emitted (a webhook workflow: the webhook item).
    pub trigger_item: Option<Value>,
    pub trigger_node: Option<String>,
    /// The input items of the node that failed (what it was working on).
    pub failing_inputs: Option<Vec<Value>>,
    pub failing_node: Option<String>,
    pub workflow_version_id: Option<String>,
    pub started_at: Option<String>,
    pub stopped_at: Option<String>,
    pub status: Option<String>,
}

fn items(main: &Value) -> Vec<Value> {
    main.get("main")
        .and_then(|m| m.get(0))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|i| i.get("json").cloned()).collect())
        .unwrap_or_default()
}

/// Read the parts deadletter keeps from `GET /api/v1/executions/{id}?includeData=true`.
pub fn extract(exec: &Value) -> Extracted {
    let run_data = exec
        .pointer("/data/resultData/runData")
        .and_then(Value::as_object);
    // The trigger ran first and has no source node.
    let trigger = run_data.and_then(|rd| {
        rd.iter()
            .filter_map(|(name, runs)| {
                let run = runs.get(0)?;
                let no_source = run
                    .get("source")
                    .is_none_or(|s| s.as_array().is_none_or(|a| a.iter().all(Value::is_null)));
                let index = run
                    .get("executionIndex")
                    .and_then(Value::as_i64)
                    .unwrap_or(i64::MAX);
                no_source.then_some((index, name, run))
            })
            .min_by_key(|(index, _, _)| *index)
    });
    let stack = exec.pointer("/data/executionData/nodeExecutionStack/0");
    Extracted {
        trigger_item: trigger
            .and_then(|(_, _, run)| run.get("data"))
            .and_then(|d| items(d).into_iter().next()),
        trigger_node: trigger.map(|(_, name, _)| name.clone()),
        failing_inputs: stack
            .and_then(|s| s.get("data"))
            .map(items)
            .filter(|v| !v.is_empty()),
        failing_node: stack
            .and_then(|s| s.pointer("/node/name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| {
                exec.pointer("/data/resultData/lastNodeExecuted")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }),
        workflow_version_id: exec
            .pointer("/workflowData/activeVersionId")
            .or_else(|| exec.pointer("/workflowData/versionId"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        started_at: exec
            .get("startedAt")
            .and_then(Value::as_str)
            .map(str::to_owned),
        stopped_at: exec
            .get("stoppedAt")
            .and_then(Value::as_str)
            .map(str::to_owned),
        status: exec
            .get("status")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

/// Backoff between tries while n8n is down or refuses the key: 30 s doubling to 15 min.
fn backoff(tries: u32) -> Duration {
    Duration::from_secs((30u64 << tries.min(5)).min(900))
}

/// What to do with a record after one fetch at `now_ms`.
pub fn outcome(
    c: &Candidate,
    fetched: Result<Value, FetchError>,
    ingestor: &Ingestor,
    now_ms: i64,
    tries: u32,
    give_up_after: Duration,
) -> EnrichResult {
    match fetched {
        Ok(exec) => {
            let x = extract(&exec);
            let encode = |v: &Value| {
                serde_json::value::to_raw_value(v)
                    .ok()
                    .and_then(|raw| ingestor.prepare_payload(&raw).ok())
                    .map(|(doc, _)| doc)
            };
            EnrichResult::Enriched {
                payload: x.trigger_item.as_ref().and_then(encode),
                inputs: x
                    .failing_inputs
                    .as_ref()
                    .and_then(|i| encode(&Value::Array(i.clone()))),
                detail: json!({
                    "source": "n8n public API",
                    "execution_id": c.execution_id,
                    "trigger_node": x.trigger_node,
                    "failing_node": x.failing_node,
                    "failing_node_input_items": x.failing_inputs.as_ref().map_or(0, Vec::len),
                    "workflow_version_id": x.workflow_version_id,
                    "started_at": x.started_at,
                    "stopped_at": x.stopped_at,
                    "execution_status": x.status,
                }),
            }
        }
        Err(FetchError::NotFound) => EnrichResult::Unavailable {
            detail: json!({
                "reason": "n8n does not have this execution (404): pruned, or failed executions are not saved",
                "execution_id": c.execution_id,
            }),
        },
        Err(e) => {
            let why = match &e {
                FetchError::Refused(s) => format!("n8n refused the API key ({s})"),
                FetchError::Unreachable(m) => format!("n8n unreachable: {m}"),
                FetchError::NotFound => unreachable!(),
            };
            let give_up_at =
                c.first_seen_ms + i64::try_from(give_up_after.as_millis()).unwrap_or(i64::MAX);
            let next = now_ms + i64::try_from(backoff(tries).as_millis()).unwrap_or(i64::MAX);
            if next > give_up_at {
                EnrichResult::Unavailable {
                    detail: json!({"reason": format!("gave up: {why}"), "execution_id": c.execution_id}),
                }
            } else {
                EnrichResult::Retry {
                    after_ms: next,
                    detail: json!({"last_error": why, "tries": tries + 1, "execution_id": c.execution_id}),
                }
            }
        }
    }
}

/// The enricher: every `n8n.tick`, fetch what is due (`n8n.concurrency` at a time). Nothing at
/// all without an API key or with `n8n.enrich = false`.
pub async fn run(
    store: Store,
    cfg: N8nConfig,
    ingestor: std::sync::Arc<Ingestor>,
    mut shutdown: watch::Receiver<bool>,
) {
    if !cfg.enrich && !cfg.reconcile {
        return;
    }
    let Some(client) = Client::new(&cfg) else {
        return;
    };
    let mut next_reconcile = tokio::time::Instant::now();
    // Quietly: only changes after the first call are news.
    *API_STATE.lock().unwrap_or_else(|p| p.into_inner()) = "not checked yet".into();
    let client = std::sync::Arc::new(client);
    // Tries per record in this process (the backoff's exponent); a restart starts over.
    let mut tries: std::collections::HashMap<i64, u32> = Default::default();
    loop {
        if cfg.reconcile && tokio::time::Instant::now() >= next_reconcile {
            next_reconcile = tokio::time::Instant::now() + cfg.reconcile_every;
            reconcile::round(&store, &client, &ingestor, &cfg.base_url).await;
        }
        let now = chrono::Utc::now().timestamp_millis();
        let readers = store.readers.clone();
        let limit = if cfg.enrich { cfg.concurrency * 4 } else { 0 };
        let due = tokio::task::spawn_blocking(move || readers.enrich_candidates(now, limit))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        for chunk in due.chunks(cfg.concurrency) {
            let mut set = JoinSet::new();
            for c in chunk {
                let (client, c) = (client.clone(), c.clone());
                set.spawn(async move {
                    let r = client.execution(&c.execution_id).await;
                    (c, r)
                });
            }
            while let Some(Ok((c, fetched))) = set.join_next().await {
                if let Err(e) = &fetched {
                    METRICS
                        .n8n_api_errors
                        .get_or_create(&vec![("kind", e.kind().to_owned())])
                        .inc();
                }
                // A 404 is n8n answering with the key accepted: the API itself is fine.
                match &fetched {
                    Ok(_) | Err(FetchError::NotFound) => set_state("ok"),
                    Err(e) => set_state(&e.to_string()),
                }
                let t = tries.entry(c.id).or_insert(0);
                let now = chrono::Utc::now().timestamp_millis();
                let result = outcome(&c, fetched, &ingestor, now, *t, cfg.give_up_after);
                *t += 1;
                if !matches!(result, EnrichResult::Retry { .. }) {
                    tries.remove(&c.id);
                }
                let e = Enrich {
                    id: c.id,
                    at_ms: now,
                    actor: crate::store::SYSTEM_ACTOR.into(),
                    result,
                };
                if let Err(err) = store.writer.enrich(e).await {
                    tracing::warn!(id = c.id, error = %err, "could not record the enrichment");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.tick) => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trigger_item_and_the_failing_nodes_inputs_come_out_of_a_real_execution() {
        let exec: Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/n8n/public-api-execution.json"
        ))
        .unwrap();
        let x = extract(&exec);
        assert_eq!(x.trigger_node.as_deref(), Some("Webhook"));
        let item = x.trigger_item.unwrap();
        assert_eq!(item["body"]["orderId"], "A-1001");
        assert_eq!(item["webhookUrl"], "http://127.0.0.1:5678/webhook/orders");
        assert_eq!(x.failing_node.as_deref(), Some("Process order"));
        assert_eq!(x.failing_inputs.unwrap()[0]["body"]["orderId"], "A-1001");
        assert_eq!(
            x.workflow_version_id.as_deref(),
            Some("e8be7eec-a06a-4327-b929-c485c320134e")
        );
        assert_eq!(x.started_at.as_deref(), Some("2026-11-29T23:04:02.720Z"));
        assert_eq!(x.status.as_deref(), Some("error"));
    }

    #[test]
    fn n8n_down_backs_off_then_gives_up_and_a_404_is_final() {
        let c = Candidate {
            id: 1,
            execution_id: "9".into(),
            first_seen_ms: 0,
        };
        let ing = Ingestor::new(&crate::config::Config::default_config().unwrap());
        let day = Duration::from_secs(86_400);
        let down = || Err(FetchError::Unreachable("connection refused".into()));
        match outcome(&c, down(), &ing, 1_000, 0, day) {
            EnrichResult::Retry { after_ms, .. } => assert_eq!(after_ms, 31_000),
            other => panic!("{other:?}"),
        }
        match outcome(&c, down(), &ing, 1_000, 9, day) {
            EnrichResult::Retry { after_ms, .. } => {
                assert_eq!(after_ms, 901_000, "capped at 15 min")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            outcome(&c, down(), &ing, 86_400_000, 3, day),
            EnrichResult::Unavailable { .. }
        ));
        assert!(matches!(
            outcome(&c, Err(FetchError::NotFound), &ing, 1_000, 0, day),
            EnrichResult::Unavailable { .. }
        ));
    }
}
