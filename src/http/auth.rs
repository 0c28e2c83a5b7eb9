//! Who is asking, and may they. With tokens configured, every /v1 route needs
//! `Authorization: Bearer <token>`: the token's sha256 is compared in constant time with every
//! configured digest (no early exit), and the route's method and template decide the role it
//! needs (ingest < operator < admin). `Caller` then names the actor for the audit trail: the
//! token's name, narrowed by an `X-Deadletter-Actor` header ("ana (ops)"). Without tokens the
//! API is open and the header alone names the actor (deadletter then listens on loopback only).

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ApiError, AppState};
use crate::config::AuthConfig;
use crate::model::{Role, ShortText};

/// The configured tokens, as digests, read once at start.
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Arc<Vec<(String, Role, [u8; 32])>>,
}

impl Tokens {
    pub fn resolve(cfg: &AuthConfig) -> Result<Tokens, String> {
        let mut entries = Vec::new();
        for t in &cfg.tokens {
            let digest = t
                .secret
                .digest()
                .map_err(|e| format!("auth token `{}`: {e}", t.name))?;
            entries.push((t.name.clone(), t.role, digest));
        }
        Ok(Tokens {
            entries: Arc::new(entries),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(super) fn find(&self, token: &str) -> Option<Identity> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (name, role, d) in self.entries.iter() {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(Identity {
                    name: name.clone(),
                    role: *role,
                });
            }
        }
        found
    }
}

/// A caller that presented a valid token.
#[derive(Clone, Debug)]
pub struct Identity {
    pub name: String,
    pub role: Role,
}

fn rank(r: Role) -> u8 {
    match r {
        Role::Ingest => 0,
        Role::Operator => 1,
        Role::Admin => 2,
    }
}

/// The least role a route needs.
fn needed(method: &Method, route: &str) -> Role {
    match (method, route) {
        (
            &Method::POST,
            "/v1/n8n/error-trigger" | "/v1/dead-letters" | "/v1/dead-letters/batch",
        ) => Role::Ingest,
        (&Method::POST, "/v1/replays/{id}/{action}") => Role::Operator, // approve: checked by `Caller::require`
        // A scraper's token: any role will do (counts only, never payloads).
        (&Method::GET, "/metrics") => Role::Ingest,
        _ => Role::Operator,
    }
}

fn unauthorized(msg: &str) -> Response {
    let mut r = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", msg).into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    r
}

/// Route layer: authenticate and check the route's role.
pub async fn authorize(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let tokens = &state.tokens;
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    let protected =
        route.starts_with("/v1/") || (route == "/metrics" && state.config.metrics.require_token);
    if tokens.is_empty() || !protected {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(token) = presented else {
        return unauthorized("send `Authorization: Bearer <token>`");
    };
    let Some(identity) = tokens.find(token) else {
        return unauthorized("the token is not valid");
    };
    let need = needed(req.method(), &route);
    if rank(identity.role) < rank(need) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "token `{}` has role {}; this needs {need} or above",
                identity.name, identity.role
            ),
        )
        .into_response();
    }
    req.extensions_mut().insert(identity);
    next.run(req).await
}

/// Who the audit trail says did it.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    pub identity: Option<Identity>,
    pub header: Option<String>,
}

impl Caller {
    /// "ana (ops)", "ops", "ana", or `default` when nobody said.
    pub fn actor(&self, default: &str) -> String {
        match (&self.identity, &self.header) {
            (Some(i), Some(h)) => format!("{h} ({})", i.name),
            (Some(i), None) => i.name.clone(),
            (None, Some(h)) => h.clone(),
            (None, None) => default.to_owned(),
        }
    }

    /// The token's name, when tokens are in use: the identity the two-person rule compares.
    pub fn token(&self) -> Option<String> {
        self.identity.as_ref().map(|i| i.name.clone())
    }

    /// Refuse unless the caller has `role` (always true without tokens).
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        match &self.identity {
            Some(i) if rank(i.role) < rank(role) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("token `{}` has role {}; this needs {role}", i.name, i.role),
            )),
            _ => Ok(()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Caller, ApiError> {
        let header = match parts.headers.get("x-deadletter-actor") {
            None => None,
            Some(v) => {
                let v = v.to_str().map_err(|_| {
                    ApiError::bad_request("header X-Deadletter-Actor is not visible ASCII")
                })?;
                Some(
                    ShortText::parse("X-Deadletter-Actor", v, 128)
                        .map(ShortText::into_string)
                        .map_err(|m| ApiError::invalid("X-Deadletter-Actor", m))?,
                )
            }
        };
        Ok(Caller {
            identity: parts.extensions.get::<Identity>().cloned(),
            header,
        })
    }
}
