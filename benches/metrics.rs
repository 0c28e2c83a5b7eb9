//! Metrics scrape benchmark (issue 7): `GET /metrics` must stay cheap at any size — target
//! ≤ 10 ms at 1,000,000 records. Scrapes an empty server and then one holding
//! BENCH_METRICS_ROWS (default 1,000,000) records (20 partitions, first seen an hour ago),
//! BENCH_SCRAPES (default 200) times each, one after the other, and prints the median and p99
//! of both and their ratio.

mod common;

use std::time::{Duration, Instant};

use common::{env_usize, fill, real_server};

fn scrape(addr: std::net::SocketAddr, n: usize) -> (f64, f64, usize) {
    let client = reqwest::blocking::Client::new();
    let url = format!("http://{addr}/metrics");
    let mut lat = Vec::with_capacity(n);
    let mut bytes = 0;
    for _ in 0..n {
        let t = Instant::now();
        let body = client.get(&url).send().unwrap().text().unwrap();
        lat.push(t.elapsed());
        bytes = body.len();
        assert!(body.ends_with("# EOF\n"), "not an exposition: {body}");
    }
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(lat[n / 2]), ms(lat[(n * 99 / 100).min(n - 1)]), bytes)
}

fn main() {
    let rows = env_usize("BENCH_METRICS_ROWS", 1_000_000);
    let n = env_usize("BENCH_SCRAPES", 200).max(1);
    println!("deadletter metrics bench: {n} scrapes, empty vs {rows} records");
    let empty = {
        let tmp = tempfile::tempdir().unwrap();
        let srv = real_server(tmp.path(), |_| {});
        scrape(srv.addr, n)
    };
    let tmp = tempfile::tempdir().unwrap();
    let took = fill(tmp.path(), rows, 3_600_000);
    println!("filled {rows} records in {:.1} s", took.as_secs_f64());
    let full = {
        let srv = real_server(tmp.path(), |_| {});
        scrape(srv.addr, n)
    };
    println!();
    println!("| database | p50 ms | p99 ms | exposition bytes |");
    println!("| --- | ---: | ---: | ---: |");
    println!("| empty | {:.2} | {:.2} | {} |", empty.0, empty.1, empty.2);
    println!(
        "| {rows} records | {:.2} | {:.2} | {} |",
        full.0, full.1, full.2
    );
    println!();
    println!(
        "scrape p50 at {rows} records: {:.2} ms (target <= 10 ms); {:.2}x the empty database's",
        full.0,
        full.0 / empty.0.max(1e-9)
    );
}
