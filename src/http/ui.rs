//! The admin web page at `/ui`: server-rendered (maud: templates compiled into the binary,
//! every value HTML-escaped), one embedded stylesheet, no JavaScript. Sign-in with an API token
//! of role operator or admin starts a session (an HttpOnly, SameSite=Strict cookie; sessions live
//! in memory for 12 hours); every form carries the session's CSRF token; every answer carries a
//! Content-Security-Policy that allows nothing but this server's stylesheet and its own forms.
//! Actions go through the same writer and audit trail as the API, as the signed-in name.
//! With no API tokens configured (the open, loopback-only mode) there is no sign-in.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde::Deserialize;

use super::read::{filter_from, read, ListQuery};
use super::AppState;
use crate::model::{Role, Status};
use crate::store::{Change, GroupAction, GroupActionKind, GroupFilter, RecordDetail};

const CSS: &str = include_str!("ui.css");
const SESSION_COOKIE: &str = "dl_session";
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
pub const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

#[derive(Clone, Debug)]
struct Session {
    name: String,
    csrf: String,
    expires: Instant,
}

/// Signed-in sessions, by cookie value.
static SESSIONS: LazyLock<Mutex<HashMap<String, Session>>> = LazyLock::new(Default::default);

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

/// Who is looking: a session, or the open mode's local user.
#[derive(Clone, Debug)]
struct Viewer {
    name: String,
    csrf: String,
    session: Option<String>,
}

fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

/// The open mode's CSRF token: one per process (there is no session to hang it on).
static OPEN_CSRF: LazyLock<String> = LazyLock::new(random_hex);

fn viewer(state: &AppState, headers: &HeaderMap) -> Option<Viewer> {
    if state.tokens.is_empty() {
        return Some(Viewer {
            name: "local".into(),
            csrf: OPEN_CSRF.clone(),
            session: None,
        });
    }
    let id = cookie(headers, SESSION_COOKIE)?;
    let mut sessions = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    sessions.retain(|_, s| s.expires > now);
    let s = sessions.get(&id)?;
    Some(Viewer {
        name: s.name.clone(),
        csrf: s.csrf.clone(),
        session: Some(id),
    })
}

/// Every UI answer: no caching, the CSP, no framing, no sniffing.
pub async fn secure_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/ui", get(overview))
        .route("/ui/", get(overview))
        .route("/ui/static/app.css", get(css))
        .route("/ui/signin", get(signin_page).post(signin))
        .route("/ui/signout", post(signout))
        .route("/ui/records", get(list))
        .route("/ui/records/{id}", get(detail))
        .route("/ui/records/{id}/act", post(act))
        .route("/ui/records/{id}/edit", post(edit))
        .route("/ui/groups", get(groups))
        .route("/ui/groups/{fingerprint}/act", post(group_act))
        .layer(axum::middleware::from_fn(secure_headers))
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

