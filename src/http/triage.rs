//! Triage handlers: `PATCH /v1/dead-letters/{id}` (status, owner, note, tags, payload edit,
//! with optimistic concurrency), `GET /v1/groups` and `POST /v1/groups/{fingerprint}/actions`.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Deserializer};
use serde_json::json;
use serde_json::value::RawValue;

use super::openapi::{ErrorBody, GroupActionAnswer, GroupActionBody, Groups, Patch};
use super::read::read;
use super::{ApiError, AppState, Caller};
use crate::model::{FailureClass, Fingerprint, RecordId, ShortText, Status};
use crate::store::{
    Change, Chosen, GroupAction, GroupActionKind, GroupFilter, PayloadEdit, RecordSummary,
};

pub const MAX_NOTE_BYTES: usize = 4096;
pub const MAX_TAGS: usize = 32;

/// Absent → None; `null` → Some(None); a value → Some(Some(v)).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchBody {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default, deserialize_with = "present")]
    owner: Option<Option<String>>,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    tags: Option<Vec<String>>,
    #[serde(default)]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    version: Option<i64>,
}

pub(super) fn json_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    headers: &HeaderMap,
    limit: usize,
) -> Result<T, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case("application/json")
    {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send the body as JSON with `Content-Type: application/json`",
        ));
    }
    let body = body.map_err(|e| super::body_error(e, limit))?;
    let de = &mut serde_json::Deserializer::from_slice(&body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("the body is not valid JSON: {inner}"),
            )
        } else {
            ApiError::invalid(if path == "." { "$" } else { &path }, inner)
        }
    })
}

/// The version the client read: `If-Match: "3"` (or `W/"3"`), or `version` in the body.
fn expected_version(headers: &HeaderMap, body: Option<i64>) -> Result<Option<i64>, ApiError> {
    let header = match headers.get(header::IF_MATCH) {
        None => None,
        Some(v) => {
            let t = v
                .to_str()
                .unwrap_or("")
                .trim()
                .trim_start_matches("W/")
                .trim_matches('"');
            Some(t.parse::<i64>().map_err(|_| {
                ApiError::invalid(
                    "If-Match",
                    format!("`{t}` is not a version this server sent"),
                )
            })?)
        }
    };
    match (header, body) {
        (Some(h), Some(b)) if h != b => Err(ApiError::invalid("version", "differs from If-Match")),
        (h, b) => Ok(h.or(b)),
    }
}

pub(super) fn short(field: &str, v: &str, max: usize) -> Result<String, ApiError> {
    ShortText::parse(field, v, max)
        .map(ShortText::into_string)
        .map_err(|m| ApiError::invalid(field, m))
}

pub fn with_etag(summary: &RecordSummary) -> Response {
    (
        [(header::ETAG, format!("\"{}\"", summary.version))],
        Json(summary),
    )
        .into_response()
}

