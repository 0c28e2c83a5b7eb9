//! `ApiError`: every error the API answers, as `{"error":{"code":"…","message":"…"}}`.
//! A 5xx logs its cause and tells the client nothing internal.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::model::InputError;
use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("`{field}`: {message}"),
        )
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    pub fn internal() -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the server log has the details",
        )
    }

    /// The JSON body, also used for one rejected element of a batch.
    pub fn body(&self) -> serde_json::Value {
        json!({"code": self.code, "message": self.message})
    }
}

/// A body that could not be read: too large (413), too slow (408, the request timeout), or
/// broken (400).
pub fn body_error(e: axum::extract::rejection::BytesRejection, limit: usize) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::too_large(format!(
            "the body is larger than {limit} bytes (server.body_limit_bytes)"
        ));
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = cur {
        if err.is::<tower_http::timeout::TimeoutError>() {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the body did not arrive in time (server.request_timeout)",
            );
        }
        cur = err.source();
    }
    ApiError::bad_request(format!("cannot read the body: {}", e.body_text()))
}

impl From<InputError> for ApiError {
    fn from(e: InputError) -> Self {
        match e {
            InputError::Syntax(m) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("the body is not valid JSON: {m}"),
            ),
            InputError::Field { path, message } => ApiError::invalid(&path, message),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) | StoreError::NoGroup(_) | StoreError::NoJob(_) => {
                ApiError::not_found(e.to_string())
            }
            StoreError::Stale { .. } => ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "stale_version",
                e.to_string(),
            ),
            StoreError::IllegalMove(crate::model::MoveError::ReasonRequired { .. }) => {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "reason_required",
                    e.to_string(),
                )
            }
            StoreError::IllegalMove(_) => {
                ApiError::new(StatusCode::CONFLICT, "illegal_transition", e.to_string())
            }
            StoreError::Invalid(m) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_change", m)
            }
            StoreError::DiskFull(_) => {
                tracing::error!(error = %e, "storage: disk full");
                ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "disk_full",
                    "the disk holding the database is full; nothing was stored",
                )
            }
            StoreError::WriterGone => {
                tracing::error!("storage: the writer has stopped");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "storage is shutting down",
                )
            }
            other => {
                tracing::error!(error = %other, "storage error");
                ApiError::internal()
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.body() }))).into_response()
    }
}