fn page(title: &str, viewer: Option<&Viewer>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · deadletter" }
                link rel="stylesheet" href="/ui/static/app.css";
            }
            body {
                header {
                    a.brand href="/ui" { "deadletter" }
                    nav {
                        a href="/ui" { "Overview" }
                        a href="/ui/records" { "Records" }
                        a href="/ui/groups" { "Failure groups" }
                    }
                    @if let Some(v) = viewer {
                        div.who {
                            @if v.session.is_some() { "Signed in as " strong { (v.name) } }
                            @else { "Open mode (no API tokens; loopback only)" }
                            @if v.session.is_some() {
                                form method="post" action="/ui/signout" {
                                    input type="hidden" name="csrf" value=(v.csrf);
                                    button type="submit" { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

fn to_signin() -> Response {
    Redirect::to("/ui/signin").into_response()
}

/// Absolute and relative, e.g. "2026-11-30 03:04 UTC (2h ago)".
fn when(t: chrono::DateTime<chrono::Utc>) -> Markup {
    let now = chrono::Utc::now();
    html! { time datetime=(t.to_rfc3339()) title=(t.to_rfc3339()) {
        (t.format("%Y-%m-%d %H:%M UTC")) " (" (crate::text::ago(t, now)) ")"
    } }
}

// ---- sign-in ----

async fn signin_page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if viewer(&state, &headers).is_some() {
        return Redirect::to("/ui").into_response();
    }
    signin_form(None).into_response()
}

fn signin_form(error: Option<&str>) -> Markup {
    page(
        "Sign in",
        None,
        html! {
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form.card method="post" action="/ui/signin" {
                label for="token" { "API token (operator or admin)" }
                input #token type="password" name="token" autocomplete="current-password" required autofocus;
                button type="submit" { "Sign in" }
            }
        },
    )
}

#[derive(Deserialize)]
struct SignIn {
    token: String,
}

async fn signin(State(state): State<AppState>, Form(f): Form<SignIn>) -> Response {
    let Some(id) = state.tokens.find(f.token.trim()) else {
        return (
            StatusCode::UNAUTHORIZED,
            signin_form(Some("That token is not valid.")),
        )
            .into_response();
    };
    if matches!(id.role, Role::Ingest) {
        return (
            StatusCode::FORBIDDEN,
            signin_form(Some(
                "That token has the ingest role; the page needs operator or admin.",
            )),
        )
            .into_response();
    }
    let sid = random_hex();
    SESSIONS.lock().unwrap_or_else(|p| p.into_inner()).insert(
        sid.clone(),
        Session {
            name: id.name.clone(),
            csrf: random_hex(),
            expires: Instant::now() + SESSION_TTL,
        },
    );
    tracing::info!(name = %id.name, "ui: signed in");
    let mut res = Redirect::to("/ui").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{SESSION_COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age={}",
            SESSION_TTL.as_secs()
        ))
        .expect("a cookie of hex"),
    );
    res
}

#[derive(Deserialize)]
struct CsrfOnly {
    /// Missing is refused like wrong (by `csrf_ok`), with the page that says so.
    #[serde(default)]
    csrf: String,
}

async fn signout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<CsrfOnly>,
) -> Response {
    let v = match form_viewer(&state, &headers, &f.csrf) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    if let Some(sid) = v.session {
        SESSIONS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&sid);
    }
    let mut res = to_signin();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("dl_session=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0"),
    );
    res
}

/// The viewer of a form post: signed in (else to the sign-in page) and presenting this
/// session's CSRF token (else the refusal page).
fn form_viewer(state: &AppState, headers: &HeaderMap, csrf: &str) -> Result<Viewer, Box<Response>> {
    let v = viewer(state, headers).ok_or_else(|| Box::new(to_signin()))?;
    if csrf_ok(&v, csrf) {
        Ok(v)
    } else {
        Err(Box::new(forbidden_csrf()))
    }
}

fn csrf_ok(v: &Viewer, presented: &str) -> bool {
    use subtle::ConstantTimeEq;
    !presented.is_empty() && bool::from(v.csrf.as_bytes().ct_eq(presented.as_bytes()))
}

fn back_link(href: &str) -> Markup {
    html! { p { a href=(href) { "Back" } } }
}

/// An action that did not happen: why, and the way back.
fn not_done(status: StatusCode, title: &str, v: &Viewer, why: &str, back: &str) -> Response {
    (
        status,
        page(
            title,
            Some(v),
            html! { p.error role="alert" { (why) } (back_link(back)) },
        ),
    )
        .into_response()
}

fn forbidden_csrf() -> Response {
    (
        StatusCode::FORBIDDEN,
        page("Refused", None, html! { p.error { "This form was not sent from this page (its CSRF token is missing or wrong). Go back, reload and try again." } }),
    )
        .into_response()
}

// ---- overview ----

/// Ingress and resolutions per hour as bars, drawn by the server (no script).
fn chart(ingress: &[i64], closed: &[i64]) -> Markup {
    let max = ingress
        .iter()
        .chain(closed)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let (w, h, bar) = (ingress.len() as f64 * 12.0, 120.0, 5.0);
    html! {
        svg.chart viewBox=(format!("0 0 {w} {}", h + 14.0)) role="img"
            aria-label="Records in (dark) and closed (light) per hour over the last 48 hours" {
            @for (i, (a, b)) in ingress.iter().zip(closed).enumerate() {
                @let x = i as f64 * 12.0;
                @let ha = *a as f64 / max * h;
                @let hb = *b as f64 / max * h;
                rect.in x=(x) y=(h - ha) width=(bar) height=(ha) { title { (a) " in" } }
                rect.out x=(x + bar) y=(h - hb) width=(bar) height=(hb) { title { (b) " closed" } }
            }
            text x="0" y=(h + 12.0) { "48 h ago" }
            text x=(w - 30.0) y=(h + 12.0) { "now" }
        }
    }
}

async fn overview(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(v) = viewer(&state, &headers) else {
        return to_signin();
    };
    let now = chrono::Utc::now().timestamp_millis();
    let money = state.config.metrics.money_partitions.clone();
    let got = read(&state.store.readers, move |p| {
        let s = p.stats(now, &money)?;
        let (i, c) = p.with(|c| crate::store::stats::hourly(c, now, 48))?;
        let g = p.gauges()?;
        Ok((s, i, c, g))
    })
    .await;
    let Ok((s, ingress, closed, g)) = got else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the database could not be read",
        )
            .into_response();
    };
    let gates = state
        .scheduler
        .as_ref()
        .map(|s| s.gates())
        .unwrap_or_default();
    let oldest = g.oldest_open.iter().map(|(_, t)| *t).min();
    page(
        "Overview",
        Some(&v),
        html! {
            section.tiles {
                div.tile { span.n { (s.open) } " open of " (s.total) }
                div.tile { span.n { (s.open_past_sla) } " past their SLA" }
                div.tile { span.n { (s.new_last_hour) } " new in the last hour" }
                div.tile {
                    "Oldest open: "
                    @match oldest { Some(t) => (when(crate::store::ms_to_time(t))), None => "none" }
                }
            }
            h2 { "In and closed per hour, last 48 h" }
            p.small { span.key-in { "■" } " records in · " span.key-out { "■" } " records closed" }
            (chart(&ingress, &closed))
            h2 { "By status" }
            table {
                thead { tr { th { "Status" } th.num { "Records" } } }
                tbody { @for (st, n) in &s.by_status {
                    tr { td { a href=(format!("/ui/records?status={st}")) { (st) } } td.num { (n) } }
                } }
            }
            h2 { "By partition" }
            table {
                thead { tr { th { "Partition" } th.num { "Open" } th.num { "Closed" } } }
                tbody { @for p in &s.partitions {
                    tr {
                        td { a href=(format!("/ui/records?partition={}", crate::text::urlencode(&p.partition))) { (p.partition) } @if p.money_impacting { " $" } }
                        td.num { (p.open) } td.num { (p.closed) }
                    }
                } }
            }
            h2 { "Replay targets" }
            @if gates.is_empty() { p { "No sends yet (or delivery is off)." } } @else {
                table {
                    thead { tr { th { "Target" } th { "Breaker" } th.num { "Rate /s" } th.num { "In flight" } } }
                    tbody { @for g in &gates {
                        tr { td { (g.target) } td { (format!("{:?}", g.breaker).to_lowercase()) } td.num { (format!("{:.1}", g.rate_per_second)) } td.num { (g.in_flight) } }
                    } }
                }
            }
        },
    )
    .into_response()
}

