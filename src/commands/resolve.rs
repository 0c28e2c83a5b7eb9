//! `deadletter resolve ID… [--reason]`.

use serde_json::json;

use super::client::{each, Client};
use crate::cli::VerbArgs;

pub fn run(client: &Client, args: VerbArgs) -> anyhow::Result<()> {
    let body = json!({"status": "resolved", "reason": args.reason});
    each(client, &args.ids, &body, args.json, "resolved")
}
