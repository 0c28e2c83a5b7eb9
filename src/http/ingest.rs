//! Ingest handlers: `POST /v1/n8n/error-trigger`, `POST /v1/dead-letters` and its batch form.
//! A `201` is sent only after the writer committed the record to disk.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::openapi::{BatchAnswer, Envelope, ErrorBody, ErrorTriggerItem, IngestAnswer};
use super::{ApiError, AppState, Caller};
use crate::ingest::{Ingestor, RequestContext};
use crate::model::{
    FailureClass, Fingerprint, InputError, Partition, ShortText, Source, MAX_KEY_BYTES,
};
use crate::store::{IngestOutcome, NewRecord};

/// Bodies above this are prepared on a blocking thread rather than the async runtime.
const INLINE_PREPARE_BYTES: usize = 256 * 1024;

#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct IngestQuery {
    partition: Option<String>,
    idempotency_key: Option<String>,
}

/// n8n's Error Trigger item, exactly as n8n emits it.
#[utoipa::path(post, path = "/v1/n8n/error-trigger", tag = "ingest", params(IngestQuery),
    request_body(content = ErrorTriggerItem, content_type = "application/json"),
    responses((status = 201, description = "stored (on disk)", body = IngestAnswer),
        (status = 200, description = "a repeat of an open record: its occurrences went up", body = IngestAnswer),
        (status = 400, description = "not JSON", body = ErrorBody), (status = 401, description = "no or bad token", body = ErrorBody), (status = 403, description = "the token's role does not allow it", body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 507, description = "the disk is full", body = ErrorBody)))]
pub async fn error_trigger(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<IngestQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    ingest_one(state, caller, Source::ErrorTrigger, query, headers, body).await
}

/// A generic envelope: a node's error-output item or any producer's failure.
#[utoipa::path(post, path = "/v1/dead-letters", tag = "ingest", params(IngestQuery),
    request_body(content = Envelope, content_type = "application/json"),
    responses((status = 201, description = "stored (on disk)", body = IngestAnswer),
        (status = 200, description = "a repeat of an open record", body = IngestAnswer),
        (status = 400, description = "not JSON", body = ErrorBody), (status = 401, description = "no or bad token", body = ErrorBody), (status = 403, description = "the token's role does not allow it", body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 507, body = ErrorBody)))]
pub async fn envelope(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<IngestQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    ingest_one(state, caller, Source::Envelope, query, headers, body).await
}

async fn ingest_one(
    state: AppState,
    caller: Caller,
    source: Source,
    query: Result<Query<IngestQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (ctx, body) = request_parts(&state, &caller, query, &headers, body)?;
    let now = now_ms();
    let ingestor = state.ingestor.clone();
    let rec = if body.len() <= INLINE_PREPARE_BYTES {
        ingestor.prepare(source, &body, &ctx, now)?
    } else {
        tokio::task::spawn_blocking(move || ingestor.prepare(source, &body, &ctx, now))
            .await
            .map_err(|_| ApiError::internal())??
    };
    let summary = Created::of(&rec);
    let outcome = state.store.writer.ingest(rec).await?;
    summary.count(&outcome);
    tracing::info!(
        id = outcome.id.get(),
        source = source.as_str(),
        class = summary.class.as_str(),
        deduplicated = !outcome.created,
        "ingested"
    );
    Ok(answer(&outcome, &summary))
}

/// What the answer says about a new record beyond the writer's outcome.
struct Created {
    class: FailureClass,
    fingerprint: Fingerprint,
    partition: String,
    credential_incident: bool,
}

impl Created {
    fn of(rec: &NewRecord) -> Created {
        Created {
            class: rec.failure_class,
            fingerprint: rec.fingerprint,
            partition: rec.partition.to_string(),
            credential_incident: rec.credential_incident,
        }
    }

    /// Count the outcome into the metrics.
    fn count(&self, o: &IngestOutcome) {
        crate::metrics::METRICS.ingested(
            &self.partition,
            self.class.as_str(),
            o.created,
            self.credential_incident,
        );
    }
}

/// One ingest result, as the single endpoints answer it and each batch result carries it.
fn outcome_json(o: &IngestOutcome, c: &Created) -> serde_json::Value {
    let mut v = json!({
        "id": o.id, "status": o.status, "deduplicated": !o.created, "occurrences": o.occurrences,
    });
    if o.created {
        v["failure_class"] = json!(c.class);
        v["fingerprint"] = json!(c.fingerprint);
    }
    v
}

fn answer(o: &IngestOutcome, c: &Created) -> Response {
    let status = if o.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, Json(outcome_json(o, c))).into_response()
}