// ---- list ----

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(mut q): Query<ListQuery>,
) -> Response {
    let Some(v) = viewer(&state, &headers) else {
        return to_signin();
    };
    // A filter form sends its empty fields too: empty means "any".
    for f in [
        &mut q.status,
        &mut q.partition,
        &mut q.workflow,
        &mut q.owner,
        &mut q.failure_class,
        &mut q.fingerprint,
        &mut q.since,
        &mut q.until,
        &mut q.q,
        &mut q.cursor,
    ] {
        if f.as_deref().is_some_and(|v| v.trim().is_empty()) {
            *f = None;
        }
    }
    let echo = ListQuery {
        status: q.status.clone(),
        partition: q.partition.clone(),
        workflow: q.workflow.clone(),
        failure_class: q.failure_class.clone(),
        fingerprint: q.fingerprint.clone(),
        q: q.q.clone(),
        ..ListQuery::default()
    };
    let filter = match filter_from(q) {
        Ok(f) => f,
        Err(e) => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                page("Records", Some(&v), html! { p.error { (e.message) } }),
            )
                .into_response()
        }
    };
    let Ok(pg) = read(&state.store.readers, move |p| p.list(&filter)).await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the database could not be read",
        )
            .into_response();
    };
    let field = |name: &str, label: &str, value: &Option<String>| {
        html! {
            label { (label) input type="text" name=(name) value=(value.clone().unwrap_or_default()); }
        }
    };
    page(
        "Records",
        Some(&v),
        html! {
            form.filters method="get" action="/ui/records" {
                (field("status", "Status", &echo.status))
                (field("partition", "Partition", &echo.partition))
                (field("workflow", "Workflow", &echo.workflow))
                (field("failure_class", "Class", &echo.failure_class))
                (field("q", "Message contains", &echo.q))
                button type="submit" { "Filter" }
            }
            table {
                thead { tr { th { "Id" } th { "Status" } th { "Class" } th { "Partition" } th { "Workflow" } th { "Error" } th { "First seen" } } }
                tbody { @for r in &pg.items {
                    tr {
                        td { a href=(format!("/ui/records/{}", r.id)) { (r.id) } }
                        td { (r.status.as_str()) }
                        td { (r.failure_class.as_str()) }
                        td { (r.partition) }
                        td { (r.facts.workflow_name.clone().or(r.facts.workflow_id.clone()).unwrap_or_default()) }
                        td { (crate::text::clip(r.facts.error_message.as_deref().unwrap_or(""), 80)) }
                        td { (when(r.first_seen_at)) }
                    }
                } }
            }
            @if pg.items.is_empty() { p { "Nothing matches." } }
            @if let Some(next) = &pg.next_cursor {
                p { a rel="next" href=(next_page(&echo, &next.to_string())) { "Older records →" } }
            }
        },
    )
    .into_response()
}

