//! The admin web page at `/ui`: server-rendered (maud: templates compiled into the binary,
//! every value HTML-escaped), one embedded stylesheet and one small embedded script (live
//! progress on a replay job's page; everything else works with JavaScript off). Sign-in with an
//! API token of role operator or admin starts a session (an HttpOnly, SameSite=Strict cookie;
//! sessions live in memory for 12 hours); every form carries the session's CSRF token; every
//! answer carries a Content-Security-Policy that allows nothing but this server's stylesheet,
//! its script, its own forms and its own fetches. Actions go through the same writer, replay
//! jobs and audit trail as the API, as the signed-in name. With no API tokens configured (the
//! open, loopback-only mode) there is no sign-in.
//!
//! `replay` holds the replay pages (dry run, confirm, jobs, approval, live progress).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::{html, Markup, DOCTYPE};
use serde::Deserialize;

mod replay;

use axum::body::Bytes;

use super::read::{filter_from, read, ListQuery};
use super::{ApiError, AppState};
use crate::model::{Role, Status};
use crate::store::{Change, Chosen, GroupAction, GroupActionKind, GroupFilter, RecordDetail};

const CSS: &str = include_str!("ui.css");
const LIVE_JS: &str = include_str!("live.js");
const SESSION_COOKIE: &str = "dl_session";
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
pub const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

#[derive(Clone, Debug)]
struct Session {
    name: String,
    role: Role,
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
    /// None in the open mode (no tokens: everything is allowed, as over the API).
    role: Option<Role>,
    csrf: String,
    session: Option<String>,
}

impl Viewer {
    /// The name this viewer's actions are audited under.
    fn actor(&self) -> String {
        format!("{} (ui)", self.name)
    }

    fn is_admin(&self) -> bool {
        self.role.is_none_or(|r| r == Role::Admin)
    }

    /// For the replay jobs: the audited name, and the token's name (the identity the
    /// two-person rule compares).
    fn asker(&self) -> super::replays::Asker {
        super::replays::Asker {
            actor: self.actor(),
            token: self.session.as_ref().map(|_| self.name.clone()),
        }
    }
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
            role: None,
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
        role: Some(s.role),
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
        .route("/ui/static/live.js", get(live_js))
        .route("/ui/signin", get(signin_page).post(signin))
        .route("/ui/signout", post(signout))
        .route("/ui/records", get(list))
        .route("/ui/records/bulk", post(bulk))
        .route("/ui/records/{id}", get(detail))
        .route("/ui/records/{id}/act", post(act))
        .route("/ui/records/{id}/edit", post(edit))
        .route("/ui/groups", get(groups))
        .route("/ui/groups/{fingerprint}/act", post(group_act))
        .route("/ui/replay", post(replay::request))
        .route("/ui/replays", get(replay::jobs))
        .route("/ui/replays/{id}", get(replay::job))
        .route("/ui/replays/{id}/act", post(replay::job_act))
        .layer(axum::middleware::from_fn(secure_headers))
}

async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS).into_response()
}

async fn live_js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        LIVE_JS,
    )
        .into_response()
}