/// An array of envelopes; one result per item; one bad item never sinks the rest.
#[utoipa::path(post, path = "/v1/dead-letters/batch", tag = "ingest", params(IngestQuery),
    request_body(content = Vec<Envelope>, content_type = "application/json"),
    responses((status = 200, body = BatchAnswer), (status = 400, description = "not JSON", body = ErrorBody), (status = 401, description = "no or bad token", body = ErrorBody), (status = 403, description = "the token's role does not allow it", body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn batch(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<IngestQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (ctx, body) = request_parts(&state, &caller, query, &headers, body)?;
    let max = state.config.server.batch_max_items;
    let ingestor = state.ingestor.clone();
    let now = now_ms();
    // Every element is parsed and validated on its own; one bad element never sinks the rest.
    let prepared = tokio::task::spawn_blocking(
        move || -> Result<Vec<Result<NewRecord, InputError>>, ApiError> {
            let items = Ingestor::split_batch(&body)?;
            if items.is_empty() {
                return Err(ApiError::invalid("$", "the batch is empty"));
            }
            if items.len() > max {
                return Err(ApiError::too_large(format!(
                    "the batch has {} items; at most {max} are accepted (server.batch_max_items)",
                    items.len()
                )));
            }
            Ok(items
                .iter()
                .map(|raw| ingestor.prepare(Source::Envelope, raw.get().as_bytes(), &ctx, now))
                .collect())
        },
    )
    .await
    .map_err(|_| ApiError::internal())??;

    // Valid elements go to the writer together and in order, so they share a commit and a
    // repeat later in the batch deduplicates against an earlier one.
    let mut summaries = Vec::with_capacity(prepared.len());
    let mut records = Vec::new();
    for p in prepared {
        summaries.push(p.map(|rec| {
            let summary = Created::of(&rec);
            records.push(rec);
            summary
        }));
    }
    let mut outcomes = state.store.writer.ingest_many(records).await.into_iter();
    let (mut created, mut deduplicated, mut rejected) = (0, 0, 0);
    let mut results = Vec::with_capacity(summaries.len());
    for (index, s) in summaries.into_iter().enumerate() {
        let outcome = s.map_err(ApiError::from).and_then(|summary| {
            let o = outcomes
                .next()
                .unwrap_or(Err(crate::store::StoreError::WriterGone));
            o.map(|o| (summary, o)).map_err(ApiError::from)
        });
        results.push(match outcome {
            Ok((summary, o)) => {
                summary.count(&o);
                let mut v = outcome_json(&o, &summary);
                v["index"] = json!(index);
                v["result"] = if o.created {
                    created += 1;
                    json!("created")
                } else {
                    deduplicated += 1;
                    json!("deduplicated")
                };
                v
            }
            Err(e) => {
                rejected += 1;
                json!({"index": index, "result": "rejected", "error": e.body()})
            }
        });
    }
    tracing::info!(created, deduplicated, rejected, "ingested batch");
    Ok((
        StatusCode::OK,
        Json(json!({"created": created, "deduplicated": deduplicated, "rejected": rejected, "results": results})),
    )
        .into_response())
}

/// Check content type and size, and read partition / idempotency key / actor from the query
/// string and headers.
fn request_parts(
    state: &AppState,
    caller: &Caller,
    query: Result<Query<IngestQuery>, QueryRejection>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(RequestContext, Bytes), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if !(mime == "application/json"
        || (mime.starts_with("application/") && mime.ends_with("+json")))
    {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "send the body as JSON with `Content-Type: application/json` (got {})",
                if ct.is_empty() {
                    "none".to_owned()
                } else {
                    format!("`{ct}`")
                }
            ),
        ));
    }
    let body = body.map_err(|e| super::body_error(e, state.config.server.body_limit_bytes))?;
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("bad query string: {e}")))?;
    let header_str = |name: &str| -> Result<Option<String>, ApiError> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .map(|s| Some(s.to_owned()))
                .map_err(|_| ApiError::bad_request(format!("header {name} is not visible ASCII"))),
        }
    };
    let partition = match q.partition.or(header_str("x-deadletter-partition")?) {
        Some(p) => Some(Partition::parse(&p).map_err(|m| ApiError::invalid("partition", m))?),
        None => None,
    };
    let idempotency_key = match q.idempotency_key.or(header_str("idempotency-key")?) {
        Some(k) => Some(
            ShortText::parse("idempotency_key", &k, MAX_KEY_BYTES)
                .map_err(|m| ApiError::invalid("idempotency_key", m))?,
        ),
        None => None,
    };
    let actor = caller.actor("ingest");
    Ok((
        RequestContext {
            partition,
            idempotency_key,
            actor,
        },
        body,
    ))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
