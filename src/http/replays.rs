//! Replay jobs over HTTP: `POST /v1/replays` (ids, or a filter with the count the operator
//! expects; `dry_run` shows what would happen and sends nothing), `GET /v1/replays/{id}`, and
//! `POST /v1/replays/{id}/{approve|pause|resume|cancel}`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::openapi::{DryRun, ErrorBody, Job, ReplayRequest};
use super::read::{filter_from, read, ListQuery};
use super::triage::json_body;
use super::{ApiError, AppState, Caller};
use crate::model::Status;
use crate::replay::Targets;
use crate::store::jobs::{JobMove, JobStatus, NewJob};
use crate::store::{RecordSummary, StoreError};

/// A replay request: from the API's JSON body, or from the web page's form.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayBody {
    #[serde(default)]
    pub ids: Option<Vec<i64>>,
    /// The list endpoint's filters (status, partition, workflow, failure_class, …).
    #[serde(default)]
    pub filter: Option<ListQuery>,
    #[serde(default)]
    pub expected_count: Option<usize>,
    #[serde(default)]
    pub dry_run: bool,
    /// Send with new idempotency keys (naming the old ones in X-Deadletter-Supersedes).
    #[serde(default)]
    pub new_keys: bool,
    #[serde(default)]
    pub batch_size: Option<usize>,
    #[serde(default)]
    pub stop_failure_ratio: Option<f64>,
}

/// Who asks: the name the audit trail shows, and the token's name (the identity the two-person
/// rule compares) when tokens are in use.
pub(super) struct Asker {
    pub actor: String,
    pub token: Option<String>,
}

/// What a request started: a dry run's report (sends nothing), or a job.
pub(super) enum Started {
    DryRun(Value),
    Job(i64),
}

/// The records a request names, oldest first, or why it is refused.
async fn select(state: &AppState, b: &mut ReplayBody) -> Result<Vec<RecordSummary>, ApiError> {
    let max = state.config.replay.max_items;
    let readers = state.store.readers.clone();
    match (b.ids.take(), b.filter.take()) {
        (Some(_), Some(_)) => Err(ApiError::invalid("ids", "give ids or a filter, not both")),
        (None, None) => Err(ApiError::invalid(
            "ids",
            "missing: name the records (ids) or give a filter with the count you expect; there is no \"replay everything\"",
        )),
        (Some(ids), None) => {
            if ids.is_empty() || ids.len() > max {
                return Err(ApiError::invalid("ids", format!("give 1 to {max} ids")));
            }
            let mut unique = ids.clone();
            unique.sort_unstable();
            unique.dedup();
            read(&readers, move |p| unique.iter().map(|id| p.summary(*id)).collect()).await
        }
        (None, Some(f)) => {
            let Some(expected) = b.expected_count else {
                return Err(ApiError::invalid(
                    "expected_count",
                    "missing: a filter needs the number of records you expect it to match",
                ));
            };
            let mut filter = filter_from(f)?;
            filter.limit = max + 1;
            filter.before_id = None;
            let page = read(&readers, move |p| p.list(&filter)).await?;
            let mut items = page.items;
            if items.len() > max {
                return Err(ApiError::too_large(format!(
                    "the filter matches more than {max} records (replay.max_items); narrow it"
                )));
            }
            if items.len() != expected {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "count_mismatch",
                    format!(
                        "the filter matches {} record(s) now, not the {expected} you expected; look again before replaying",
                        items.len()
                    ),
                ));
            }
            items.reverse();
            Ok(items)
        }
    }
}

