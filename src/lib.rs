//! deadletter: the dead-letter queue of a small self-hosted n8n installation.
//!
//! n8n posts failed items here; deadletter stores them durably in one SQLite file, classifies
//! why they failed, retries what a retry can fix, and lets operators triage, fix and replay
//! the rest.
//!
//! # Module map
//!
//! ```text
//! main.rs        parse CLI, init logging, dispatch, error -> exit code
//! cli            clap derive: every subcommand and its flags
//! commands/      one file per subcommand; the only place that prints for humans
//! config         TOML -> validated Config; the embedded commented example
//! logging        tracing to stderr + daily rolling files (pruned by age on the sweeper's schedule)
//! model/         domain types, no I/O: ids, Status, FailureClass, the n8n and envelope shapes
//! classify       rule table -> failure class; fingerprints
//! redact         secrets out of errors, headers and payloads before anything is stored
//! ingest         the pipeline parse -> redact -> classify -> encode, producing store::NewRecord
//! store/         the only module with SQL: schema + migrations, single writer with group
//!                commit, reader pool, payload codec, queries, retention (removal, tombstones,
//!                per-partition totals), export/import as JSON Lines
//! replay/        targets, per-target rate limit + breaker, the dispatcher (one send),
//!                the retry scheduler (claim with a lease, send, move on), replay jobs
//! retention      the sweeper: age, closed age and size caps (per partition and in total) in
//!                small time-boxed batches, tombstones kept, space given back; log pruning
//! http/          router(state), auth (tokens, roles, the actor), handlers, ApiError -> JSON,
//!                openapi (GET /openapi.json from the handlers' annotations), metrics (/metrics,
//!                /v1/stats), ui/ (the /ui pages: maud templates, sessions, CSRF, CSP;
//!                ui/replay: dry run, confirm, jobs, approval, live progress)
//! metrics        Prometheus counters/histograms kept as things happen + gauges from kept totals
//! n8n            n8n's public API: background enrichment of Error Trigger records
//! alerts         rules evaluated on a schedule (time passed in), throttled, posted to a webhook
//! server         serve(config, store, listener, shutdown)
//! service        plans a launchd agent/daemon or systemd unit (templates in launchd/, packaging/)
//! text           formatting shared by the CLI and the web page ("3m ago", clipping, encoding)
//! ```
//!
//! Dependencies point one way: `commands -> server -> http/replay -> ingest -> store -> model`;
//! `model` imports nothing of ours, `store` never imports axum, `http` never sees rusqlite.
//! Still to come (see DESIGN.md): n8n/, size caps and backup, metrics, alerts, the web UI.

pub mod alerts;
pub mod classify;
pub mod cli;
pub mod commands;
pub mod config;
pub mod http;
pub mod ingest;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod n8n;
pub mod redact;
pub mod replay;
pub mod retention;
pub mod server;
pub mod service;
pub mod store;
pub mod text;

/// The fuzz target's body, here so that the regular tests can replay the fuzz corpus through
/// exactly the same code: every parser and the whole ingest pipeline on arbitrary bytes. Panics
/// if something that must hold does not.
pub fn fuzz_ingest(ingestor: &ingest::Ingestor, data: &[u8]) {
    use model::Source;
    let _ = model::parse_error_trigger(data);
    let _ = model::parse_envelope(data);
    let ctx = ingest::RequestContext {
        actor: "fuzz".into(),
        ..ingest::RequestContext::default()
    };
    for source in [Source::ErrorTrigger, Source::Envelope] {
        if let Ok(rec) = ingestor.prepare(source, data, &ctx, 0) {
            if let Some(p) = &rec.payload {
                let bytes = store::codec::decode(p.codec, p.size, p.bytes.clone())
                    .expect("payload decodes");
                let v: serde_json::Value =
                    serde_json::from_slice(&bytes).expect("stored payload is JSON");
                assert_redacted(&v);
            }
            if let Some(e) = &rec.error {
                let bytes =
                    store::codec::decode(e.codec, e.size, e.bytes.clone()).expect("error decodes");
                let v: serde_json::Value =
                    serde_json::from_slice(&bytes).expect("stored error is JSON");
                assert_redacted(&v);
            }
        }
    }
    if let Ok(items) = ingest::Ingestor::split_batch(data) {
        for raw in items {
            let _ = ingestor.prepare(Source::Envelope, raw.get().as_bytes(), &ctx, 0);
        }
    }
}

fn assert_redacted(v: &serde_json::Value) {
    let r = redact::Redactor::new(
        &config::DEFAULT_REDACT_KEYS
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    );
    fn walk(r: &redact::Redactor, v: &serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    if r.is_sensitive_key(k) {
                        assert!(
                            matches!(x, serde_json::Value::Null | serde_json::Value::Bool(_))
                                || x.as_str()
                                    .is_some_and(|s| s.is_empty() || s == redact::REDACTED),
                            "a value under `{k}` survived redaction"
                        );
                    } else {
                        walk(r, x);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(r, x)),
            _ => {}
        }
    }
    walk(&r, v);
}
