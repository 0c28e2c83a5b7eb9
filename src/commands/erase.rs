//! `deadletter erase`: remove records now (an erasure request); tombstones stay.

use anyhow::{anyhow, bail};

use super::client::Client;
use super::{emit, urlencode};
use crate::cli::EraseArgs;

pub fn run(client: &Client, args: EraseArgs) -> anyhow::Result<()> {
    let mut q = Vec::new();
    if !args.ids.is_empty() {
        q.push(format!(
            "ids={}",
            args.ids
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    for (k, v) in [
        ("idempotency_key", &args.idempotency_key),
        ("external_event_id", &args.external_event_id),
        ("tenant_id", &args.tenant_id),
    ] {
        if let Some(v) = v {
            q.push(format!("{k}={}", urlencode(v)));
        }
    }
    if q.len() != 1 {
        bail!("give exactly one of --id (repeatable), --idempotency-key, --event-id or --tenant");
    }
    let answer = client
        .delete(&format!("/v1/dead-letters?{}", q[0]))?
        .map_err(|r| anyhow!("{r}"))?;
    if args.json {
        emit(&(serde_json::to_string_pretty(&answer)? + "\n"))
    } else {
        emit(&format!(
            "erased {} record(s): {}; their tombstones remain (GET /v1/tombstones)\n",
            answer["erased"], answer["ids"]
        ))
    }
}