/// The same filters, one page further.
fn next_page(q: &ListQuery, cursor: &str) -> String {
    let mut parts = vec![format!("cursor={}", crate::text::urlencode(cursor))];
    for (k, v) in [
        ("status", &q.status),
        ("partition", &q.partition),
        ("workflow", &q.workflow),
        ("failure_class", &q.failure_class),
        ("fingerprint", &q.fingerprint),
        ("q", &q.q),
    ] {
        if let Some(v) = v {
            parts.push(format!("{k}={}", crate::text::urlencode(v)));
        }
    }
    format!("/ui/records?{}", parts.join("&"))
}

// ---- detail ----

fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| json.to_owned())
}

async fn detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(v) = viewer(&state, &headers) else {
        return to_signin();
    };
    let Ok(id) = crate::model::RecordId::parse(&id) else {
        return (
            StatusCode::NOT_FOUND,
            page("Not found", Some(&v), html! { p { "No such record." } }),
        )
            .into_response();
    };
    let id = id.get();
    let d: RecordDetail = match read(&state.store.readers, move |p| p.get(id)).await {
        Ok(d) => d,
        Err(_) => {
            return (
                StatusCode::NOT_FOUND,
                page("Not found", Some(&v), html! { p { "No such record." } }),
            )
                .into_response()
        }
    };
    let r = &d.summary;
    let closed = r.status.is_closed();
    page(
        &format!("Record {}", r.id),
        Some(&v),
        html! {
            dl.meta {
                dt { "Status" } dd { (r.status.as_str()) }
                dt { "Class" } dd { (r.failure_class.as_str()) " (" (r.class_rule) ")" }
                dt { "Partition" } dd { (r.partition) }
                dt { "Workflow" } dd { (r.facts.workflow_name.clone().unwrap_or_default()) " " code { (r.facts.workflow_id.clone().unwrap_or_default()) } }
                dt { "Node" } dd { (r.facts.node_name.clone().unwrap_or_default()) }
                dt { "Occurrences" } dd { (r.occurrences) }
                dt { "First seen" } dd { (when(r.first_seen_at)) }
                dt { "Idempotency key" } dd { code { (r.facts.idempotency_key.clone().unwrap_or_default()) } }
                dt { "Owner" } dd { (r.owner.clone().unwrap_or_default()) }
            }
            h2 { "Error" }
            p.error-message { (r.facts.error_message.clone().unwrap_or_default()) }
            @if let Some(e) = &d.error {
                details { summary { "The whole error object (stack included)" } pre { (pretty(&e.json)) } }
            }
            h2 { "Payload" }
            @match &d.payload {
                Some(p) => { p.small { "Version " (p.version) " of " (d.payload_versions.len()) ", " (p.size) " bytes" } pre.payload { (pretty(&p.json)) } }
                None => p { "No payload (an Error Trigger record carries only the error)." }
            }
            h2 { "Edit the payload" }
            form.card method="post" action=(format!("/ui/records/{}/edit", r.id)) {
                input type="hidden" name="csrf" value=(v.csrf);
                input type="hidden" name="version" value=(r.version);
                label for="json" { "JSON (a new version is saved; the original is kept)" }
                textarea #json name="json" rows="10" spellcheck="false" {
                    (d.payload.as_ref().map(|p| pretty(&p.json)).unwrap_or_default())
                }
                div.buttons { button type="submit" { "Preview the change" } }
            }
            h2 { "Actions" }
            form.card method="post" action=(format!("/ui/records/{}/act", r.id)) {
                input type="hidden" name="csrf" value=(v.csrf);
                input type="hidden" name="version" value=(r.version);
                label for="text" { "Note or reason" }
                textarea #text name="text" rows="2" {}
                div.buttons {
                    button type="submit" name="action" value="note" { "Add note" }
                    button type="submit" name="action" value="assign" { "Assign to (the name above; empty: nobody)" }
                    @if !closed {
                        button type="submit" name="action" value="resolve" { "Resolve" }
                        button type="submit" name="action" value="skip" { "Skip (needs a reason)" }
                    } @else {
                        button type="submit" name="action" value="reopen" { "Reopen (needs a reason)" }
                    }
                }
            }
            h2 { "Audit trail" }
            ol.events { @for e in &d.events {
                li { (when(e.at)) " — " strong { (e.actor) } " " (e.kind)
                    @if let (Some(f), Some(t)) = (&e.from_status, &e.to_status) { " " (f) " → " (t) }
                    @if let Some(det) = &e.detail { " " code { (det.to_string()) } }
                }
            } }
            @if !d.deliveries.is_empty() {
                h2 { "Delivery attempts" }
                table {
                    thead { tr { th { "#" } th { "When" } th { "Target" } th { "Outcome" } th.num { "Status" } th { "Answer" } } }
                    tbody { @for a in &d.deliveries {
                        tr { td { (a.attempt) } td { (when(a.at)) } td { (a.target) } td { (a.outcome) }
                             td.num { (a.status_code.map(|s| s.to_string()).unwrap_or_default()) }
                             td { (a.error.clone().or(a.response_excerpt.clone()).unwrap_or_default()) } }
                    } }
                }
            }
            (PreEscaped(""))
        },
    )
    .into_response()
}

