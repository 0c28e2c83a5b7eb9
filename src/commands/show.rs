//! `deadletter show ID`: one record, readable, or the API's JSON.

use std::fmt::Write;

use super::{ago, emit, open_readers, until};
use crate::cli::ShowArgs;
use crate::config::Config;
use crate::model::RecordId;
use crate::store::RecordDetail;

pub fn run(config: &Config, args: ShowArgs) -> anyhow::Result<()> {
    let id = RecordId::parse(&args.id).map_err(anyhow::Error::msg)?;
    let readers = open_readers(config)?;
    let rec = readers.get(id.get())?;
    if args.json {
        emit(&(String::from_utf8_lossy(&rec.to_json()?).into_owned() + "\n"))
    } else {
        emit(&render(&rec, chrono::Utc::now()))
    }
}

fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| json.to_owned())
}

fn render(rec: &RecordDetail, now: chrono::DateTime<chrono::Utc>) -> String {
    let r = &rec.summary;
    let mut out = String::new();
    let mut field = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            let _ = writeln!(out, "{name:<18}{v}");
        }
    };
    field("id", Some(r.id.to_string()));
    let mut flags = Vec::new();
    if r.poison {
        flags.push("poison");
    }
    if r.credential_incident {
        flags.push("credential incident");
    }
    field(
        "status",
        Some(if flags.is_empty() {
            r.status.to_string()
        } else {
            format!("{} ({})", r.status, flags.join(", "))
        }),
    );
    field("owner", r.owner.clone());
    field(
        "due",
        r.due_at
            .map(|d| format!("{} ({})", d.to_rfc3339(), until(d, now))),
    );
    field("tags", (!r.tags.is_empty()).then(|| r.tags.join(", ")));
    field("version", Some(r.version.to_string()));
    field(
        "class",
        Some(format!("{} (rule {})", r.failure_class, r.class_rule)),
    );
    field("fingerprint", Some(r.fingerprint.to_string()));
    field("partition", Some(r.partition.clone()));
    field("source", Some(r.source.clone()));
    field(
        "workflow",
        match (&r.facts.workflow_name, &r.facts.workflow_id) {
            (Some(n), Some(i)) => Some(format!("{n} ({i})")),
            (n, i) => n.clone().or(i.clone()),
        },
    );
    field(
        "execution",
        r.facts
            .execution_id
            .clone()
            .map(|e| match &r.facts.execution_mode {
                Some(m) => format!("{e} ({m})"),
                None => e,
            }),
    );
    field("execution url", r.facts.execution_url.clone());
    field(
        "node",
        r.facts.node_name.clone().map(|n| match &r.facts.node_type {
            Some(t) => format!("{n} ({t})"),
            None => n,
        }),
    );
    field("http status", r.facts.http_status.map(|s| s.to_string()));
    field("error code", r.facts.error_code.clone());
    field(
        "error",
        r.facts
            .error_message
            .clone()
            .map(|m| match &r.facts.error_name {
                Some(n) => format!("{n}: {m}"),
                None => m,
            }),
    );
    field(
        "first seen",
        Some(format!(
            "{} ({})",
            r.first_seen_at.to_rfc3339(),
            ago(r.first_seen_at, now)
        )),
    );
    field(
        "last seen",
        Some(format!(
            "{} ({})",
            r.last_seen_at.to_rfc3339(),
            ago(r.last_seen_at, now)
        )),
    );
    field("occurrences", Some(r.occurrences.to_string()));
    field("idempotency key", r.facts.idempotency_key.clone());
    field("event id", r.facts.external_event_id.clone());
    field("correlation id", r.facts.correlation_id.clone());
    field("tenant", r.facts.tenant_id.clone());
    field("replay url", r.facts.replay_url.clone());
    match &rec.payload {
        Some(p) => {
            let _ = writeln!(
                out,
                "\npayload (version {}, {} bytes, stored {} as {}, sha256 {}):\n{}",
                p.version,
                p.size,
                p.stored_size,
                p.codec,
                &p.sha256[..16],
                pretty(&p.json)
            );
        }
        None => out.push_str("\npayload: none (an Error Trigger record carries only the error)\n"),
    }
    if let Some(e) = &rec.error {
        // n8n's error output puts the error inside the item: say so rather than print it twice.
        let doc = |json: &str| serde_json::from_str::<serde_json::Value>(json).ok();
        let inside_payload = rec
            .payload
            .as_ref()
            .and_then(|p| doc(&p.json))
            .is_some_and(|p| {
                p.get("error")
                    .is_some_and(|pe| Some(pe) == doc(&e.json).as_ref())
            });
        if inside_payload {
            out.push_str("\nerror object: the payload's `error`, above\n");
        } else {
            let _ = writeln!(
                out,
                "\nerror object ({} bytes):\n{}",
                e.size,
                pretty(&e.json)
            );
        }
    }
    out.push_str("\nevents:\n");
    for e in &rec.events {
        let _ = writeln!(
            out,
            "  {}  {:<14} by {}{}",
            e.at.to_rfc3339(),
            e.kind,
            e.actor,
            event_detail(e)
        );
    }
    out
}

/// The part of an event worth a line: the move, the owner, the note, the diff size.
fn event_detail(e: &crate::store::EventView) -> String {
    let d = e.detail.as_ref();
    let text = |k: &str| {
        d.and_then(|d| d.get(k))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let mut parts = Vec::new();
    match (&e.from_status, &e.to_status) {
        (Some(f), Some(t)) => parts.push(format!("{f} -> {t}")),
        (None, Some(t)) => parts.push(format!("-> {t}")),
        _ => {}
    }
    if let Some(r) = text("reason") {
        parts.push(format!("because: {r}"));
    }
    if let Some(n) = text("note") {
        parts.push(format!("\"{n}\""));
    }
    if e.kind == "assigned" {
        parts.push(match text("owner") {
            Some(o) => format!("owner {o}"),
            None => "unassigned".into(),
        });
    }
    if let Some(t) = d.and_then(|d| d.get("tags")) {
        parts.push(format!("tags {t}"));
    }
    if e.kind == "payload_edited" {
        let v = d
            .and_then(|d| d.get("version"))
            .cloned()
            .unwrap_or_default();
        let ops = d
            .and_then(|d| d.get("diff"))
            .and_then(|x| x.as_array())
            .map_or(0, Vec::len);
        parts.push(format!("version {v}, {ops} change(s)"));
    }
    if d.and_then(|d| d.get("poison")).is_some() {
        parts.push("poison".into());
    }
    if d.and_then(|d| d.get("credential_incident")).is_some() {
        parts.push("credential incident".into());
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
}
