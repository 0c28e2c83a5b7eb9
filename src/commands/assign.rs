//! `deadletter assign ID… --owner NAME` (or `--unassign`).

use serde_json::json;

use super::client::{each, Client};
use crate::cli::AssignArgs;

pub fn run(client: &Client, args: AssignArgs) -> anyhow::Result<()> {
    let (body, done) = match &args.owner {
        Some(o) if !args.unassign => (json!({"owner": o}), format!("assigned to {o}")),
        _ => (json!({"owner": null}), "unassigned".to_owned()),
    };
    each(client, &args.ids, &body, args.json, &done)
}
