//! `deadletter groups`: failure groups (fingerprints), as a table or JSON.

use anyhow::anyhow;

use super::client::Client;
use super::{ago, clip, emit, urlencode};
use crate::cli::GroupsArgs;

pub fn run(client: &Client, args: GroupsArgs) -> anyhow::Result<()> {
    let mut q = vec![format!("limit={}", args.limit)];
    if args.open {
        q.push("open=true".into());
    }
    if args.poison {
        q.push("poison=true".into());
    }
    if let Some(c) = &args.failure_class {
        q.push(format!("failure_class={c}"));
    }
    if let Some(w) = &args.workflow {
        q.push(format!("workflow={}", urlencode(w)));
    }
    let (body, _) = client
        .get(&format!("/v1/groups?{}", q.join("&")))?
        .map_err(|r| anyhow!("{r}"))?;
    if args.json {
        return emit(&(serde_json::to_string_pretty(&body["groups"])? + "\n"));
    }
    let groups = body["groups"].as_array().cloned().unwrap_or_default();
    if groups.is_empty() {
        return emit("no failure groups match\n");
    }
    let now = chrono::Utc::now();
    let mut out = format!(
        "{:<16}  {:<12}  {:>5}  {:>5}  {:<9}  {:<24}  {}\n",
        "FINGERPRINT", "CLASS", "OPEN", "TOTAL", "LAST", "WORKFLOW / NODE", "SAMPLE"
    );
    for g in groups {
        let last = g["last_seen_at"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| ago(t.with_timezone(&chrono::Utc), now))
            .unwrap_or_default();
        let wf = format!(
            "{} / {}",
            g["workflow_name"]
                .as_str()
                .or(g["workflow_id"].as_str())
                .unwrap_or("-"),
            g["node_name"].as_str().unwrap_or("-")
        );
        out.push_str(&format!(
            "{:<16}  {:<12}  {:>5}  {:>5}  {:<9}  {:<24}  {}{}\n",
            g["fingerprint"].as_str().unwrap_or(""),
            g["failure_class"].as_str().unwrap_or(""),
            g["open"].as_i64().unwrap_or(0),
            g["count"].as_i64().unwrap_or(0),
            last,
            clip(&wf, 24),
            if g["poison"] == true { "[poison] " } else { "" },
            clip(g["sample_message"].as_str().unwrap_or("-"), 50)
        ));
    }
    emit(&out)
}