/// Move, assign, note, tag or edit a record; every change is audited.
#[utoipa::path(patch, path = "/v1/dead-letters/{id}", tag = "triage", params(("id" = i64, Path)),
    request_body(content = Patch, content_type = "application/json"),
    responses((status = 200, body = RecordSummary), (status = 404, body = ErrorBody),
        (status = 409, description = "not a legal move", body = ErrorBody),
        (status = 412, description = "changed since it was read", body = ErrorBody),
        (status = 428, description = "a payload edit without the version", body = ErrorBody),
        (status = 400, description = "not JSON", body = ErrorBody), (status = 401, description = "no or bad token", body = ErrorBody), (status = 403, description = "the token's role does not allow it", body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn patch(
    State(state): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let id = RecordId::parse(&id).map_err(ApiError::not_found)?.get();
    let b: PatchBody = json_body(body, &headers, state.config.server.body_limit_bytes)?;
    let mut change = Change {
        id,
        actor: caller.actor("api"),
        at_ms: chrono::Utc::now().timestamp_millis(),
        expected_version: expected_version(&headers, b.version)?,
        ..Change::default()
    };
    let reason = b
        .reason
        .map(|r| short("reason", &r, MAX_NOTE_BYTES))
        .transpose()?;
    match b.status {
        Some(s) => {
            let to = s
                .parse::<Status>()
                .map_err(|m| ApiError::invalid("status", m))?;
            change.status = Some((to, reason));
        }
        None if reason.is_some() => {
            return Err(ApiError::invalid(
                "reason",
                "goes with `status`; for a remark use `note`",
            ))
        }
        None => {}
    }
    change.owner = b
        .owner
        .map(|o| o.map(|o| short("owner", &o, 128)).transpose())
        .transpose()?;
    change.note = b
        .note
        .map(|n| short("note", &n, MAX_NOTE_BYTES))
        .transpose()?;
    if let Some(tags) = b.tags {
        if tags.len() > MAX_TAGS {
            return Err(ApiError::invalid(
                "tags",
                format!("at most {MAX_TAGS} tags"),
            ));
        }
        let mut clean: Vec<String> = Vec::new();
        for (i, t) in tags.iter().enumerate() {
            let t = short(&format!("tags[{i}]"), t, 64)?;
            if !clean.contains(&t) {
                clean.push(t);
            }
        }
        change.tags = Some(clean);
    }
    if let Some(raw) = b.payload {
        if change.expected_version.is_none() {
            return Err(ApiError::new(
                StatusCode::PRECONDITION_REQUIRED,
                "version_required",
                "a payload edit must say which version it edits: send If-Match (the ETag you read) or `version`",
            ));
        }
        change.payload = Some(payload_edit(&state, id, &raw).await?);
    }
    let summary = state.store.writer.change(change).await?;
    tracing::info!(id, version = summary.version, status = %summary.status, "record changed");
    Ok(with_etag(&summary))
}

/// Redact and encode the new payload, and diff it (RFC 6902) against the version it replaces.
/// The writer refuses the edit if another one landed in between (`base_version`).
pub(super) async fn payload_edit(
    state: &AppState,
    id: i64,
    raw: &RawValue,
) -> Result<PayloadEdit, ApiError> {
    let (doc, new_value) = state.ingestor.prepare_payload(raw)?;
    let (base_version, old) = read(&state.store.readers, move |p| {
        let summary = p.summary(id)?;
        Ok((
            summary.payload_version,
            p.payload(id, summary.payload_version)?,
        ))
    })
    .await?;
    let old_value = match old {
        Some(d) => serde_json::from_str(&d.json).map_err(|_| ApiError::internal())?,
        None => serde_json::Value::Null,
    };
    let diff = serde_json::to_value(json_patch::diff(&old_value, &new_value))
        .map_err(|_| ApiError::internal())?;
    Ok(PayloadEdit {
        doc,
        base_version,
        diff,
    })
}

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GroupQuery {
    open: Option<bool>,
    poison: Option<bool>,
    failure_class: Option<String>,
    workflow: Option<String>,
    limit: Option<usize>,
}

#[utoipa::path(get, path = "/v1/groups", tag = "triage", params(GroupQuery),
    responses((status = 200, body = Groups), (status = 400, description = "a bad query string", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn groups(
    State(state): State<AppState>,
    query: Result<Query<GroupQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 500 {
        return Err(ApiError::invalid("limit", "must be from 1 to 500"));
    }
    let filter = GroupFilter {
        open_only: q.open.unwrap_or(false),
        poison_only: q.poison.unwrap_or(false),
        failure_class: q
            .failure_class
            .map(|c| {
                c.parse::<FailureClass>()
                    .map_err(|m| ApiError::invalid("failure_class", m))
            })
            .transpose()?,
        workflow: q.workflow,
        limit,
    };
    let groups = read(&state.store.readers, move |p| p.groups(&filter)).await?;
    Ok(Json(json!({ "groups": groups })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    action: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    owner: Option<String>,
}

#[utoipa::path(post, path = "/v1/groups/{fingerprint}/actions", tag = "triage", params(("fingerprint" = String, Path)),
    request_body(content = GroupActionBody, content_type = "application/json"),
    responses((status = 200, body = GroupActionAnswer), (status = 404, body = ErrorBody), (status = 400, description = "not JSON", body = ErrorBody), (status = 401, description = "no or bad token", body = ErrorBody), (status = 403, description = "the token's role does not allow it", body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn group_action(
    State(state): State<AppState>,
    Path(fingerprint): Path<String>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let fingerprint = Fingerprint::parse(&fingerprint).map_err(ApiError::not_found)?;
    let b: ActionBody = json_body(body, &headers, state.config.server.body_limit_bytes)?;
    let (kind, text) =
        match b.action.as_str() {
            "resolve" => (GroupActionKind::Resolve, b.reason),
            "skip" => (GroupActionKind::Skip, b.reason),
            "ready_for_replay" => (GroupActionKind::ReadyForReplay, b.reason),
            "assign" => (
                GroupActionKind::Assign,
                Some(b.owner.ok_or_else(|| {
                    ApiError::invalid("owner", "missing: `assign` needs an owner")
                })?),
            ),
            other => {
                return Err(ApiError::invalid(
                    "action",
                    format!(
                "`{other}` is not an action; expected resolve, skip, assign or ready_for_replay"
            ),
                ))
            }
        };
    let text = text
        .map(|t| short("reason", &t, MAX_NOTE_BYTES))
        .transpose()?;
    if kind == GroupActionKind::Skip && text.is_none() {
        return Err(ApiError::invalid(
            "reason",
            "missing: skipping needs a reason",
        ));
    }
    let items = state
        .store
        .writer
        .group_action(GroupAction {
            chosen: Chosen::Group(fingerprint),
            actor: caller.actor("api"),
            at_ms: chrono::Utc::now().timestamp_millis(),
            kind,
            text,
        })
        .await?;
    let changed = items.iter().filter(|i| i.ok).count();
    tracing::info!(%fingerprint, action = b.action, changed, refused = items.len() - changed, "group action");
    Ok(Json(json!({
        "fingerprint": fingerprint,
        "action": b.action,
        "changed": changed,
        "refused": items.len() - changed,
        "results": items,
    }))
    .into_response())
}

/// Ask again: fetch this Error Trigger record's execution from n8n's API on the enricher's next
/// round (after n8n came back, the key was fixed, or to refresh it).
#[utoipa::path(post, path = "/v1/dead-letters/{id}/enrich", tag = "triage",
    params(("id" = String, Path, description = "record id")),
    responses((status = 202, description = "queued for the enricher"), (status = 404, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, description = "not an Error Trigger record with an execution id", body = ErrorBody)))]
pub async fn enrich(
    State(state): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let id = RecordId::parse(&id).map_err(ApiError::not_found)?.get();
    state
        .store
        .writer
        .enrich(crate::store::enrich::Enrich {
            id,
            at_ms: chrono::Utc::now().timestamp_millis(),
            actor: caller.actor("api"),
            result: crate::store::enrich::EnrichResult::Requested,
        })
        .await?;
    let configured = state.config.n8n.enrich && state.config.n8n.api_key.is_some();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "id": id,
            "enrichment": "pending",
            "note": if configured { "the enricher fetches it on its next round" }
                    else { "no n8n API key is configured ([n8n] api_key): nothing will fetch it" },
        })),
    )
        .into_response())
}
