//! `deadletter note ID "text"`: a remark in the record's audit trail.

use serde_json::json;

use super::client::{each, Client};
use crate::cli::NoteArgs;

pub fn run(client: &Client, args: NoteArgs) -> anyhow::Result<()> {
    each(
        client,
        &[args.id],
        &json!({"note": args.text}),
        args.json,
        "noted",
    )
}
