//! Read handlers: the list with filters and cursor paging, one record, its raw payload, and
//! the liveness/readiness probes.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::openapi::{ErrorBody, Health, RecordDetail, Targets};
use super::{ApiError, AppState};
use crate::model::{parse_timestamp, FailureClass, Fingerprint, RecordId, Status};
use crate::store::ListPage;
use crate::store::{ListFilter, ReadPool, StoreError};

#[derive(Debug, Deserialize, serde::Serialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub(super) status: Option<String>,
    pub(super) partition: Option<String>,
    pub(super) workflow: Option<String>,
    pub(super) owner: Option<String>,
    pub(super) failure_class: Option<String>,
    pub(super) fingerprint: Option<String>,
    pub(super) since: Option<String>,
    pub(super) until: Option<String>,
    pub(super) q: Option<String>,
    pub(super) cursor: Option<String>,
    pub(super) limit: Option<usize>,
}

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 500;

fn field<T>(name: &str, r: Result<T, String>) -> Result<T, ApiError> {
    r.map_err(|m| ApiError::invalid(name, m))
}

pub(super) fn filter_from(q: ListQuery) -> Result<ListFilter, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid(
            "limit",
            format!("must be from 1 to {MAX_LIMIT}"),
        ));
    }
    Ok(ListFilter {
        status: q
            .status
            .map(|s| field("status", s.parse::<Status>()))
            .transpose()?,
        partition: q.partition,
        workflow: q.workflow,
        owner: q.owner,
        failure_class: q
            .failure_class
            .map(|s| field("failure_class", s.parse::<FailureClass>()))
            .transpose()?,
        fingerprint: q
            .fingerprint
            .map(|s| field("fingerprint", Fingerprint::parse(&s)))
            .transpose()?,
        since_ms: q
            .since
            .map(|s| field("since", parse_timestamp(&s)))
            .transpose()?,
        until_ms: q
            .until
            .map(|s| field("until", parse_timestamp(&s)))
            .transpose()?,
        message_contains: q.q.filter(|s| !s.is_empty()),
        before_id: q
            .cursor
            .map(|c| field("cursor", RecordId::parse(&c).map(RecordId::get)))
            .transpose()?,
        limit,
    })
}

/// Run reader work on a blocking thread (SQLite never runs on the async runtime).
pub(super) async fn read<T: Send + 'static>(
    pool: &ReadPool,
    f: impl FnOnce(&ReadPool) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let pool = pool.clone();
    tokio::task::spawn_blocking(move || f(&pool))
        .await
        .map_err(|_| ApiError::internal())?
        .map_err(ApiError::from)
}

/// Records, newest first, filtered, with a cursor that stays stable while inserts happen.
#[utoipa::path(get, path = "/v1/dead-letters", tag = "read", params(ListQuery),
    responses((status = 200, body = ListPage), (status = 400, description = "not JSON", body = ErrorBody), (status = 401, description = "no or bad token", body = ErrorBody), (status = 403, description = "the token's role does not allow it", body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let filter = filter_from(q)?;
    let page = read(&state.store.readers, move |p| p.list(&filter)).await?;
    Ok(Json(page).into_response())
}

fn parse_id(raw: &str) -> Result<i64, ApiError> {
    RecordId::parse(raw)
        .map(RecordId::get)
        .map_err(ApiError::not_found)
}

/// One record; its `ETag` is the version to send back with a change.
#[utoipa::path(get, path = "/v1/dead-letters/{id}", tag = "read", params(("id" = i64, Path)),
    responses((status = 200, body = RecordDetail), (status = 404, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let (version, body) = read(&state.store.readers, move |p| {
        let detail = p.get(id)?;
        Ok((detail.summary.version, detail.to_json()?))
    })
    .await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::ETAG, format!("\"{version}\"")),
        ],
        body,
    )
        .into_response())
}

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PayloadQuery {
    version: Option<i64>,
}

/// A payload version (default: the newest, what a replay sends), byte for byte as stored.
#[utoipa::path(get, path = "/v1/dead-letters/{id}/payload", tag = "read", params(("id" = i64, Path), PayloadQuery),
    responses((status = 200, description = "the payload, byte for byte as stored", content_type = "application/json", body = Object),
        (status = 400, description = "a bad query string", body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn payload(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<PayloadQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = parse_id(&id)?;
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let version = q.version;
    let doc = read(&state.store.readers, move |p| {
        p.summary(id)?;
        p.payload(id, version)
    })
    .await?;
    match doc {
        Some(d) => Ok((
            [
                (header::CONTENT_TYPE, "application/json".to_owned()),
                (
                    header::HeaderName::from_static("x-deadletter-payload-version"),
                    d.version.to_string(),
                ),
            ],
            d.json,
        )
            .into_response()),
        None => Err(ApiError::not_found(match version {
            Some(v) => format!("dead letter {id} has no payload version {v}"),
            None => format!(
                "dead letter {id} has no payload (an Error Trigger record carries only the error)"
            ),
        })),
    }
}

/// Configured targets and the live pacing (rate, breaker) of every target sent to so far.
#[utoipa::path(get, path = "/v1/targets", tag = "delivery",
    responses((status = 200, body = Targets), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn targets(State(state): State<AppState>) -> Response {
    let configured: Vec<_> = state
        .config
        .targets
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "url": t.url, "partitions": t.partitions, "workflows": t.workflows,
                "method": t.settings.method, "rate_initial": t.settings.rate_initial,
                "rate_max": t.settings.rate_max, "breaker_failures": t.settings.breaker_failures,
            })
        })
        .collect();
    let gates = state
        .scheduler
        .as_ref()
        .map(|s| s.gates())
        .unwrap_or_default();
    Json(json!({
        "delivery_enabled": state.scheduler.is_some(),
        "configured": configured,
        "live": gates,
    }))
    .into_response()
}

#[utoipa::path(get, path = "/healthz", tag = "health", security(()), responses((status = 200, body = Health)))]
pub async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// Ready when the writer runs and a reader can query the database.
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let writer = state.store.writer.is_alive();
    let db = read(&state.store.readers, |p| p.ping()).await.is_ok();
    let status = if writer && db {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "status": if status == StatusCode::OK { "ready" } else { "not_ready" },
            "checks": {"writer": writer, "database": db},
            // Informational: n8n's API being down never makes deadletter unready.
            "n8n_api": crate::n8n::API_STATE.lock().map(|s| s.clone()).unwrap_or_default(),
        })),
    )
        .into_response()
}
