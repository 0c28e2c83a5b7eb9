//! `deadletter reopen ID… --reason`: a closed record goes back to review.

use anyhow::bail;
use serde_json::json;

use super::client::{each, Client};
use crate::cli::VerbArgs;

pub fn run(client: &Client, args: VerbArgs) -> anyhow::Result<()> {
    let Some(reason) = args.reason.filter(|r| !r.trim().is_empty()) else {
        bail!("reopening needs --reason");
    };
    let body = json!({"status": "review", "reason": reason});
    each(client, &args.ids, &body, args.json, "reopened")
}
