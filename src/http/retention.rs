//! Erasure and tombstones: `DELETE /v1/dead-letters?…` (admin) removes records now — payloads
//! destroyed, tombstones kept with reason "erasure" and who asked — and `GET /v1/tombstones`
//! shows what was removed, when and why; `GET /v1/retention` what each partition holds against
//! its caps, what is about to expire, and how many records went for each reason.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::openapi::ErrorBody;
use super::{ApiError, AppState, Caller};
use crate::model::{Role, ShortText, MAX_KEY_BYTES};
use crate::store::retention::{Erasure, ErasureSelector, RetentionStatus, TombstoneView};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EraseQuery {
    /// Comma-separated record ids.
    ids: Option<String>,
    idempotency_key: Option<String>,
    external_event_id: Option<String>,
    tenant_id: Option<String>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Erased {
    pub erased: usize,
    pub ids: Vec<i64>,
}

/// Erase records now (a GDPR-style request): exactly one selector.
#[utoipa::path(delete, path = "/v1/dead-letters", tag = "retention", params(EraseQuery),
    responses((status = 200, body = Erased), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "needs the admin role", body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn erase(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<EraseQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    caller.require(Role::Admin)?;
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let key = |field: &str, v: String| {
        ShortText::parse(field, &v, MAX_KEY_BYTES)
            .map(ShortText::into_string)
            .map_err(|m| ApiError::invalid(field, m))
    };
    let mut selectors = Vec::new();
    if let Some(ids) = q.ids {
        let parsed: Result<Vec<i64>, _> = ids.split(',').map(|i| i.trim().parse::<i64>()).collect();
        match parsed {
            Ok(v) if !v.is_empty() && v.len() <= 10_000 => selectors.push(ErasureSelector::Ids(v)),
            _ => {
                return Err(ApiError::invalid(
                    "ids",
                    "give 1 to 10000 comma-separated record ids",
                ))
            }
        }
    }
    if let Some(k) = q.idempotency_key {
        selectors.push(ErasureSelector::IdempotencyKey(key("idempotency_key", k)?));
    }
    if let Some(k) = q.external_event_id {
        selectors.push(ErasureSelector::ExternalEventId(key(
            "external_event_id",
            k,
        )?));
    }
    if let Some(k) = q.tenant_id {
        selectors.push(ErasureSelector::TenantId(key("tenant_id", k)?));
    }
    if selectors.len() != 1 {
        return Err(ApiError::invalid(
            "ids",
            "give exactly one of ids, idempotency_key, external_event_id or tenant_id",
        ));
    }
    let actor = caller.actor("api");
    let ids = state
        .store
        .writer
        .erase(Erasure {
            selector: selectors.remove(0),
            actor: actor.clone(),
            at_ms: chrono::Utc::now().timestamp_millis(),
        })
        .await?;
    tracing::info!(erased = ids.len(), actor, "erasure");
    Ok(Json(Erased {
        erased: ids.len(),
        ids,
    })
    .into_response())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TombstoneQuery {
    limit: Option<usize>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Tombstones {
    pub tombstones: Vec<TombstoneView>,
}

/// What was removed, newest first: when, why, by whom, and the payload's hash and size.
#[utoipa::path(get, path = "/v1/tombstones", tag = "retention", params(TombstoneQuery),
    responses((status = 200, body = Tombstones), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn tombstones(
    State(state): State<AppState>,
    query: Result<Query<TombstoneQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::invalid("limit", "must be from 1 to 1000"));
    }
    let list = super::read::read(&state.store.readers, move |p| p.tombstones(limit)).await?;
    Ok(Json(json!({ "tombstones": list })).into_response())
}

/// Retention at a glance: bytes per partition against its cap, open records about to expire,
/// removals by reason. Kept counts, never a scan of the records.
#[utoipa::path(get, path = "/v1/retention", tag = "retention",
    responses((status = 200, body = RetentionStatus), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn status(State(state): State<AppState>) -> Result<Response, ApiError> {
    let now = chrono::Utc::now().timestamp_millis();
    let s = crate::retention::status(&state.store, &state.config.retention, now).await?;
    Ok(Json(s).into_response())
}
