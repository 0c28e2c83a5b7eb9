//! The replay pages: a dry run of what would be sent (target, idempotency key, payload version,
//! changes from the original, what would be skipped and why), then the confirmed job; the list
//! of jobs; a job's page with its progress (kept live by the embedded script), and approve,
//! pause, resume and cancel. Requests and moves go through the same code as `/v1/replays`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde_json::Value;

use super::{back_link, form_viewer, not_done, page, to_signin, unreadable, viewer, when, Fields};
use crate::http::read::read;
use crate::http::replays::{move_job, runner_note, start, ReplayBody, Started};
use crate::http::{ApiError, AppState};
use crate::store::jobs::JobStatus;

/// `POST /ui/replay`: without `confirm=yes` a dry run, shown with a form to confirm; with it,
/// the job, and on to its page.
pub(super) async fn request(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let f = Fields::parse(&body);
    let v = match form_viewer(&state, &headers, f.one("csrf")) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let ids = match f.ids() {
        Ok(ids) if !ids.is_empty() => ids,
        Ok(_) => {
            return not_done(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Not replayed",
                &v,
                "No record was selected: tick the records first.",
                "/ui/records",
            )
        }
        Err(e) => {
            return not_done(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Not replayed",
                &v,
                &e,
                "/ui/records",
            )
        }
    };
    let back = match ids.as_slice() {
        [one] => format!("/ui/records/{one}"),
        _ => "/ui/records".to_owned(),
    };
    let new_keys = f.one("new_keys") == "yes";
    let mut confirm = f.one("confirm") == "yes";
    // What the dry run showed (`seen=id:version:status`): if a record changed since (another
    // edit, a retry, someone resolved it), show the dry run again instead of sending.
    let mut changed = Vec::new();
    if confirm {
        let seen: Vec<String> = f.all("seen").map(str::to_owned).collect();
        let wanted = ids.clone();
        let now = read(&state.store.readers, move |p| {
            wanted
                .iter()
                .map(|id| p.summary(*id))
                .collect::<Result<Vec<_>, _>>()
        })
        .await;
        if let Ok(now) = now {
            for r in now {
                let mark = seen_mark(r.id, r.payload_version, r.status.as_str());
                if !seen.contains(&mark) {
                    changed.push(r.id);
                }
            }
        }
        confirm = changed.is_empty();
    }
    let body = ReplayBody {
        ids: Some(ids.clone()),
        new_keys,
        dry_run: !confirm,
        ..ReplayBody::default()
    };
    let report = match start(&state, &v.asker(), body).await {
        Ok(Started::Job(id)) => return Redirect::to(&format!("/ui/replays/{id}")).into_response(),
        Ok(Started::DryRun(report)) => report,
        Err(e) => return not_done(e.status, "Not replayed", &v, &e.message, &back),
    };
    let items = report["items"].as_array().cloned().unwrap_or_default();
    let would_send = report["would_send"].as_u64().unwrap_or(0);
    let approval: Vec<String> = {
        let mut p: Vec<String> = items
            .iter()
            .filter(|i| i["would_skip"].is_null())
            .filter_map(|i| i["partition"].as_str())
            .filter(|p| state.config.replay.require_approval.iter().any(|a| a == p))
            .map(str::to_owned)
            .collect();
        p.sort();
        p.dedup();
        p
    };
    page(
        "Replay: dry run",
        Some(&v),
        html! {
            @if !changed.is_empty() {
                p.notice role="alert" { "Not sent: record(s) " (changed.iter().map(|id| id.to_string()).collect::<Vec<_>>().join(", ")) " changed since the dry run. Here it is again; look before you confirm." }
            }
            p { "Nothing has been sent. " strong { (would_send) } " of " (items.len())
                " record(s) would be sent, " (items.len() as u64 - would_send) " skipped." }
            table.dry-run {
                thead { tr { th { "Record" } th { "Status" } th { "Target" } th { "Idempotency key" } th.num { "Version" } th { "Changes from the original" } th { "Skipped because" } } }
                tbody { @for i in &items {
                    @let id = i["id"].as_i64().unwrap_or_default();
                    tr {
                        td { a href=(format!("/ui/records/{id}")) { (id) } }
                        td { (i["status"].as_str().unwrap_or_default()) }
                        td { @if let Some(t) = i["target"].as_object() {
                            (t["name"].as_str().unwrap_or_default()) br; code.small { (t["url"].as_str().unwrap_or_default()) }
                        } }
                        td { code { (i["idempotency_key"].as_str().unwrap_or_default()) }
                             @if let Some(old) = i["supersedes"].as_str() { br; span.small { "supersedes " code { (old) } } } }
                        td.num { (i["payload_version"].as_i64().map(|n| n.to_string()).unwrap_or_default()) }
                        td { (diff_cell(&i["diff_from_original"])) }
                        td.error { (i["would_skip"].as_str().unwrap_or_default()) }
                    }
                } }
            }
            @if would_send == 0 {
                p { "Nothing would be sent." }
            } @else {
                @if !approval.is_empty() {
                    p.notice { "Partition " (approval.join(", ")) " needs a second person: the job will wait until an admin other than you approves it." }
                }
                form.card method="post" action="/ui/replay" {
                    input type="hidden" name="csrf" value=(v.csrf);
                    @for id in &ids { input type="hidden" name="ids" value=(id); }
                    @for i in &items {
                        input type="hidden" name="seen" value=(seen_mark(
                            i["id"].as_i64().unwrap_or_default(),
                            i["payload_version"].as_i64(),
                            i["status"].as_str().unwrap_or_default(),
                        ));
                    }
                    @if new_keys { input type="hidden" name="new_keys" value="yes"; }
                    input type="hidden" name="confirm" value="yes";
                    div.buttons { button type="submit" { "Replay " (would_send) " record(s) now" } }
                }
            }
            (back_link(&back))
        },
    )
    .into_response()
}