#[derive(Deserialize)]
struct Act {
    #[serde(default)]
    csrf: String,
    action: String,
    #[serde(default)]
    text: String,
    version: Option<i64>,
}

async fn act(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Act>,
) -> Response {
    let v = match form_viewer(&state, &headers, &f.csrf) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let Ok(rid) = crate::model::RecordId::parse(&id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let text = f.text.trim();
    let reason = (!text.is_empty()).then(|| text.to_owned());
    let mut change = Change {
        id: rid.get(),
        actor: format!("{} (ui)", v.name),
        at_ms: chrono::Utc::now().timestamp_millis(),
        expected_version: f.version,
        ..Change::default()
    };
    match f.action.as_str() {
        "note" => change.note = reason,
        "assign" => change.owner = Some(reason),
        "resolve" => change.status = Some((Status::Resolved, reason)),
        "skip" => change.status = Some((Status::Skipped, reason)),
        "reopen" => change.status = Some((Status::Review, reason)),
        _ => return StatusCode::UNPROCESSABLE_ENTITY.into_response(),
    }
    match state.store.writer.change(change).await {
        Ok(_) => Redirect::to(&format!("/ui/records/{}", rid.get())).into_response(),
        Err(e) => not_done(
            StatusCode::CONFLICT,
            "Not done",
            &v,
            &e.to_string(),
            &format!("/ui/records/{}", rid.get()),
        ),
    }
}

// ---- failure groups ----

async fn groups(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(v) = viewer(&state, &headers) else {
        return to_signin();
    };
    let filter = GroupFilter {
        open_only: true,
        limit: 200,
        ..GroupFilter::default()
    };
    let Ok(list) = read(&state.store.readers, move |p| p.groups(&filter)).await else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the database could not be read",
        )
            .into_response();
    };
    page(
        "Failure groups",
        Some(&v),
        html! {
            p.small { "Open records grouped by fingerprint (the same failure in the same place), most recent first. An action applies to every open record of the group, each audited." }
            @if list.is_empty() { p { "No open failures." } }
            @for g in &list {
                section.group {
                    h2 {
                        a href=(format!("/ui/records?fingerprint={}", g.fingerprint)) { code { (g.fingerprint.to_string()) } }
                        " " (g.failure_class.as_str())
                        @if g.poison { " · " strong.error { "poison" } }
                    }
                    p {
                        (g.open) " open of " (g.count)
                        @if let Some(w) = g.workflow_name.clone().or(g.workflow_id.clone()) { " · " (w) }
                        @if let Some(n) = &g.node_name { " → " (n) }
                        " · last " (when(g.last_seen_at))
                    }
                    p.error-message { (crate::text::clip(g.sample_message.as_deref().unwrap_or(""), 200)) }
                    form.card method="post" action=(format!("/ui/groups/{}/act", g.fingerprint)) {
                        input type="hidden" name="csrf" value=(v.csrf);
                        label { "Reason (or the owner, to assign)" input type="text" name="text"; }
                        div.buttons {
                            button type="submit" name="action" value="resolve" { "Resolve all open" }
                            button type="submit" name="action" value="skip" { "Skip all open" }
                            button type="submit" name="action" value="ready_for_replay" { "Mark all ready for replay" }
                            button type="submit" name="action" value="assign" { "Assign all" }
                        }
                    }
                }
            }
        },
    )
    .into_response()
}

