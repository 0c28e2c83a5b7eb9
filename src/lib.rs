//! deadletter: the dead-letter queue of a small self-hosted n8n installation.
//!
//! n8n posts failed items here; deadletter stores them durably in one SQLite file, classifies
//! why they failed, and lets operators read (later: triage, fix and replay) them.
//!
//! # Module map
//!
//! ```text
//! main.rs        parse CLI, init logging, dispatch, error -> exit code
//! cli            clap derive: every subcommand and its flags
//! commands/      one file per subcommand; the only place that prints for humans
//! config         TOML -> validated Config; the embedded commented example
//! logging        tracing to stderr + daily rolling files
//! model/         domain types, no I/O: ids, Status, FailureClass, the n8n and envelope shapes
//! classify       rule table -> failure class; fingerprints
//! redact         secrets out of errors, headers and payloads before anything is stored
//! ingest         the pipeline parse -> redact -> classify -> encode, producing store::NewRecord
//! store/         the only module with SQL: schema + migrations, single writer with group
//!                commit, reader pool, payload codec, queries
//! replay/        targets, per-target rate limit + breaker, the dispatcher (one send),
//!                the retry scheduler (claim with a lease, send, move on)
//! http/          router(state), handlers, ApiError -> JSON
//! server         serve(config, store, listener, shutdown)
//! ```
//!
//! Dependencies point one way: `commands -> server -> http/replay -> ingest -> store -> model`;
//! `model` imports nothing of ours, `store` never imports axum, `http` never sees rusqlite.
//! Still to come (see DESIGN.md): replay jobs, n8n/, retention, metrics, alerts.

pub mod classify;
pub mod cli;
pub mod commands;
pub mod config;
pub mod http;
pub mod ingest;
pub mod logging;
pub mod model;
pub mod redact;
pub mod replay;
pub mod server;
pub mod store;