/// How the dry run saw a record: its id, payload version and status.
fn seen_mark(id: i64, version: Option<i64>, status: &str) -> String {
    format!("{id}:{}:{status}", version.unwrap_or(0))
}

fn diff_cell(diff: &Value) -> maud::Markup {
    match diff.as_array() {
        Some(ops) if ops.is_empty() => html! { "none" },
        Some(_) => html! { pre.diff { (serde_json::to_string_pretty(diff).unwrap_or_default()) } },
        None => html! {},
    }
}

/// `GET /ui/replays`: the newest jobs, those waiting for approval first.
pub(super) async fn jobs(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(v) = viewer(&state, &headers) else {
        return to_signin();
    };
    let mut list = match read(&state.store.readers, |p| p.jobs(200)).await {
        Ok(list) => list,
        Err(e) => return unreadable(&v, e),
    };
    list.sort_by_key(|j| (j.status != JobStatus::AwaitingApproval, -j.id));
    page(
        "Replay jobs",
        Some(&v),
        html! {
            p.small { "A job is started from a record's page or from the records list (a dry run first). Jobs in partitions that need a second person wait for an admin's approval." }
            @if list.is_empty() { p { "No replay jobs yet." } } @else {
                table {
                    thead { tr { th { "Job" } th { "Status" } th { "Asked by" } th { "Approved by" } th.num { "Sent" } th.num { "Failed" } th.num { "Skipped" } th.num { "Pending" } th { "Stopped because" } } }
                    tbody { @for j in &list {
                        tr {
                            td { a href=(format!("/ui/replays/{}", j.id)) { (j.id) } }
                            td { @if j.status == JobStatus::AwaitingApproval { strong { (j.status.as_str()) } } @else { (j.status.as_str()) } }
                            td { (j.created_by) br; span.small { (when(j.created_at)) } }
                            td { (j.approved_by.clone().unwrap_or_default()) }
                            td.num { (j.counts.succeeded) } td.num { (j.counts.failed) } td.num { (j.counts.skipped) } td.num { (j.counts.pending) }
                            td { (j.stop_reason.clone().unwrap_or_default()) }
                        }
                    } }
                }
            }
        },
    )
    .into_response()
}