/// A form body whose fields may repeat (`ids=1&ids=2`: the list's checkboxes).
struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(body: &[u8]) -> Fields {
        Fields(form_urlencoded::parse(body).into_owned().collect())
    }

    /// The first value of a field, or "" when it is absent.
    fn one(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The record ids chosen (repeated `ids` fields); a malformed one is an error.
    fn ids(&self) -> Result<Vec<i64>, String> {
        self.all("ids")
            .map(|s| {
                crate::model::RecordId::parse(s)
                    .map(|id| id.get())
                    .map_err(|_| format!("`{s}` is not a record id"))
            })
            .collect()
    }
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
                script src="/ui/static/live.js" defer {}
            }
            body {
                header {
                    a.brand href="/ui" { "deadletter" }
                    nav {
                        a href="/ui" { "Overview" }
                        a href="/ui/records" { "Records" }
                        a href="/ui/groups" { "Failure groups" }
                        a href="/ui/replays" { "Replays" }
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
            role: id.role,
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

/// What a page could not show, in the API error's words: not found (404), a bad filter (422),
/// or the database failing (500).
fn unreadable(v: &Viewer, e: ApiError) -> Response {
    let title = match e.status {
        StatusCode::NOT_FOUND => "Not found",
        s if s.is_client_error() => "Not shown",
        _ => "Not readable",
    };
    (
        e.status,
        page(
            title,
            Some(v),
            html! { p.error role="alert" { (e.message) } },
        ),
    )
        .into_response()
}

/// What the store refused (a stale version, an illegal move, a missing reason…), with the
/// status and words the API would give.
fn refused(v: &Viewer, title: &str, e: crate::store::StoreError, back: &str) -> Response {
    let e = ApiError::from(e);
    not_done(e.status, title, v, &e.message, back)
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
        let waiting = p.with(crate::store::jobs::awaiting_approval)?;
        Ok((s, i, c, g, waiting))
    })
    .await;
    let (s, ingress, closed, g, waiting) = match got {
        Ok(got) => got,
        Err(e) => return unreadable(&v, e),
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
                @if waiting > 0 {
                    div.tile { a href="/ui/replays" { span.n { (waiting) } " replay job(s) awaiting approval" } }
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
    let echo = filters(&q);
    let filter = match filter_from(q) {
        Ok(f) => f,
        Err(e) => return unreadable(&v, e),
    };
    let pg = match read(&state.store.readers, move |p| p.list(&filter)).await {
        Ok(pg) => pg,
        Err(e) => return unreadable(&v, e),
    };
    let value = |name: &str| {
        echo.iter()
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let text = |name: &str, label: &str, kind: &str| {
        html! {
            label { (label) input type=(kind) name=(name) value=(value(name)); }
        }
    };
    let choice = |name: &str, label: &str, options: Vec<&'static str>| {
        let now = value(name);
        html! {
            label { (label) select name=(name) {
                option value="" { "any" }
                @for o in options { option value=(o) selected[o == now] { (o) } }
            } }
        }
    };
    page(
        "Records",
        Some(&v),
        html! {
            form.filters method="get" action="/ui/records" {
                (choice("status", "Status", Status::ALL.iter().map(|s| s.as_str()).collect()))
                (text("partition", "Partition", "text"))
                (text("workflow", "Workflow", "text"))
                (choice("failure_class", "Class", crate::model::FailureClass::ALL.iter().map(|c| c.as_str()).collect()))
                (text("owner", "Owner", "text"))
                (text("fingerprint", "Fingerprint", "text"))
                (text("since", "Seen since (date)", "date"))
                (text("until", "Seen before (date)", "date"))
                (text("q", "Message contains", "text"))
                button type="submit" { "Filter" }
            }
            form #bulk method="post" action="/ui/records/bulk" {
            input type="hidden" name="csrf" value=(v.csrf);
            table {
                thead { tr {
                    th { input type="checkbox" data-select-all="ids" aria-label="Select every record on this page" hidden; }
                    th { "Id" } th { "Status" } th { "Class" } th { "Partition" } th { "Workflow" } th { "Error" } th { "First seen" }
                } }
                tbody { @for r in &pg.items {
                    tr {
                        td { input type="checkbox" name="ids" value=(r.id) aria-label=(format!("Select record {}", r.id)); }
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
            @if pg.items.is_empty() { p { "Nothing matches." } } @else {
                fieldset.card.bulk {
                    legend { "With the selected records" }
                    label { "Note, reason or owner" input type="text" name="text"; }
                    div.buttons {
                        button type="submit" name="action" value="note" { "Add note" }
                        button type="submit" name="action" value="assign" { "Assign" }
                        button type="submit" name="action" value="resolve" { "Resolve" }
                        button type="submit" name="action" value="skip" { "Skip" }
                        button type="submit" name="action" value="ready_for_replay" { "Mark ready for replay" }
                        button type="submit" formaction="/ui/replay" { "Replay… (dry run first)" }
                    }
                }
            }
            }
            @if let Some(next) = &pg.next_cursor {
                p { a rel="next" href=(next_page(&echo, &next.to_string())) { "Older records →" } }
            }
        },
    )
    .into_response()
}

/// The same filters, one page further.
fn next_page(filters: &[(&str, Option<String>)], cursor: &str) -> String {
    let mut parts = vec![format!("cursor={}", crate::text::urlencode(cursor))];
    for (k, v) in filters {
        if let Some(v) = v {
            parts.push(format!("{k}={}", crate::text::urlencode(v)));
        }
    }
    format!("/ui/records?{}", parts.join("&"))
}

/// The list's filters as given (the API's, but paging), by query key: echoed in the form and
/// carried to the next page.
fn filters(q: &ListQuery) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("status", q.status.clone()),
        ("partition", q.partition.clone()),
        ("workflow", q.workflow.clone()),
        ("owner", q.owner.clone()),
        ("failure_class", q.failure_class.clone()),
        ("fingerprint", q.fingerprint.clone()),
        ("since", q.since.clone()),
        ("until", q.until.clone()),
        ("q", q.q.clone()),
    ]
}

// ---- detail ----

/// The headers of a payload that is n8n's webhook item (redacted at ingest like the rest).
fn webhook_headers(
    payload: Option<&crate::store::DocumentView>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let v: serde_json::Value = serde_json::from_str(&payload?.json).ok()?;
    if !crate::model::delivery::is_webhook_item(&v) {
        return None;
    }
    v.get("headers")?.as_object().cloned()
}

/// How one payload version differs from the one before it, as RFC 6902 operations.
fn version_diff(before: &str, after: &str) -> String {
    match (
        serde_json::from_str::<serde_json::Value>(before),
        serde_json::from_str::<serde_json::Value>(after),
    ) {
        (Ok(a), Ok(b)) => {
            serde_json::to_string_pretty(&json_patch::diff(&a, &b)).unwrap_or_default()
        }
        _ => "(not JSON: no diff)".to_owned(),
    }
}

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
    let id = match crate::model::RecordId::parse(&id) {
        Ok(id) => id.get(),
        Err(e) => return unreadable(&v, ApiError::not_found(e)),
    };
    let got = read(&state.store.readers, move |p| {
        Ok((p.get(id)?, p.payload_history(id)?))
    })
    .await;
    let (d, history): (RecordDetail, Vec<crate::store::DocumentView>) = match got {
        Ok(d) => d,
        Err(e) => return unreadable(&v, e),
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
                @if let Some(st) = &d.enrichment.state {
                    dt { "From n8n" } dd.enrichment {
                        (st)
                        @if let Some(det) = &d.enrichment.detail { " " code { (det.to_string()) } }
                    }
                }
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
            @if let Some(h) = webhook_headers(d.payload.as_ref()) {
                h2 { "Headers the webhook received (secrets redacted)" }
                table.headers {
                    thead { tr { th { "Header" } th { "Value" } } }
                    tbody { @for (k, val) in &h {
                        tr { td { code { (k) } } td { code { (val.as_str().map(str::to_owned).unwrap_or_else(|| val.to_string())) } } }
                    } }
                }
            }
            @if let Some(inputs) = &d.enrichment.failing_node_inputs {
                details {
                    summary { "The failing node's input items, as n8n had them" }
                    pre { (serde_json::to_string_pretty(inputs).unwrap_or_default()) }
                }
            }
            @if history.len() > 1 {
                h2 { "Payload versions" }
                ol.versions {
                    @for (i, doc) in history.iter().enumerate() {
                        li {
                            details open[i + 1 == history.len()] {
                                summary {
                                    "Version " (doc.version)
                                    @if i == 0 { " (the original)" }
                                    " — " (doc.actor) ", " (when(doc.created_at)) ", " (doc.size) " bytes"
                                }
                                @if i > 0 {
                                    p.small { "Changes from version " (history[i - 1].version) " (RFC 6902):" }
                                    pre.diff { (version_diff(&history[i - 1].json, &doc.json)) }
                                }
                                pre { (pretty(&doc.json)) }
                            }
                        }
                    }
                }
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
                    @if d.enrichment.state.is_some() {
                        button type="submit" name="action" value="enrich" { "Fetch from n8n again" }
                    }
                    @if !closed {
                        button type="submit" name="action" value="resolve" { "Resolve" }
                        button type="submit" name="action" value="skip" { "Skip (needs a reason)" }
                    } @else {
                        button type="submit" name="action" value="reopen" { "Reopen (needs a reason)" }
                    }
                }
            }
            h2 { "Replay" }
            form.card method="post" action="/ui/replay" {
                input type="hidden" name="csrf" value=(v.csrf);
                input type="hidden" name="ids" value=(r.id);
                label {
                    input type="checkbox" name="new_keys" value="yes";
                    " Send with a new idempotency key (the target has seen the old one)"
                }
                div.buttons { button type="submit" { "Preview the replay (dry run)" } }
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
                table.attempts {
                    thead { tr { th { "#" } th { "When" } th { "Target" } th { "Key, version" } th { "Outcome" } th.num { "HTTP" } th.num { "ms" } th { "The target's answer" } } }
                    tbody { @for a in &d.deliveries {
                        tr { td { (a.attempt) } td { (when(a.at)) }
                             td { (a.target) br; code.small { (a.url) } }
                             td { code { (a.idempotency_key) } @if let Some(pv) = a.payload_version { " v" (pv) } }
                             td { (a.outcome) }
                             td.num { (a.status_code.map(|s| s.to_string()).unwrap_or_default()) }
                             td.num { (a.latency_ms) }
                             td {
                                 @if let Some(e) = &a.error { span.error { (e) } br; }
                                 @if let Some(x) = &a.response_excerpt { code { (crate::text::clip(x, 300)) } }
                                 @if let Some(ex) = &a.downstream_execution_id { br; "n8n execution " code { (ex) } }
                                 @if let Some(ra) = a.retry_after_ms { br; span.small { "Retry-After " (ra / 1000) " s" } }
                             }
                        }
                    } }
                }
            }
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
    let back = format!("/ui/records/{}", rid.get());
    if f.action == "enrich" {
        let asked = state
            .store
            .writer
            .enrich(crate::store::enrich::Enrich {
                id: rid.get(),
                at_ms: chrono::Utc::now().timestamp_millis(),
                actor: v.actor(),
                result: crate::store::enrich::EnrichResult::Requested,
            })
            .await;
        return match asked {
            Ok(_) => Redirect::to(&back).into_response(),
            Err(e) => refused(&v, "Not done", e, &back),
        };
    }
    let reason = match form_text(&f.text) {
        Ok(t) => t,
        Err(e) => return not_done(e.status, "Not done", &v, &e.message, &back),
    };
    let mut change = Change {
        id: rid.get(),
        actor: v.actor(),
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
        Ok(_) => Redirect::to(&back).into_response(),
        Err(e) => refused(&v, "Not done", e, &back),
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
    let list = match read(&state.store.readers, move |p| p.groups(&filter)).await {
        Ok(list) => list,
        Err(e) => return unreadable(&v, e),
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
    apply_to(&state, &v, Chosen::Group(fp), &f.action, &f.text).await
}

// ---- bulk actions on the records chosen in the list ----

/// The most records one bulk action may name (a page of the list is at most this long).
const BULK_MAX: usize = 500;

async fn bulk(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let f = Fields::parse(&body);
    let v = match form_viewer(&state, &headers, f.one("csrf")) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let why = match f.ids() {
        Ok(ids) if !ids.is_empty() && ids.len() <= BULK_MAX => {
            return apply_to(&state, &v, Chosen::Ids(ids), f.one("action"), f.one("text")).await
        }
        Ok(ids) if ids.is_empty() => "No record was selected: tick the records first.".to_owned(),
        Ok(_) => format!("At most {BULK_MAX} records at once."),
        Err(e) => e,
    };
    not_done(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Not done",
        &v,
        &why,
        "/ui/records",
    )
}

/// A form's free text (a note, a reason, an owner): trimmed, empty = none, at most as long as
/// the API allows.
fn form_text(raw: &str) -> Result<Option<String>, ApiError> {
    match raw.trim() {
        "" => Ok(None),
        t => super::triage::short("text", t, super::triage::MAX_NOTE_BYTES).map(Some),
    }
}

/// One action over the chosen records — one writer transaction, each record changed and
/// audited on its own (the same code as the API's group action) — and the page that says what
/// it did to each.
async fn apply_to(
    state: &AppState,
    v: &Viewer,
    chosen: Chosen,
    action: &str,
    text: &str,
) -> Response {
    let (title, what, back) = match chosen {
        Chosen::Group(_) => ("Group action", "open record(s)", "/ui/groups"),
        Chosen::Ids(_) => ("Bulk action", "selected record(s)", "/ui/records"),
    };
    let kind = match action {
        "resolve" => GroupActionKind::Resolve,
        "skip" => GroupActionKind::Skip,
        "assign" => GroupActionKind::Assign,
        "ready_for_replay" => GroupActionKind::ReadyForReplay,
        "note" => GroupActionKind::Note,
        other => {
            let why = format!("No action `{other}`.");
            return not_done(StatusCode::UNPROCESSABLE_ENTITY, "Not done", v, &why, back);
        }
    };
    let text = match form_text(text) {
        Ok(t) => t,
        Err(e) => return not_done(e.status, "Not done", v, &e.message, back),
    };
    let result = state
        .store
        .writer
        .group_action(GroupAction {
            chosen,
            actor: v.actor(),
            at_ms: chrono::Utc::now().timestamp_millis(),
            kind,
            text,
        })
        .await;
    let items = match result {
        Ok(items) => items,
        Err(e) => return refused(v, "Not done", e, back),
    };
    let done = items.iter().filter(|i| i.ok).count();
    page(
        title,
        Some(v),
        html! {
            p { strong { (done) } " of " (items.len()) " " (what) " changed." }
            table {
                thead { tr { th { "Record" } th { "Now" } th { "Refused because" } } }
                tbody { @for i in &items {
                    tr { td { a href=(format!("/ui/records/{}", i.id)) { (i.id) } } td { (i.status.as_str()) } td { (i.error.clone().unwrap_or_default()) } }
                } }
            }
            (back_link(back))
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
        actor: v.actor(),
        at_ms: chrono::Utc::now().timestamp_millis(),
        expected_version: f.version,
        payload: Some(pe),
        ..Change::default()
    };
    match state.store.writer.change(change).await {
        Ok(_) => Redirect::to(&format!("/ui/records/{id}")).into_response(),
        Err(e) => refused(&v, "Not saved", e, &back),
    }
}