/// Start a replay job (ids, or a filter with the expected count), or a dry run.
#[utoipa::path(post, path = "/v1/replays", tag = "delivery",
    request_body(content = ReplayRequest, content_type = "application/json"),
    responses((status = 201, description = "the job", body = Job), (status = 200, description = "a dry run", body = DryRun),
        (status = 409, description = "the filter matches another count", body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 400, description = "not JSON", body = ErrorBody), (status = 401, description = "no or bad token", body = ErrorBody), (status = 403, description = "the token's role does not allow it", body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b: ReplayBody = json_body(body, &headers, state.config.server.body_limit_bytes)?;
    let asker = Asker {
        actor: caller.actor("api"),
        token: caller.token(),
    };
    match start(&state, &asker, b).await? {
        Started::DryRun(report) => Ok(Json(report).into_response()),
        Started::Job(id) => {
            let view = job_json(&state, id).await?;
            Ok((StatusCode::CREATED, Json(view)).into_response())
        }
    }
}

/// Check a request, then report a dry run or create the job (the API and the web page).
pub(super) async fn start(
    state: &AppState,
    asker: &Asker,
    mut b: ReplayBody,
) -> Result<Started, ApiError> {
    let who = asker.actor.clone();
    let ratio = b
        .stop_failure_ratio
        .unwrap_or(state.config.replay.stop_failure_ratio);
    if !(0.0..=1.0).contains(&ratio) {
        return Err(ApiError::invalid(
            "stop_failure_ratio",
            "must be from 0 to 1",
        ));
    }
    let batch_size = b.batch_size.unwrap_or(state.config.replay.batch_size);
    if batch_size == 0 || batch_size > 1000 {
        return Err(ApiError::invalid("batch_size", "must be from 1 to 1000"));
    }
    // The request as given, kept with the job: which ids, or which filter and how many.
    let spec = json!({"ids": b.ids, "filter": b.filter, "expected_count": b.expected_count});
    let records = select(state, &mut b).await?;
    if b.dry_run {
        return Ok(Started::DryRun(dry_run(state, records, b.new_keys).await?));
    }
    let name = who.clone();
    let open = read(&state.store.readers, move |p| p.open_jobs_of(&name)).await?;
    if open >= state.config.replay.max_open_jobs_per_actor as i64 {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_jobs",
            format!(
                "{who} has {open} replay job(s) open already (replay.max_open_jobs_per_actor); let one finish, or cancel it"
            ),
        ));
    }
    let needs_approval = records
        .iter()
        .any(|r| state.config.replay.require_approval.contains(&r.partition));
    let id = state
        .store
        .writer
        .create_job(NewJob {
            actor: who.clone(),
            token: asker.token.clone(),
            at_ms: chrono::Utc::now().timestamp_millis(),
            record_ids: records.iter().map(|r| r.id).collect(),
            needs_approval,
            new_keys: b.new_keys,
            batch_size: batch_size as i64,
            stop_failure_ratio: ratio,
            spec,
        })
        .await?;
    tracing::info!(
        job = id,
        items = records.len(),
        actor = who,
        needs_approval,
        "replay job created"
    );
    if let Some(s) = &state.scheduler {
        s.wake_jobs();
    }
    Ok(Started::Job(id))
}

/// Per item: where it would go, with which key and payload version, how the payload differs
/// from the original, and whether it would be skipped. Sends nothing, stores nothing.
async fn dry_run(
    state: &AppState,
    records: Vec<RecordSummary>,
    new_keys: bool,
) -> Result<Value, ApiError> {
    let targets = Targets::new(&state.config);
    let readers = state.store.readers.clone();
    let items = tokio::task::spawn_blocking(move || -> Result<Vec<Value>, StoreError> {
        let mut out = Vec::new();
        for r in records {
            let original_key = r
                .facts
                .idempotency_key
                .clone()
                .unwrap_or_else(|| format!("deadletter-{}", r.id));
            let key = if new_keys {
                format!("{original_key}-replay-<job>")
            } else {
                original_key.clone()
            };
            let current = readers.payload(r.id, r.payload_version)?;
            let first = readers.payload(r.id, Some(1))?;
            let value: Option<Value> = current
                .as_ref()
                .and_then(|p| serde_json::from_str(&p.json).ok());
            let target = targets.resolve(&r, value.as_ref());
            let diff = match (&first, &value) {
                (Some(f), Some(v)) => serde_json::from_str::<Value>(&f.json)
                    .ok()
                    .map(|f| serde_json::to_value(json_patch::diff(&f, v)).unwrap_or_default()),
                _ => None,
            };
            let skip = if !r.status.is_open() {
                Some(format!(
                    "the record is {}: reopen it to replay it",
                    r.status
                ))
            } else if matches!(r.status, Status::Retrying | Status::Replaying) {
                Some(format!("the record is being sent ({})", r.status))
            } else if let Some(other) = (!new_keys)
                .then(|| readers.key_succeeded(&key))
                .transpose()?
                .flatten()
            {
                Some(format!(
                    "idempotency key {key} was already delivered (record {other})"
                ))
            } else if current.is_none() {
                Some("no payload to send".into())
            } else if target.is_none() {
                Some("no replay target".into())
            } else {
                None
            };
            out.push(json!({
                "id": r.id, "status": r.status, "partition": r.partition,
                "target": target.map(|t| json!({"name": t.name, "url": t.url})),
                "idempotency_key": key,
                "supersedes": new_keys.then_some(original_key),
                "payload_version": r.payload_version,
                "diff_from_original": diff,
                "would_skip": skip,
            }));
        }
        Ok(out)
    })
    .await
    .map_err(|_| ApiError::internal())??;
    let skipped = items.iter().filter(|i| !i["would_skip"].is_null()).count();
    Ok(json!({
        "dry_run": true, "count": items.len(), "would_send": items.len() - skipped,
        "would_skip": skipped, "items": items,
    }))
}

