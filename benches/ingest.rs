//! Ingest benchmark: in one run, interleaved rounds of
//!   (a) the same HTTP stack (axum + deadletter's layers) with a handler that only parses the
//!       JSON and answers 201 — the ceiling the HTTP stack and load generator allow;
//!   (b) durable ingest of ~2 KB n8n Error Trigger items through the real server (parse,
//!       redact, classify, compress, group commit with synchronous=FULL), 32 connections;
//!   (c) raw SQLite inserts of the same 2 KB rows, uncompressed, same indexes,
//!       synchronous=FULL, 32 rows per transaction, one thread;
//! then the disk used per item after ingesting BENCH_DISK_ITEMS items through (b).
//! Prints requests (rows) per second and p50/p99 latency per scenario (median over rounds) and
//! the ratios b/c and a/b. BENCHMARKS.md records the figures.
//!
//! Knobs (environment): BENCH_REQUESTS (per round, default 20000), BENCH_ROUNDS (3),
//! BENCH_CONNECTIONS (32), BENCH_DISK_ITEMS (100000; 0 skips the disk measure),
//! BENCH_ONLY=b (run only scenario (b), for profiling: prints its figures and stops),
//! BENCH_LOG_LEVEL (the server's log filter; default: the default config's `info`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

mod common;
use common::{env_usize, median, read_response, real_server, request, Running};

const FIXTURE: &str =
    include_str!("../tests/fixtures/n8n/error-trigger-body.dlqHttp500Wf0001.raw.json");

/// Distinct Error Trigger bodies (execution id and url vary, so none deduplicates), ~2 KB each.
fn bodies(n: usize, offset: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let id = (offset + i + 1000).to_string();
            FIXTURE
                .replace("\"id\":\"4\"", &format!("\"id\":\"{id}\""))
                .replace("/executions/4\"", &format!("/executions/{id}\""))
                .into_bytes()
        })
        .collect()
}

#[derive(Clone, Debug)]
struct Stats {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
}

fn stats(count: usize, elapsed: Duration, mut lat: Vec<Duration>, errors: usize) -> Stats {
    lat.sort();
    let pick = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Stats {
        per_sec: count as f64 / elapsed.as_secs_f64(),
        p50_ms: pick(0.50).as_secs_f64() * 1e3,
        p99_ms: pick(0.99).as_secs_f64() * 1e3,
        errors,
    }
}

/// A cheap load generator: raw HTTP/1.1 keep-alive over `conns` connections on a
/// single-threaded runtime, each sending the next request as soon as its answer arrived.
fn load(addr: SocketAddr, requests: Arc<Vec<Vec<u8>>>, conns: usize, want_status: u16) -> Stats {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..conns {
            let (next, requests) = (next.clone(), requests.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                let mut buf = Vec::with_capacity(4096);
                let mut lat = Vec::new();
                let mut errors = 0;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests.len() {
                        break;
                    }
                    let t = Instant::now();
                    s.write_all(&requests[i]).await.unwrap();
                    buf.clear();
                    let status = read_response(&mut s, &mut buf).await;
                    lat.push(t.elapsed());
                    if status != want_status {
                        errors += 1;
                    }
                }
                (lat, errors)
            }));
        }
        let mut all = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (l, e) = t.await.unwrap();
            all.extend(l);
            errors += e;
        }
        let elapsed = started.elapsed();
        stats(all.len(), elapsed, all, errors)
    })
}

fn parse_only_server() -> Running {
    Running::start(|listener, stop| {
        Box::pin(async move {
            async fn parse_only(body: Bytes) -> (StatusCode, &'static str) {
                match serde_json::from_slice::<serde_json::Value>(&body) {
                    Ok(_) => (StatusCode::CREATED, "{\"id\":1,\"status\":\"new\"}"),
                    Err(_) => (StatusCode::BAD_REQUEST, "{}"),
                }
            }
            let app = deadletter::http::with_layers(
                Router::new().route("/v1/n8n/error-trigger", post(parse_only)),
                16 << 20,
            );
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop.await;
                })
                .await
                .unwrap();
        })
    })
}

