//! `deadletter skip ID… --reason`.

use anyhow::bail;
use serde_json::json;

use super::client::{each, Client};
use crate::cli::VerbArgs;

pub fn run(client: &Client, args: VerbArgs) -> anyhow::Result<()> {
    let Some(reason) = args.reason.filter(|r| !r.trim().is_empty()) else {
        bail!("skipping needs --reason");
    };
    let body = json!({"status": "skipped", "reason": reason});
    each(client, &args.ids, &body, args.json, "skipped")
}
