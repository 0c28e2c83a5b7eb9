//! Reconciliation: page through n8n's failed executions (`GET /api/v1/executions?status=error`,
//! newest first, cursor paging) newer than a watermark kept in the database, and create a
//! record for each one deadletter never heard of (matched by workflow id + execution id) — as
//! the Error Workflow would have, rebuilt from n8n's copy; the enricher then attaches its data.
//! Counted per workflow: they name the workflows that have no Error Workflow.

use serde_json::{json, Value};

use super::{set_state, Client, FetchError};
use crate::ingest::Ingestor;
use crate::metrics::METRICS;
use crate::store::Store;

/// What n8n's Error Trigger would have sent for this execution, rebuilt from the API's copy.
pub fn error_trigger_body(exec: &Value, base_url: &str) -> Value {
    let wf = exec
        .pointer("/workflowData/id")
        .or_else(|| exec.get("workflowId"))
        .cloned()
        .unwrap_or(Value::Null);
    let error = exec
        .pointer("/data/resultData/error")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(
            || json!({"message": "the execution failed (found in n8n by reconciliation)"}),
        );
    let id = exec["id"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| exec["id"].to_string());
    json!({
        "execution": {
            "id": id,
            "url": format!("{base_url}/workflow/{}/executions/{id}", wf.as_str().unwrap_or("")),
            "error": error,
            "lastNodeExecuted": exec.pointer("/data/resultData/lastNodeExecuted"),
            "mode": exec.get("mode"),
        },
        "workflow": {"id": wf, "name": exec.pointer("/workflowData/name")},
    })
}

/// What one reconciliation found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Failed executions newer than the watermark.
    pub seen: usize,
    /// Records created for the ones deadletter never heard of, by workflow id.
    pub created: std::collections::BTreeMap<String, usize>,
}

const WATERMARK: &str = "n8n_reconcile_watermark";

fn numeric(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
}

/// Page through n8n's failed executions newer than the watermark; create what is missing.
pub async fn reconcile_once(
    store: &Store,
    client: &Client,
    ingestor: &Ingestor,
    base_url: &str,
) -> Result<Reconciled, FetchError> {
    let readers = store.readers.clone();
    let watermark = tokio::task::spawn_blocking(move || readers.counter(WATERMARK))
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .unwrap_or(0);
    let mut newest = watermark;
    let mut out = Reconciled::default();
    let mut cursor: Option<String> = None;
    loop {
        let (page, next) = client.failed_page(cursor.as_deref()).await?;
        let mut any_new = false;
        for summary in &page {
            let Some(id) = numeric(&summary["id"]) else {
                continue;
            };
            if id <= watermark {
                continue;
            }
            any_new = true;
            newest = newest.max(id);
            out.seen += 1;
            let wf = summary["workflowId"].as_str().unwrap_or("").to_owned();
            let readers = store.readers.clone();
            let (w, e) = (wf.clone(), id.to_string());
            let known = tokio::task::spawn_blocking(move || readers.known_execution(&w, &e))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(true);
            if known {
                continue;
            }
            let exec = match client.execution(&id.to_string()).await {
                Ok(x) => x,
                // Pruned between the list and the fetch: what the summary says will do.
                Err(FetchError::NotFound) => summary.clone(),
                Err(e) => return Err(e),
            };
            let body = error_trigger_body(&exec, base_url);
            let ctx = crate::ingest::RequestContext {
                actor: "n8n-reconciliation".into(),
                ..Default::default()
            };
            let now = chrono::Utc::now().timestamp_millis();
            let rec = match ingestor.prepare(
                crate::model::Source::ErrorTrigger,
                body.to_string().as_bytes(),
                &ctx,
                now,
            ) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(execution = id, error = %e, "reconciliation: n8n's execution does not read as a failure");
                    continue;
                }
            };
            match store.writer.ingest(rec).await {
                Ok(o) if o.created => {
                    *out.created.entry(wf.clone()).or_default() += 1;
                    METRICS
                        .n8n_reconciled
                        .get_or_create(&vec![("workflow_id", wf.clone())])
                        .inc();
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(execution = id, error = %e, "reconciliation: could not store it")
                }
            }
        }
        // Newest first: a page with nothing newer than the watermark ends it.
        match next {
            Some(c) if any_new => cursor = Some(c),
            _ => break,
        }
    }
    if newest > watermark {
        if let Err(e) = store.writer.set_counter(WATERMARK, newest).await {
            tracing::warn!(error = %e, "reconciliation: could not keep the watermark");
        }
    }
    Ok(out)
}

/// One round as the enricher's loop runs it: logged, counted, and the API state kept.
pub(super) async fn round(store: &Store, client: &Client, ingestor: &Ingestor, base_url: &str) {
    match reconcile_once(store, client, ingestor, base_url).await {
        Ok(r) => {
            set_state("ok");
            if !r.created.is_empty() {
                let list: Vec<String> = r.created.iter().map(|(w, n)| format!("{w}={n}")).collect();
                tracing::warn!(
                    found = r.created.values().sum::<usize>(),
                    workflows = %list.join(","),
                    "reconciliation: failed executions that never reached deadletter (do these workflows have an Error Workflow?)"
                );
            }
        }
        Err(e) => {
            METRICS
                .n8n_api_errors
                .get_or_create(&vec![("kind", e.kind().to_owned())])
                .inc();
            set_state(&format!("reconciliation failed: {e}"));
        }
    }
}
