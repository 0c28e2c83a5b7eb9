//! The HTTP API: `router(state)` builds every route; handlers are thin (parse the request,
//! call `ingest` or `store`, shape the answer); `ApiError` turns every failure into JSON.
//! This is the only module that knows status codes; it never sees a rusqlite type.

mod auth;
mod error;
mod ingest;
mod metrics;
pub mod openapi;
mod read;
mod replays;
mod retention;
mod triage;
mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tower_http::trace::TraceLayer;

pub use auth::{Caller, Identity, Tokens};
pub use error::{body_error, ApiError};

use crate::config::Config;
use crate::ingest::Ingestor;
use crate::store::Store;

/// What every handler may use.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Store,
    pub ingestor: Arc<Ingestor>,
    /// The retry scheduler, when delivery is enabled (its gates are shown by /v1/targets).
    pub scheduler: Option<Arc<crate::replay::Scheduler>>,
    /// API tokens (empty: the API is open, on loopback only).
    pub tokens: Tokens,
}

pub fn router(state: AppState) -> Router {
    let body_limit = state.config.server.body_limit_bytes;
    let request_timeout = state.config.server.request_timeout;
    let max_header_bytes = state.config.server.max_header_bytes;
    let api = Router::new()
        .route("/v1/n8n/error-trigger", post(ingest::error_trigger))
        .route(
            "/v1/dead-letters",
            post(ingest::envelope)
                .get(read::list)
                .delete(retention::erase),
        )
        .route("/v1/tombstones", get(retention::tombstones))
        .route("/v1/retention", get(retention::status))
        .route("/v1/stats", get(metrics::stats))
        .route("/v1/dead-letters/batch", post(ingest::batch))
        .route(
            "/v1/dead-letters/{id}",
            get(read::show).patch(triage::patch),
        )
        .route("/v1/groups", get(triage::groups))
        .route("/v1/targets", get(read::targets))
        .route("/v1/replays", post(replays::create))
        .route("/v1/replays/{id}", get(replays::show))
        .route("/v1/replays/{id}/{action}", post(replays::act))
        .route(
            "/v1/groups/{fingerprint}/actions",
            post(triage::group_action),
        )
        .route("/v1/dead-letters/{id}/payload", get(read::payload))
        .route("/v1/dead-letters/{id}/enrich", post(triage::enrich))
        .route("/healthz", get(read::healthz))
        .route("/readyz", get(read::readyz))
        .route("/openapi.json", get(openapi::document))
        .route("/metrics", get(metrics::metrics))
        .merge(ui::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authorize,
        ))
        // Outermost of the route layers: refused requests are counted too.
        .route_layer(axum::middleware::from_fn(metrics::track))
        .with_state(state);
    with_layers(api, body_limit)
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(request_timeout))
        .layer(axum::middleware::from_fn(move |req: Request, next: axum::middleware::Next| async move {
            // hyper's own ceiling is far higher; this one is configurable and says what it is.
            let bytes: usize = req.headers().iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
            if bytes > max_header_bytes {
                return ApiError::new(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "headers_too_large",
                    format!(
                        "the request headers are {bytes} bytes; at most {max_header_bytes} are accepted (server.max_header_bytes)"
                    ),
                )
                .into_response();
            }
            next.run(req).await
        }))
}

/// The layers every route gets; the bench harness wraps its parse-only handler in the same.
pub fn with_layers(router: Router, body_limit: usize) -> Router {
    router
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(
            TraceLayer::new_for_http()
                // Spans are named by the matched route, never the raw path (ids stay out of
                // span names) and never carry bodies.
                .make_span_with(|req: &Request| {
                    let route = req
                        .extensions()
                        .get::<MatchedPath>()
                        .map(|m| m.as_str().to_owned())
                        .unwrap_or_else(|| "unmatched".into());
                    tracing::debug_span!("http", method = %req.method(), route)
                })
                .on_response(
                    |res: &axum::response::Response, latency: Duration, _span: &tracing::Span| {
                        tracing::debug!(
                            status = res.status().as_u16(),
                            micros = latency.as_micros() as u64,
                            "answered"
                        );
                    },
                ),
        )
}
