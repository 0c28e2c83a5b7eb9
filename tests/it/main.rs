//! The one integration test binary: every test drives the real `deadletter` executable.

mod harness;
mod target;

mod cli;
mod config;
mod dashboards;
mod delivery;
mod durability;
mod fake_n8n;
mod fuzz_corpus;
mod ingest;
mod metrics;
mod n8n_templates;
mod openapi;
mod read;
mod redaction;
mod replays;
mod retention;
mod schemathesis;
mod security;
mod service;
mod triage;
mod ui;