#[derive(Deserialize)]
struct GroupAct {
    #[serde(default)]
    csrf: String,
    action: String,
    #[serde(default)]
    text: String,
}

async fn group_act(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(fingerprint): Path<String>,
    Form(f): Form<GroupAct>,
) -> Response {
    let v = match form_viewer(&state, &headers, &f.csrf) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let Ok(fp) = crate::model::Fingerprint::parse(&fingerprint) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let kind = match f.action.as_str() {
        "resolve" => GroupActionKind::Resolve,
        "skip" => GroupActionKind::Skip,
        "assign" => GroupActionKind::Assign,
        "ready_for_replay" => GroupActionKind::ReadyForReplay,
        _ => return StatusCode::UNPROCESSABLE_ENTITY.into_response(),
    };
    let text = f.text.trim();
    let result = state
        .store
        .writer
        .group_action(GroupAction {
            fingerprint: fp,
            actor: format!("{} (ui)", v.name),
            at_ms: chrono::Utc::now().timestamp_millis(),
            kind,
            text: (!text.is_empty()).then(|| text.to_owned()),
        })
        .await;
    let items = match result {
        Ok(items) => items,
        Err(e) => {
            return not_done(
                StatusCode::CONFLICT,
                "Not done",
                &v,
                &e.to_string(),
                "/ui/groups",
            )
        }
    };
    let done = items.iter().filter(|i| i.ok).count();
    page(
        "Group action",
        Some(&v),
        html! {
            p { strong { (done) } " of " (items.len()) " open record(s) changed." }
            table {
                thead { tr { th { "Record" } th { "Now" } th { "Refused because" } } }
                tbody { @for i in &items {
                    tr { td { a href=(format!("/ui/records/{}", i.id)) { (i.id) } } td { (i.status.as_str()) } td { (i.error.clone().unwrap_or_default()) } }
                } }
            }
            p { a href="/ui/groups" { "Back to the groups" } }
        },
    )
    .into_response()
}

