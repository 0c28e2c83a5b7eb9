//! Retention sweep benchmark (issue 6): does a large sweep stall ingest?
//!
//! 1. Fill a database with BENCH_SWEEP_ROWS (default 1,000,000) records first seen 30 days
//!    ago (through the store's own writer, ~600-byte payloads, 20 partitions).
//! 2. Baseline: the real server on that file with retention that removes nothing; an open-loop
//!    load of BENCH_RATE (default 1000) ingests per second for BENCH_BASELINE_SECS (10).
//! 3. Sweep: the real server again, default retention (14 days): the sweeper starts at once
//!    and removes every old record, leaving tombstones, then gives the space back (incremental
//!    vacuum); the same open-loop load runs until both are done (GET /v1/retention says how
//!    many went and how many free bytes are left).
//!
//! Latency is measured from each request's scheduled send time (so a stall counts fully, not
//! just the one request that waited). Prints p50/p99/max for both phases, their ratio, and the
//! sweep's duration and rate. Target: ingest p99 <= 50 ms during the sweep at 1k/s.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use common::{env_usize, fill, read_response, real_server, request, DAY_MS};
use deadletter::config::Config;

struct Phase {
    sent: usize,
    errors: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// Open-loop load: a request scheduled every 1/rate s, sent by the first free one of 32
/// keep-alive connections, until `stop` is set; latency from the scheduled time.
fn open_loop(addr: std::net::SocketAddr, rate: usize, tag: &str, stop: Arc<AtomicBool>) -> Phase {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tag = tag.to_owned();
    rt.block_on(async move {
        // One queue, many workers: the first free connection sends the next request.
        let (tx, rx) = tokio::sync::mpsc::channel::<(usize, Instant)>(4096);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let mut workers = Vec::new();
        for _ in 0..32 {
            let rx = rx.clone();
            let tag = tag.clone();
            workers.push(tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                let mut buf = Vec::with_capacity(4096);
                let (mut lat, mut errors) = (Vec::new(), 0);
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some((n, scheduled)) = next else { break };
                    let body = serde_json::json!({
                        "partition": "live",
                        "idempotency_key": format!("{tag}-{n}"),
                        "error": {"message": "timeout", "status": 504},
                        "payload": {"order": n, "note": "y".repeat(400)},
                    })
                    .to_string();
                    s.write_all(&request("/v1/dead-letters", body.as_bytes()))
                        .await
                        .unwrap();
                    buf.clear();
                    if read_response(&mut s, &mut buf).await != 201 {
                        errors += 1;
                    }
                    lat.push(scheduled.elapsed());
                }
                (lat, errors)
            }));
        }
        let every = Duration::from_secs_f64(1.0 / rate as f64);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut n = 0usize;
        loop {
            let at = tick.tick().await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
            tx.send((n, at.into_std())).await.unwrap();
            n += 1;
        }
        drop(tx);
        let (mut all, mut errors) = (Vec::new(), 0);
        for w in workers {
            let (l, e) = w.await.unwrap();
            all.extend(l);
            errors += e;
        }
        all.sort();
        let pick = |q: f64| {
            all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
                .as_secs_f64()
                * 1e3
        };
        Phase {
            sent: n,
            errors,
            p50_ms: pick(0.5),
            p99_ms: pick(0.99),
            max_ms: all.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        }
    })
}

/// Records removed by age so far, and free bytes not yet given back, from the server's own
/// retention view.
fn progress(addr: std::net::SocketAddr) -> (i64, i64) {
    let v: serde_json::Value = reqwest::blocking::get(format!("http://{addr}/v1/retention"))
        .and_then(|r| r.json())
        .unwrap_or_default();
    (
        v["removed"]["age"].as_i64().unwrap_or(0),
        v["free_bytes"].as_i64().unwrap_or(i64::MAX),
    )
}

fn main() {
    let rows = env_usize("BENCH_SWEEP_ROWS", 1_000_000);
    let rate = env_usize("BENCH_RATE", 1000);
    let baseline_secs = env_usize("BENCH_BASELINE_SECS", 10) as u64;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    println!("deadletter sweep bench: {rows} expired records, ingest at {rate}/s");

    let took = fill(&dir, rows, 30 * DAY_MS);
    let size = std::fs::metadata(dir.join("deadletter.db"))
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "filled {rows} records in {:.1} s ({:.0}/s); deadletter.db {:.0} MB",
        took.as_secs_f64(),
        rows as f64 / took.as_secs_f64(),
        size as f64 / 1e6
    );

    let no_caps = |c: &mut Config| {
        c.retention.max_bytes = None;
        c.retention.max_total_bytes = None;
    };
    // The load runs here; a watcher thread says when to stop.
    let run = |addr, tag: &str, until: Box<dyn Fn(Duration) -> bool + Send>| {
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                while !until(started.elapsed()) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                stop.store(true, Ordering::Relaxed);
            })
        };
        let phase = open_loop(addr, rate, tag, stop);
        watcher.join().unwrap();
        phase
    };
    let baseline = {
        let srv = real_server(&dir, |c| {
            no_caps(c);
            c.retention.max_age = Duration::from_secs(3650 * 86_400);
        });
        run(
            srv.addr,
            "base",
            Box::new(move |t| t >= Duration::from_secs(baseline_secs)),
        )
    };

    let (sweep, sweep_time) = {
        let srv = real_server(&dir, no_caps);
        let addr = srv.addr;
        let started = Instant::now();
        // Until every old record went and their space was given back (under 4 MiB free), or
        // an hour passed, whatever happens.
        let phase = run(
            addr,
            "sweep",
            Box::new(move |t| {
                let (removed, free) = progress(addr);
                (removed >= rows as i64 && free < 4 << 20) || t > Duration::from_secs(3600)
            }),
        );
        let (swept, free) = progress(addr);
        assert_eq!(swept, rows as i64, "the sweep did not finish");
        println!("free pages left: {free} bytes");
        (phase, started.elapsed())
    };

    println!();
    println!("| phase | requests | errors | p50 ms | p99 ms | max ms |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, p) in [
        ("baseline (nothing to sweep)", &baseline),
        ("during the sweep", &sweep),
    ] {
        println!(
            "| {name} | {} | {} | {:.2} | {:.2} | {:.2} |",
            p.sent, p.errors, p.p50_ms, p.p99_ms, p.max_ms
        );
    }
    println!();
    println!(
        "sweep: {rows} records removed (tombstones kept) and their space given back in {:.1} s = {:.0}/s while ingesting",
        sweep_time.as_secs_f64(),
        rows as f64 / sweep_time.as_secs_f64()
    );
    println!(
        "ingest p99 during the sweep: {:.2} ms (target <= 50 ms); {:.2}x the baseline p99",
        sweep.p99_ms,
        sweep.p99_ms / baseline.p99_ms.max(1e-9)
    );
    let after = std::fs::metadata(dir.join("deadletter.db"))
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "deadletter.db after the sweep: {:.0} MB (was {:.0} MB): incremental vacuum gave the space back",
        after as f64 / 1e6,
        size as f64 / 1e6
    );
}