/// A job as the API shows it: the stored job, and what its runner waits for now.
async fn job_json(state: &AppState, id: i64) -> Result<Value, ApiError> {
    let job = read(&state.store.readers, move |p| p.job(id)).await?;
    let mut v = serde_json::to_value(&job).map_err(|_| ApiError::internal())?;
    v["note"] = json!(runner_note(state, id, job.status));
    Ok(v)
}

/// What the job's runner waits for now ("paused: breaker open"), if anything.
pub(super) fn runner_note(state: &AppState, id: i64, status: JobStatus) -> Option<String> {
    match &state.scheduler {
        Some(s) => s.job_note(id),
        None if status == JobStatus::Running => {
            Some("delivery is disabled ([delivery] enabled = false): the job waits".into())
        }
        None => None,
    }
}

#[utoipa::path(get, path = "/v1/replays/{id}", tag = "delivery", params(("id" = i64, Path)),
    responses((status = 200, body = Job), (status = 404, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::not_found(format!("no replay job {id}")))?;
    Ok(Json(job_json(&state, id).await?).into_response())
}

/// approve (admin, a second person), pause, resume or cancel a job.
#[utoipa::path(post, path = "/v1/replays/{id}/{action}", tag = "delivery",
    params(("id" = i64, Path), ("action" = String, Path, description = "approve | pause | resume | cancel")),
    responses((status = 200, body = Job), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn act(
    State(state): State<AppState>,
    Path((id, action)): Path<(String, String)>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::not_found(format!("no replay job {id}")))?;
    if action == "approve" {
        caller.require(crate::model::Role::Admin)?;
    }
    let asker = Asker {
        actor: caller.actor("api"),
        token: caller.token(),
    };
    move_job(&state, &asker, id, &action).await?;
    Ok(Json(job_json(&state, id).await?).into_response())
}

/// approve, pause, resume or cancel (the API and the web page; each checks the role first).
pub(super) async fn move_job(
    state: &AppState,
    asker: &Asker,
    id: i64,
    action: &str,
) -> Result<(), ApiError> {
    let to = match action {
        "approve" | "resume" => JobStatus::Running,
        "pause" => JobStatus::Paused,
        "cancel" => JobStatus::Cancelled,
        other => {
            return Err(ApiError::not_found(format!(
                "no action `{other}`; use approve, pause, resume or cancel"
            )))
        }
    };
    let job = read(&state.store.readers, move |p| p.job(id)).await?;
    // approve only approves; resume only resumes.
    let fits = match action {
        "approve" => job.status == JobStatus::AwaitingApproval,
        "resume" => job.status == JobStatus::Paused,
        _ => true,
    };
    if !fits {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "illegal_job_move",
            format!(
                "replay job {id} is {}; it cannot be {action}d",
                job.status.as_str()
            ),
        ));
    }
    state
        .store
        .writer
        .move_job(JobMove {
            id,
            actor: asker.actor.clone(),
            token: asker.token.clone(),
            at_ms: chrono::Utc::now().timestamp_millis(),
            to,
            reason: None,
        })
        .await
        .map_err(|e| match e {
            StoreError::Invalid(m) => ApiError::new(StatusCode::CONFLICT, "illegal_job_move", m),
            other => ApiError::from(other),
        })?;
    tracing::info!(job = id, action, actor = asker.actor, "replay job moved");
    if let Some(s) = &state.scheduler {
        s.wake_jobs();
    }
    Ok(())
}