/// `GET /ui/replays/{id}`: the job, its items and what can be done with it.
pub(super) async fn job(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(v) = viewer(&state, &headers) else {
        return to_signin();
    };
    let found = match id.parse::<i64>() {
        Ok(id) => read(&state.store.readers, move |p| p.job(id)).await,
        Err(_) => Err(ApiError::not_found(format!("no replay job {id}"))),
    };
    let j = match found {
        Ok(j) => j,
        Err(e) => return unreadable(&v, e),
    };
    let note = runner_note(&state, j.id, j.status);
    let done = j.counts.total - j.counts.pending;
    let fin = j.status.is_final();
    page(
        &format!("Replay job {}", j.id),
        Some(&v),
        html! {
            section #progress data-status=(j.status.as_str()) data-final=(fin) aria-live="polite" {
                dl.meta {
                    dt { "Status" } dd.status { (j.status.as_str()) }
                    dt { "Asked by" } dd { (j.created_by) ", " (when(j.created_at)) }
                    dt { "Approved by" } dd { (j.approved_by.clone().unwrap_or_else(|| "—".into())) }
                    dt { "Idempotency keys" } dd { @if j.new_keys { "new (naming the old ones)" } @else { "the records' own" } }
                    dt { "Batches" } dd { (j.batch_size) " after one canary; stops when more than " (format!("{:.0}", j.stop_failure_ratio * 100.0)) "% of a batch fail" }
                    @if let Some(r) = &j.stop_reason { dt { "Stopped because" } dd.error { (r) } }
                    @if let Some(n) = &note { dt { "Now" } dd { (n) } }
                }
                p {
                    progress max=(j.counts.total.max(1)) value=(done) aria-label="Items done" {}
                    " " strong.counts { (done) " of " (j.counts.total) } " done: "
                    (j.counts.succeeded) " sent, " (j.counts.failed) " failed, " (j.counts.skipped) " skipped, " (j.counts.pending) " pending"
                    @if !fin { span.small { " (this page follows the job; without JavaScript, reload it)" } }
                }
                table.items {
                    thead { tr { th { "#" } th { "Record" } th { "State" } th { "Target" } th.num { "HTTP" } th { "Detail" } } }
                    tbody { @for i in &j.items {
                        @let d = i.detail.clone().unwrap_or(Value::Null);
                        tr {
                            td { (i.seq + 1) }
                            td { a href=(format!("/ui/records/{}", i.record_id)) { (i.record_id) } }
                            td.state { (i.state) }
                            td { (d["target"].as_str().unwrap_or_default()) }
                            td.num { (d["status_code"].as_i64().map(|c| c.to_string()).unwrap_or_default()) }
                            td { (d["error"].as_str().or(d["reason"].as_str()).unwrap_or_default()) }
                        }
                    } }
                }
            }
            @if !fin {
                h2 { "Actions" }
                form.card method="post" action=(format!("/ui/replays/{}/act", j.id)) {
                    input type="hidden" name="csrf" value=(v.csrf);
                    @if j.status == JobStatus::AwaitingApproval {
                        @if v.is_admin() {
                            p.small { "Approve if you are not " (j.created_by) ": the job needs a second person." }
                        } @else {
                            p.small { "Waiting for an admin other than " (j.created_by) " to approve." }
                        }
                    }
                    div.buttons {
                        @if j.status == JobStatus::AwaitingApproval && v.is_admin() {
                            button type="submit" name="action" value="approve" { "Approve" }
                        }
                        @if j.status == JobStatus::Running { button type="submit" name="action" value="pause" { "Pause" } }
                        @if j.status == JobStatus::Paused { button type="submit" name="action" value="resume" { "Resume" } }
                        button type="submit" name="action" value="cancel" { "Cancel" }
                    }
                }
            }
            p { a href="/ui/replays" { "All replay jobs" } }
        },
    )
    .into_response()
}

/// `POST /ui/replays/{id}/act`: approve (admins; another person than who asked), pause,
/// resume, cancel.
pub(super) async fn job_act(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let f = Fields::parse(&body);
    let v = match form_viewer(&state, &headers, f.one("csrf")) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let Ok(id) = id.parse::<i64>() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let back = format!("/ui/replays/{id}");
    let action = f.one("action");
    if action == "approve" && !v.is_admin() {
        return not_done(
            StatusCode::FORBIDDEN,
            "Not approved",
            &v,
            "Approving a replay job needs an admin token.",
            &back,
        );
    }
    match move_job(&state, &v.asker(), id, action).await {
        Ok(()) => Redirect::to(&back).into_response(),
        Err(e) => not_done(e.status, "Not done", &v, &e.message, &back),
    }
}
