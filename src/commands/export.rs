//! `deadletter export` and `deadletter import`: the whole database as JSON Lines (records with
//! every payload version, their audit events and attempts, then tombstones), and back.
//! Export reads one snapshot of the file and works while the server runs; import writes through
//! the store's own writer, so it needs the server stopped (it takes the data dir's lock), and
//! can be run again safely: what is already there, or was removed here, is left alone.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

use super::{emit, open_readers};
use crate::config::Config;
use crate::store::export::{self, Header, Imported, Line};
use crate::store::ImportBatch;

/// Lines per import transaction: big enough to be quick, small enough to redo cheaply.
const IMPORT_BATCH: usize = 500;

fn bar(total: u64, what: &str) -> ProgressBar {
    // Drawn on standard error, and only on a terminal.
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:40}} {{pos}}/{{len}} records ({{per_sec}}, {{eta}} left)"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

pub fn export(config: &Config, out: Option<&Path>) -> anyhow::Result<()> {
    let readers = open_readers(config)?;
    let mut sink: Box<dyn Write> = match out {
        Some(p) if p != Path::new("-") => Box::new(BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        _ => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let pb = bar(0, "export");
    let started = std::time::Instant::now();
    let done = readers.with(|c| {
        export::export(c, &mut sink, |n, total| {
            if n == 0 {
                pb.set_length(total);
            }
            pb.set_position(n);
        })
    })?;
    pb.finish_and_clear();
    drop(sink);
    let msg = format!(
        "exported {} record(s) and {} tombstone(s) in {:.1} s\n",
        done.records,
        done.tombstones,
        started.elapsed().as_secs_f64()
    );
    // The data may be on standard output: the summary goes to standard error then.
    match out {
        Some(p) if p != Path::new("-") => emit(&msg),
        _ => {
            eprint!("{msg}");
            Ok(())
        }
    }
}

pub fn import(config: &Config, from: &Path) -> anyhow::Result<()> {
    let input: Box<dyn BufRead> = if from == Path::new("-") {
        Box::new(BufReader::new(std::io::stdin().lock()))
    } else {
        Box::new(BufReader::new(
            std::fs::File::open(from).with_context(|| format!("opening {}", from.display()))?,
        ))
    };
    let mut lines = input.lines();
    let first = lines
        .next()
        .ok_or_else(|| anyhow!("{} is empty", from.display()))??;
    let header: Header = serde_json::from_str(&first)
        .ok()
        .filter(|h: &Header| h.format == export::FORMAT)
        .ok_or_else(|| anyhow!("line 1: not a deadletter export (no header line)"))?;
    if header.version > export::FORMAT_VERSION || header.schema > crate::store::schema::LATEST {
        bail!(
            "this export (format {}, schema {}) was written by a newer deadletter; upgrade first",
            header.version,
            header.schema
        );
    }
    let store = crate::server::open_store(config)
        .context("opening the store (stop the server before importing)")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pb = bar(header.records.max(0) as u64, "import");
    let mut total = Imported::default();
    let mut conflicts = Vec::new();
    let mut batch = Vec::with_capacity(IMPORT_BATCH);
    let mut first_line = 2;
    let result = (|| -> anyhow::Result<()> {
        let mut n = 1;
        let mut flush = |batch: &mut Vec<Line>, first_line: usize, last: usize| {
            if batch.is_empty() {
                return Ok::<_, anyhow::Error>(());
            }
            let records = batch
                .iter()
                .filter(|l| matches!(l, Line::Record(_)))
                .count();
            let (done, clash) = rt
                .block_on(store.writer.import(ImportBatch {
                    lines: std::mem::take(batch),
                    compress_above: config.storage.compress_above_bytes,
                    zstd_level: config.storage.zstd_level,
                }))
                .with_context(|| {
                    format!("lines {first_line}–{last} (nothing from them was imported)")
                })?;
            total.add(done);
            conflicts.extend(clash);
            pb.inc(records as u64);
            Ok(())
        };
        for line in lines.by_ref() {
            n += 1;
            let line = line.with_context(|| format!("reading line {n}"))?;
            if line.trim().is_empty() {
                continue;
            }
            let parsed: Line = serde_json::from_str(&line).map_err(|e| {
                anyhow!("line {n}: not a record or tombstone of a deadletter export: {e}")
            })?;
            batch.push(parsed);
            if batch.len() == IMPORT_BATCH {
                flush(&mut batch, first_line, n)?;
                first_line = n + 1;
            }
        }
        flush(&mut batch, first_line, n)
    })();
    pb.finish_and_clear();
    store.writer.stop();
    result?;
    emit(&format!(
        "imported {} record(s) and {} tombstone(s); {} already here, {} removed here (left out), {} conflicting\n",
        total.records, total.tombstones, total.present, total.removed_here, total.conflicts
    ))?;
    if !conflicts.is_empty() {
        conflicts.truncate(20);
        bail!(
            "{} record(s) not imported: their ids are taken here by different records (first: {:?})",
            total.conflicts,
            conflicts
        );
    }
    Ok(())
}