const RAW_SCHEMA: &str = "
CREATE TABLE dead_letters (
    id INTEGER PRIMARY KEY, partition TEXT NOT NULL, status TEXT NOT NULL, source TEXT NOT NULL,
    failure_class TEXT NOT NULL, class_rule TEXT NOT NULL, fingerprint INTEGER NOT NULL, dedup_key BLOB,
    occurrences INTEGER NOT NULL DEFAULT 1, first_seen_at INTEGER NOT NULL, last_seen_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL, workflow_id TEXT, workflow_name TEXT, execution_id TEXT, execution_url TEXT,
    execution_mode TEXT, node_name TEXT, node_type TEXT, http_status INTEGER, error_name TEXT, error_message TEXT,
    body BLOB NOT NULL);
CREATE INDEX dead_letters_open_dedup ON dead_letters(partition, dedup_key)
    WHERE status NOT IN ('replayed','resolved','skipped');
CREATE INDEX dead_letters_status ON dead_letters(status, id);
CREATE INDEX dead_letters_fingerprint ON dead_letters(fingerprint, id);
CREATE INDEX dead_letters_workflow ON dead_letters(workflow_id, id);
";

/// (c): the same 2 KB rows straight into SQLite, 32 per transaction, synchronous=FULL.
fn raw_sqlite(dir: &Path, rows: &[Vec<u8>]) -> Stats {
    let conn = rusqlite::Connection::open(dir.join("raw.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    conn.execute_batch(RAW_SCHEMA).unwrap();
    let mut conn = conn;
    let mut lat = Vec::new();
    let started = Instant::now();
    for (n, chunk) in rows.chunks(32).enumerate() {
        let t = Instant::now();
        let tx = conn.transaction().unwrap();
        {
            let mut st = tx
                .prepare_cached(
                    "INSERT INTO dead_letters (partition, status, source, failure_class, class_rule, fingerprint, dedup_key,
                     first_seen_at, last_seen_at, updated_at, workflow_id, workflow_name, execution_id, execution_url,
                     execution_mode, node_name, node_type, http_status, error_name, error_message, body)
                     VALUES ('default','new','n8n_error_trigger','transient','transient-status',?1,?2,?3,?3,?3,
                     'dlqHttp500Wf0001','Orders via HTTP 500 (fails)',?4,?5,'webhook','Call downstream',
                     'n8n-nodes-base.httpRequest',500,'NodeApiError','The service was not able to process your request',?6)",
                )
                .unwrap();
            for (i, body) in chunk.iter().enumerate() {
                let k = (n * 32 + i) as i64;
                st.execute(rusqlite::params![
                    k.wrapping_mul(0x9E37_79B9_7F4A_7C15u64 as i64),
                    &k.to_le_bytes().repeat(2)[..],
                    1_700_000_000_000i64 + k,
                    k.to_string(),
                    format!("http://127.0.0.1:5678/workflow/dlqHttp500Wf0001/executions/{k}"),
                    body
                ])
                .unwrap();
            }
        }
        tx.commit().unwrap();
        let d = t.elapsed();
        lat.extend(std::iter::repeat_n(d, chunk.len()));
    }
    let st = stats(rows.len(), started.elapsed(), lat, 0);
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let size = std::fs::metadata(dir.join("raw.db")).unwrap().len();
    println!(
        "        (c) file: {:.0} bytes per row",
        size as f64 / rows.len() as f64
    );
    st
}

fn main() {
    let n = env_usize("BENCH_REQUESTS", 20_000);
    let rounds = env_usize("BENCH_ROUNDS", 3).max(1);
    let conns = env_usize("BENCH_CONNECTIONS", 32);
    let disk_items = env_usize("BENCH_DISK_ITEMS", 100_000);
    let body_len = bodies(1, 0)[0].len();
    println!("deadletter ingest bench: {n} requests/round, {rounds} rounds, {conns} connections, body {body_len} bytes");

    if std::env::var("BENCH_ONLY").as_deref() == Ok("b") {
        let reqs = Arc::new(
            bodies(n, 0)
                .iter()
                .map(|x| request("/v1/n8n/error-trigger", x))
                .collect::<Vec<_>>(),
        );
        let tmp = tempfile::tempdir().unwrap();
        let srv = real_server(tmp.path(), |_| {});
        let s = load(srv.addr, reqs, conns, 201);
        println!(
            "(b) only: {:.0}/s  p50 {:.2} ms  p99 {:.2} ms  errors {}",
            s.per_sec, s.p50_ms, s.p99_ms, s.errors
        );
        return;
    }

    let mut res: [Vec<Stats>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds {
        let b = bodies(n, round * n);
        let reqs = Arc::new(
            b.iter()
                .map(|x| request("/v1/n8n/error-trigger", x))
                .collect::<Vec<_>>(),
        );

        let a = {
            let srv = parse_only_server();
            load(srv.addr, reqs.clone(), conns, 201)
        };
        let tmp = tempfile::tempdir().unwrap();
        let bb = {
            let srv = real_server(tmp.path(), |_| {});
            load(srv.addr, reqs.clone(), conns, 201)
        };
        let c = raw_sqlite(tmp.path(), &b);
        for (name, s) in [("a", &a), ("b", &bb), ("c", &c)] {
            println!(
                "round {round} ({name}): {:>8.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms  errors {}",
                s.per_sec, s.p50_ms, s.p99_ms, s.errors
            );
            assert_eq!(s.errors, 0, "({name}) had errors");
        }
        res[0].push(a);
        res[1].push(bb);
        res[2].push(c);
    }

    let med =
        |i: usize, f: fn(&Stats) -> f64| median(&mut res[i].iter().map(f).collect::<Vec<_>>());
    println!();
    println!("| scenario | per second (median) | p50 ms | p99 ms |");
    println!("| --- | ---: | ---: | ---: |");
    let names = [
        "(a) HTTP stack, parse-only handler",
        "(b) durable ingest, real server",
        "(c) raw SQLite, 32 rows/txn, FULL",
    ];
    for (i, name) in names.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} |",
            med(i, |s| s.per_sec),
            med(i, |s| s.p50_ms),
            med(i, |s| s.p99_ms)
        );
    }
    let mut ratio_bc: Vec<f64> = (0..rounds)
        .map(|r| res[1][r].per_sec / res[2][r].per_sec)
        .collect();
    let mut ratio_ab: Vec<f64> = (0..rounds)
        .map(|r| res[0][r].per_sec / res[1][r].per_sec)
        .collect();
    println!();
    println!(
        "ratio b/c (median of per-round ratios): {:.2}x  (target >= 1.0)",
        median(&mut ratio_bc)
    );
    println!(
        "ratio a/b (median of per-round ratios): {:.2}x",
        median(&mut ratio_ab)
    );

    if disk_items > 0 {
        let tmp = tempfile::tempdir().unwrap();
        let b = bodies(disk_items, 10_000_000);
        let reqs = Arc::new(
            b.iter()
                .map(|x| request("/v1/n8n/error-trigger", x))
                .collect::<Vec<_>>(),
        );
        drop(b);
        let s = {
            let srv = real_server(tmp.path(), |_| {});
            load(srv.addr, reqs, conns, 201)
        };
        // The server has stopped: the WAL is checkpointed into the main file.
        let db = tmp.path().join("deadletter.db");
        let size = std::fs::metadata(&db).unwrap().len();
        let wal = std::fs::metadata(tmp.path().join("deadletter.db-wal"))
            .map(|m| m.len())
            .unwrap_or(0);
        println!();
        println!(
            "disk: {disk_items} items ingested at {:.0}/s -> deadletter.db {:.1} MB (+ wal {} bytes) = {:.0} bytes/item for {body_len}-byte items (target <= 1300)",
            s.per_sec,
            size as f64 / 1e6,
            wal,
            (size + wal) as f64 / disk_items as f64
        );
    }
}
