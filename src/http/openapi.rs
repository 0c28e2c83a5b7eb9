//! `GET /openapi.json`: the OpenAPI document, generated from the handlers' `#[utoipa::path]`
//! annotations and the types they exchange. Types built with `json!` in a handler have a
//! schema struct here; a test checks real answers against these schemas, so they cannot drift.

use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::model::{FailureClass, Status};
use crate::store::jobs::{JobCounts, JobItemView, JobStatus, JobView};
use crate::store::{
    AttemptView, DocumentView, EventView, GroupItem, GroupSummary, ListPage, RecordSummary,
};

/// Every error: `{"error":{"code":"…","message":"…"}}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable, machine-readable code (`invalid_field`, `stale_version`, …).
    pub code: String,
    /// What went wrong, naming the field or limit at fault.
    pub message: String,
}

/// n8n's Error Trigger item as n8n emits it; any other field is accepted.
#[derive(Serialize, ToSchema)]
pub struct ErrorTriggerItem {
    /// `{id, url, error, lastNodeExecuted, mode, retryOf, executionContext}`.
    #[schema(value_type = Option<Object>)]
    pub execution: Option<Value>,
    /// `{error, mode}`, when a trigger or activation failed (then there is no `execution`).
    #[schema(value_type = Option<Object>)]
    pub trigger: Option<Value>,
    /// `{id, name}`.
    #[schema(value_type = Option<Object>)]
    pub workflow: Option<Value>,
}

/// A failure from a node's error output or any other producer.
#[derive(Serialize, ToSchema)]
pub struct Envelope {
    /// The failing item (any JSON). Required, as `payload` or as `item`.
    pub payload: Option<Value>,
    pub item: Option<Value>,
    /// The error: an object or a string; default `payload.error`.
    pub error: Option<Value>,
    pub node: Option<String>,
    pub node_type: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub workflow: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub execution: Option<Value>,
    pub http_status: Option<u16>,
    pub partition: Option<String>,
    pub idempotency_key: Option<String>,
    pub external_event_id: Option<String>,
    pub correlation_id: Option<String>,
    pub tenant_id: Option<String>,
    pub contract_version: Option<String>,
    pub business_object_type: Option<String>,
    pub business_object_id: Option<String>,
    pub replay_url: Option<String>,
}