// ---- payload edit: preview the diff, then save ----

#[derive(Deserialize)]
struct Edit {
    #[serde(default)]
    csrf: String,
    json: String,
    version: Option<i64>,
    /// "yes" once the operator saw the diff.
    #[serde(default)]
    confirm: String,
}

async fn edit(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<Edit>,
) -> Response {
    let v = match form_viewer(&state, &headers, &f.csrf) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let Ok(rid) = crate::model::RecordId::parse(&id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let id = rid.get();
    let back = format!("/ui/records/{id}");
    let raw: Box<serde_json::value::RawValue> = match serde_json::from_str(&f.json) {
        Ok(r) => r,
        Err(e) => {
            return not_done(
                StatusCode::BAD_REQUEST,
                "Not JSON",
                &v,
                &format!("The payload is not JSON: {e}"),
                &back,
            )
        }
    };
    let pe = match super::triage::payload_edit(&state, id, &raw).await {
        Ok(pe) => pe,
        Err(e) => {
            return not_done(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Not saved",
                &v,
                &e.message,
                &back,
            )
        }
    };
    if f.confirm != "yes" {
        let ops = pe.diff.as_array().map_or(0, Vec::len);
        return page(
            &format!("Record {id}: the change"),
            Some(&v),
            html! {
                @if ops == 0 { p { "Nothing changes." } (back_link(&back)) } @else {
                    p { (ops) " change(s) to version " (pe.base_version.unwrap_or(0)) " (RFC 6902):" }
                    pre.diff { (serde_json::to_string_pretty(&pe.diff).unwrap_or_default()) }
                    form.card method="post" action=(format!("/ui/records/{id}/edit")) {
                        input type="hidden" name="csrf" value=(v.csrf);
                        input type="hidden" name="version" value=(f.version.map(|x| x.to_string()).unwrap_or_default());
                        input type="hidden" name="json" value=(f.json);
                        input type="hidden" name="confirm" value="yes";
                        div.buttons { button type="submit" { "Save as a new version" } }
                    }
                    (back_link(&back))
                }
            },
        )
        .into_response();
    }
    let change = Change {
        id,
        actor: format!("{} (ui)", v.name),
        at_ms: chrono::Utc::now().timestamp_millis(),
        expected_version: f.version,
        payload: Some(pe),
        ..Change::default()
    };
    match state.store.writer.change(change).await {
        Ok(_) => Redirect::to(&format!("/ui/records/{id}")).into_response(),
        Err(e) => not_done(StatusCode::CONFLICT, "Not saved", &v, &e.to_string(), &back),
    }
}
