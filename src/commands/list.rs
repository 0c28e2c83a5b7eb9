//! `deadletter list`: the filtered list, as a table or as the API's JSON.

use anyhow::anyhow;

use super::{ago, clip, emit, open_readers};
use crate::cli::ListArgs;
use crate::config::Config;
use crate::model::{parse_timestamp, FailureClass, Fingerprint, RecordId, Status};
use crate::store::{ListFilter, ListPage};

fn filter(args: &ListArgs) -> anyhow::Result<ListFilter> {
    if args.limit == 0 || args.limit > 1000 {
        return Err(anyhow!("--limit: must be from 1 to 1000"));
    }
    Ok(ListFilter {
        status: args
            .filter
            .status
            .as_deref()
            .map(str::parse::<Status>)
            .transpose()
            .map_err(|m| anyhow!("--status: {m}"))?,
        partition: args.filter.partition.clone(),
        workflow: args.filter.workflow.clone(),
        owner: args.filter.owner.clone(),
        failure_class: args
            .filter
            .failure_class
            .as_deref()
            .map(str::parse::<FailureClass>)
            .transpose()
            .map_err(|m| anyhow!("--class: {m}"))?,
        fingerprint: args
            .filter
            .fingerprint
            .as_deref()
            .map(Fingerprint::parse)
            .transpose()
            .map_err(|m| anyhow!("--fingerprint: {m}"))?,
        since_ms: args
            .filter
            .since
            .as_deref()
            .map(parse_timestamp)
            .transpose()
            .map_err(|m| anyhow!("--since: {m}"))?,
        until_ms: args
            .filter
            .until
            .as_deref()
            .map(parse_timestamp)
            .transpose()
            .map_err(|m| anyhow!("--until: {m}"))?,
        message_contains: args.filter.message.clone(),
        before_id: args
            .cursor
            .as_deref()
            .map(|c| RecordId::parse(c).map(RecordId::get))
            .transpose()
            .map_err(|m| anyhow!("--cursor: {m}"))?,
        limit: args.limit,
    })
}

pub fn run(config: &Config, args: ListArgs) -> anyhow::Result<()> {
    let filter = filter(&args)?;
    let readers = open_readers(config)?;
    let page = readers.list(&filter)?;
    if args.json {
        emit(&(serde_json::to_string_pretty(&page)? + "\n"))
    } else {
        emit(&table(&page, chrono::Utc::now()))
    }
}

fn table(page: &ListPage, now: chrono::DateTime<chrono::Utc>) -> String {
    if page.items.is_empty() {
        return "no dead letters match\n".into();
    }
    let header = [
        "ID",
        "STATUS",
        "CLASS",
        "PARTITION",
        "WORKFLOW",
        "NODE",
        "LAST SEEN",
        "N",
        "ERROR",
    ];
    let rows: Vec<[String; 9]> = page
        .items
        .iter()
        .map(|r| {
            [
                r.id.to_string(),
                r.status.to_string(),
                r.failure_class.to_string(),
                r.partition.clone(),
                clip(
                    r.facts
                        .workflow_name
                        .as_deref()
                        .or(r.facts.workflow_id.as_deref())
                        .unwrap_or("-"),
                    28,
                ),
                clip(r.facts.node_name.as_deref().unwrap_or("-"), 20),
                ago(r.last_seen_at, now),
                r.occurrences.to_string(),
                clip(
                    &match (
                        r.facts.http_status,
                        &r.facts.error_code,
                        &r.facts.error_message,
                    ) {
                        (Some(s), _, Some(m)) if !m.starts_with(&s.to_string()) => {
                            format!("{s} {m}")
                        }
                        (None, Some(c), Some(m)) => format!("{c} {m}"),
                        (_, _, Some(m)) => m.clone(),
                        _ => "-".into(),
                    },
                    60,
                ),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    if let Some(c) = &page.next_cursor {
        out.push_str(&format!("… more: deadletter list --cursor {c}\n"));
    }
    out
}
