//! `deadletter edit ID`: the payload, pretty-printed, goes to $VISUAL/$EDITOR; what comes back
//! must be JSON; the diff is shown and, once confirmed, saved as a new payload version (the
//! original stays). The server refuses the save if someone else changed the record meanwhile.

use std::io::{BufRead, Write};
use std::process::Command;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};

use super::client::Client;
use super::emit;
use crate::cli::EditArgs;

pub fn run(client: &Client, args: EditArgs) -> anyhow::Result<()> {
    let (rec, etag) = client
        .get(&format!("/v1/dead-letters/{}", args.id))?
        .map_err(|r| anyhow!("{r}"))?;
    let version = etag.ok_or_else(|| anyhow!("the server sent no version (ETag)"))?;
    let before = rec["payload"].clone();
    let mut file = tempfile::Builder::new()
        .prefix(&format!("deadletter-{}-", args.id))
        .suffix(".json")
        .tempfile()
        .context("creating a temp file")?;
    let pretty = if before.is_null() {
        "{}".to_owned()
    } else {
        serde_json::to_string_pretty(&before)?
    };
    file.write_all(pretty.as_bytes())?;
    file.flush()?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    // Through the shell, so an EDITOR with arguments ("code --wait") works.
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(file.path())
        .status()
        .with_context(|| format!("running the editor `{editor}`"))?;
    if !status.success() {
        bail!("the editor `{editor}` failed ({status}); nothing was saved");
    }
    let text = std::fs::read_to_string(file.path())?;
    let after: Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("the edited payload is not JSON ({e}); nothing was saved"))?;
    if after == before {
        return emit("no change; nothing saved\n");
    }
    let diff = json_patch::diff(&before, &after);
    if !args.json {
        let mut out = format!("changes to the payload of {}:\n", args.id);
        for op in serde_json::to_value(&diff)?
            .as_array()
            .into_iter()
            .flatten()
        {
            out.push_str(&format!("  {}\n", op));
        }
        emit(&out)?;
    }
    if !args.yes && !confirm("save this as a new payload version? [y/N] ")? {
        return emit("not saved\n");
    }
    let saved = client
        .patch(&args.id, &json!({"payload": after}), Some(&version))?
        .map_err(|r| anyhow!("{r}"))?;
    if args.json {
        emit(&(serde_json::to_string_pretty(&saved)? + "\n"))
    } else {
        emit(&format!(
            "{}: saved as payload version {} (the original is kept)\n",
            args.id, saved["payload_version"]
        ))
    }
}

fn confirm(prompt: &str) -> anyhow::Result<bool> {
    eprint!("{prompt}");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}