/// What ingest did: 201 created, or 200 deduplicated into an open record.
#[derive(Serialize, ToSchema)]
pub struct IngestAnswer {
    pub id: i64,
    pub status: Status,
    pub deduplicated: bool,
    pub occurrences: i64,
    /// New records only.
    pub failure_class: Option<FailureClass>,
    /// New records only.
    pub fingerprint: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct BatchResult {
    pub index: i64,
    /// created | deduplicated | rejected
    pub result: String,
    pub id: Option<i64>,
    pub status: Option<Status>,
    pub deduplicated: Option<bool>,
    pub occurrences: Option<i64>,
    pub failure_class: Option<FailureClass>,
    pub fingerprint: Option<String>,
    pub error: Option<ErrorDetail>,
}

#[derive(Serialize, ToSchema)]
pub struct BatchAnswer {
    pub created: i64,
    pub deduplicated: i64,
    pub rejected: i64,
    pub results: Vec<BatchResult>,
}

/// One record with its documents, payload versions, audit events and delivery attempts.
#[derive(Serialize, ToSchema)]
pub struct RecordDetail {
    #[serde(flatten)]
    pub summary: RecordSummary,
    /// The payload a replay would send (newest version), exactly as stored.
    pub payload: Option<Value>,
    pub payload_info: Option<DocumentView>,
    pub payload_versions: Vec<DocumentView>,
    /// The producer's error object, redacted.
    pub error: Option<Value>,
    pub events: Vec<EventView>,
    pub deliveries: Vec<AttemptView>,
    pub enrichment: crate::store::Enrichment,
}

/// PATCH body: any of these.
#[derive(Serialize, ToSchema)]
pub struct Patch {
    pub status: Option<Status>,
    /// Why (required to skip and to reopen).
    pub reason: Option<String>,
    /// `null` takes the owner away.
    pub owner: Option<String>,
    pub note: Option<String>,
    pub tags: Option<Vec<String>>,
    /// A new payload version, any JSON (needs the version: If-Match or `version`).
    pub payload: Option<Value>,
    pub version: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct Groups {
    pub groups: Vec<GroupSummary>,
}

#[derive(Serialize, ToSchema)]
pub struct GroupActionBody {
    /// resolve | skip | assign | ready_for_replay
    pub action: String,
    pub reason: Option<String>,
    /// For assign.
    pub owner: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct GroupActionAnswer {
    pub fingerprint: String,
    pub action: String,
    pub changed: i64,
    pub refused: i64,
    pub results: Vec<GroupItem>,
}

#[derive(Serialize, ToSchema)]
pub struct ReplayRequest {
    pub ids: Option<Vec<i64>>,
    /// The list filters (status, partition, workflow, failure_class, fingerprint, since, until, q).
    #[schema(value_type = Option<Object>)]
    pub filter: Option<Value>,
    /// Required with a filter.
    pub expected_count: Option<i64>,
    pub dry_run: Option<bool>,
    pub new_keys: Option<bool>,
    pub batch_size: Option<i64>,
    pub stop_failure_ratio: Option<f64>,
}

/// A replay job with what it waits for now, if anything ("paused: breaker open …").
#[derive(Serialize, ToSchema)]
pub struct Job {
    #[serde(flatten)]
    pub job: JobView,
    pub note: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct DryRun {
    pub dry_run: bool,
    pub count: i64,
    pub would_send: i64,
    pub would_skip: i64,
    /// Per record: id, status, partition, target, idempotency_key, supersedes,
    /// payload_version, diff_from_original (RFC 6902), would_skip.
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<Value>,
}

#[derive(Serialize, ToSchema)]
pub struct Targets {
    pub delivery_enabled: bool,
    #[schema(value_type = Vec<Object>)]
    pub configured: Vec<Value>,
    #[schema(value_type = Vec<Object>)]
    pub live: Vec<Value>,
}

#[derive(Serialize, ToSchema)]
pub struct Health {
    pub status: String,
    #[schema(value_type = Option<Object>)]
    pub checks: Option<Value>,
    /// /readyz: what the last call to n8n's API found ("not used" without an API key).
    pub n8n_api: Option<String>,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "deadletter",
        description = "The dead-letter queue of a small self-hosted n8n installation. With API tokens configured, every /v1 endpoint needs `Authorization: Bearer <token>`."
    ),
    paths(
        super::ingest::error_trigger,
        super::ingest::envelope,
        super::ingest::batch,
        super::read::list,
        super::read::show,
        super::read::payload,
        super::triage::patch,
        super::triage::groups,
        super::triage::group_action,
        super::read::targets,
        super::replays::create,
        super::replays::show,
        super::replays::act,
        super::retention::erase,
        super::retention::tombstones,
        super::retention::status,
        super::metrics::metrics,
        super::metrics::stats,
        super::triage::enrich,
        super::read::healthz,
        super::read::readyz,
    ),
    components(schemas(
        ErrorBody, ErrorDetail, ErrorTriggerItem, Envelope, IngestAnswer, BatchResult, BatchAnswer,
        RecordSummary, ListPage, RecordDetail, DocumentView, EventView, AttemptView, Patch, Groups,
        GroupSummary, GroupActionBody, GroupActionAnswer, GroupItem, ReplayRequest, Job, JobView,
        JobItemView, JobCounts, JobStatus, DryRun, Targets, Health, Status, FailureClass,
        super::retention::Erased, super::retention::Tombstones, crate::store::retention::TombstoneView,
        crate::store::retention::RetentionStatus, crate::store::retention::PartitionRetention,
        crate::store::stats::Stats, crate::store::stats::PartitionStats, crate::store::stats::TopFingerprint,
        crate::store::stats::TopWorkflow, crate::store::stats::Resolution, crate::store::stats::Slo
    )),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

pub async fn document() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}
