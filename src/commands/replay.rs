//! `deadletter replay`: start a replay job (or a dry run) and, with `--wait`, follow it with a
//! progress bar. `deadletter job`: show or steer one.

use std::time::Duration;

use anyhow::{anyhow, bail};
use serde_json::{json, Map, Value};

use super::client::Client;
use super::{clip, emit};
use crate::cli::{JobAction, JobArgs, ReplayArgs};

pub fn run(client: &Client, args: ReplayArgs) -> anyhow::Result<()> {
    let mut body = Map::new();
    let mut filter = Map::new();
    let f = &args.filter;
    for (k, v) in [
        ("status", &f.status),
        ("partition", &f.partition),
        ("workflow", &f.workflow),
        ("owner", &f.owner),
        ("failure_class", &f.failure_class),
        ("fingerprint", &f.fingerprint),
        ("since", &f.since),
        ("until", &f.until),
        ("q", &f.message),
    ] {
        if let Some(v) = v {
            filter.insert(k.into(), json!(v));
        }
    }
    match (args.ids.is_empty(), filter.is_empty()) {
        (false, false) => bail!("give ids or filters, not both"),
        (true, true) => bail!(
            "name the records: ids, or filters with --expect N (there is no \"replay everything\")"
        ),
        (false, true) => {
            let ids: Result<Vec<i64>, _> = args
                .ids
                .iter()
                .map(|i| i.trim_start_matches("dl_").parse::<i64>())
                .collect();
            body.insert(
                "ids".into(),
                json!(ids.map_err(|_| anyhow!("ids are numbers"))?),
            );
        }
        (true, false) => {
            let Some(n) = args.expect else {
                bail!("with filters, say how many records you expect: --expect N");
            };
            body.insert("filter".into(), Value::Object(filter));
            body.insert("expected_count".into(), json!(n));
        }
    }
    body.insert("dry_run".into(), json!(args.dry_run));
    body.insert("new_keys".into(), json!(args.new_keys));
    if let Some(b) = args.batch_size {
        body.insert("batch_size".into(), json!(b));
    }
    let answer = client
        .post("/v1/replays", Some(&Value::Object(body)))?
        .map_err(|r| anyhow!("{r}"))?;
    if args.dry_run {
        return if args.json {
            emit(&(serde_json::to_string_pretty(&answer)? + "\n"))
        } else {
            emit(&dry_run_table(&answer))
        };
    }
    let id = answer["id"]
        .as_i64()
        .ok_or_else(|| anyhow!("the server sent no job id"))?;
    if !args.wait {
        return if args.json {
            emit(&(serde_json::to_string_pretty(&answer)? + "\n"))
        } else {
            emit(&format!(
                "replay job {id}: {} ({} record(s)); follow it with `deadletter job show {id}`\n",
                answer["status"].as_str().unwrap_or("?"),
                answer["counts"]["total"]
            ))
        };
    }
    follow(client, id, args.json)
}

fn dry_run_table(a: &Value) -> String {
    let mut out = format!(
        "dry run: {} record(s), {} would be sent, {} skipped; nothing was sent\n",
        a["count"], a["would_send"], a["would_skip"]
    );
    out.push_str(&format!(
        "{:<8}  {:<24}  {:<28}  {:>3}  {:>7}  {}\n",
        "ID", "TARGET", "IDEMPOTENCY KEY", "V", "CHANGES", "SKIP"
    ));
    for i in a["items"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<8}  {:<24}  {:<28}  {:>3}  {:>7}  {}\n",
            i["id"],
            clip(i["target"]["name"].as_str().unwrap_or("-"), 24),
            clip(i["idempotency_key"].as_str().unwrap_or("-"), 28),
            i["payload_version"]
                .as_i64()
                .map_or("-".into(), |v| v.to_string()),
            i["diff_from_original"].as_array().map_or(0, Vec::len),
            i["would_skip"].as_str().unwrap_or("")
        ));
    }
    out
}

/// Poll the job until it ends, drawing a bar on a terminal; exit non-zero unless every item
/// was delivered or skipped.
fn follow(client: &Client, id: i64, json: bool) -> anyhow::Result<()> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} job {prefix} [{bar:30}] {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(id.to_string());
    let job = loop {
        let (job, _) = client
            .get(&format!("/v1/replays/{id}"))?
            .map_err(|r| anyhow!("{r}"))?;
        let c = &job["counts"];
        bar.set_length(c["total"].as_u64().unwrap_or(0));
        bar.set_position(c["total"].as_u64().unwrap_or(0) - c["pending"].as_u64().unwrap_or(0));
        bar.set_message(format!(
            "{} · {} ok, {} failed, {} skipped{}",
            job["status"].as_str().unwrap_or("?"),
            c["succeeded"],
            c["failed"],
            c["skipped"],
            job["note"]
                .as_str()
                .map(|n| format!(" · {n}"))
                .unwrap_or_default()
        ));
        if matches!(
            job["status"].as_str(),
            Some("done" | "stopped" | "cancelled")
        ) {
            break job;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    bar.finish();
    if json {
        emit(&(serde_json::to_string_pretty(&job)? + "\n"))?;
    } else {
        emit(&summary(&job))?;
    }
    let failed = job["counts"]["failed"].as_i64().unwrap_or(0);
    if job["status"] != "done" || failed > 0 {
        bail!(
            "replay job {id} ended {} with {failed} failed item(s)",
            job["status"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

fn summary(job: &Value) -> String {
    let c = &job["counts"];
    let mut out = format!(
        "replay job {}: {} — {} delivered, {} failed, {} skipped, {} pending of {}\n",
        job["id"],
        job["status"].as_str().unwrap_or("?"),
        c["succeeded"],
        c["failed"],
        c["skipped"],
        c["pending"],
        c["total"]
    );
    if let Some(r) = job["stop_reason"].as_str() {
        out.push_str(&format!("  {r}\n"));
    }
    if let Some(n) = job["note"].as_str() {
        out.push_str(&format!("  {n}\n"));
    }
    for i in job["items"].as_array().into_iter().flatten() {
        if i["state"] == "pending" || i["state"] == "succeeded" {
            continue;
        }
        let why = i["detail"]["reason"]
            .as_str()
            .or(i["detail"]["error"].as_str())
            .unwrap_or("");
        out.push_str(&format!(
            "  {:<8} {:<9} {}\n",
            i["record_id"],
            i["state"].as_str().unwrap_or(""),
            why
        ));
    }
    out
}

pub fn job(client: &Client, args: JobArgs) -> anyhow::Result<()> {
    let path = format!("/v1/replays/{}", args.id);
    let job = match args.action {
        JobAction::Show => client.get(&path)?.map(|(v, _)| v),
        a => {
            let action = match a {
                JobAction::Approve => "approve",
                JobAction::Pause => "pause",
                JobAction::Resume => "resume",
                _ => "cancel",
            };
            client.post(&format!("{path}/{action}"), None)?
        }
    }
    .map_err(|r| anyhow!("{r}"))?;
    if args.json {
        emit(&(serde_json::to_string_pretty(&job)? + "\n"))
    } else {
        emit(&summary(&job))
    }
}
