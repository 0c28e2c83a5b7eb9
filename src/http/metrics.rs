//! `GET /metrics` (Prometheus, OpenMetrics text), `GET /v1/stats` (the operator's figures),
//! and the layer that counts every request by its matched route (never the raw path: ids
//! would make a label per record).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::read::read;
use super::{ApiError, AppState};
use crate::metrics::{Snapshot, METRICS};
use crate::replay::gate::BreakerState;

/// The exposition: this process's counters and the store's kept totals; no record scans.
#[utoipa::path(get, path = "/metrics", tag = "health", security(()),
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text")))]
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let g = read(&state.store.readers, |p| p.gauges()).await?;
    let now = chrono::Utc::now().timestamp_millis();
    let gates = state
        .scheduler
        .as_ref()
        .map(|s| s.gates())
        .unwrap_or_default()
        .into_iter()
        .map(|g| {
            let state = match g.breaker {
                BreakerState::Closed => 0,
                BreakerState::HalfOpen => 1,
                BreakerState::Open => 2,
            };
            (g.target, state, g.paused_total)
        })
        .collect();
    let snap = Snapshot {
        retry_scheduled: g
            .depth
            .iter()
            .filter(|(_, s, _)| s == "retry_scheduled")
            .map(|(_, _, n)| n)
            .sum(),
        depth: g.depth,
        oldest_open: g
            .oldest_open
            .into_iter()
            .map(|(p, t)| (p, ((now - t).max(0) as f64) / 1000.0))
            .collect(),
        removed: g.removed,
        over_3_attempts: g.over_3_attempts,
        gates,
    };
    let body = crate::metrics::render(snap);
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response())
}

/// Route layer: count and time each request under its matched route.
pub async fn track(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().as_str().to_owned();
    let started = Instant::now();
    let res = next.run(req).await;
    let secs = started.elapsed().as_secs_f64();
    METRICS
        .http_requests
        .get_or_create(&vec![
            ("method", method.clone()),
            ("route", route.clone()),
            ("status", res.status().as_u16().to_string()),
        ])
        .inc();
    METRICS
        .http_latency
        .get_or_create(&vec![("method", method), ("route", route)])
        .observe(secs);
    res
}

/// Counts by status, what is new and what is old, top failures and workflows, time to
/// resolution, the 48 h SLO, business-loss risk and ingress per hour for the last day.
#[utoipa::path(get, path = "/v1/stats", tag = "read",
    responses((status = 200, body = crate::store::stats::Stats), (status = 401, body = super::openapi::ErrorBody),
        (status = 403, body = super::openapi::ErrorBody)))]
pub async fn stats(State(state): State<AppState>) -> Result<Response, ApiError> {
    let now = chrono::Utc::now().timestamp_millis();
    let money = state.config.metrics.money_partitions.clone();
    let mut s = read(&state.store.readers, move |p| p.stats(now, &money)).await?;
    // What the last call to n8n's API found ("not used" without an API key).
    s.n8n_api = crate::n8n::API_STATE.lock().map(|s| s.clone()).ok();
    Ok(axum::Json(s).into_response())
}
