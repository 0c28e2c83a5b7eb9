//! What the benches share: knobs, raw HTTP/1.1 requests and answers, and servers on their own
//! runtime (the real one built from a `Config`).
#![allow(dead_code)] // each bench uses its own part of it

use std::net::SocketAddr;
use std::path::Path;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use deadletter::config::Config;

pub const DAY_MS: i64 = 86_400_000;

pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn request(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

pub async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> u16 {
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end]).unwrap();
    let status: u16 = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
    status
}

/// A server on its own 2-thread runtime, stopped (gracefully) on drop.
pub struct Running {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    pub fn start(
        make: impl FnOnce(
                tokio::net::TcpListener,
                tokio::sync::oneshot::Receiver<()>,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            + Send
            + 'static,
    ) -> Running {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                make(l, stop_rx).await;
            });
        });
        Running {
            addr: addr_rx.recv().unwrap(),
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.thread.take().unwrap().join().unwrap();
    }
}

pub fn real_server(dir: &Path, tweak: impl FnOnce(&mut Config)) -> Running {
    let mut config = Config::default_config().unwrap();
    config.set_data_dir(dir.to_owned());
    config.logging.stderr = false;
    // Ingest alone: the retry scheduler would start sending (or giving up on) records whose
    // jittered first retry falls inside the run.
    config.delivery.enabled = false;
    if let Ok(level) = std::env::var("BENCH_LOG_LEVEL") {
        config.logging.level = level;
    }
    tweak(&mut config);
    Running::start(move |listener, stop| {
        Box::pin(async move {
            // Logs as in production (the first server's subscriber stays for the process).
            let _log = deadletter::logging::init_server(&config.logging);
            let store = deadletter::server::open_store(&config).unwrap();
            deadletter::server::serve(config, store, listener, async {
                let _ = stop.await;
            })
            .await
            .unwrap();
        })
    })
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Fill `dir` with `rows` records first seen `age_ms` ago, through the store's writer, from
/// many tasks at once (so they group-commit as they would under load): ~600-byte payloads,
/// 20 partitions, 50 workflows.
pub fn fill(dir: &Path, rows: usize, age_ms: i64) -> Duration {
    let started = Instant::now();
    let mut config = Config::default_config().unwrap();
    config.set_data_dir(dir.to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = deadletter::server::open_store(&config).unwrap();
        let ingestor = Arc::new(deadletter::ingest::Ingestor::new(&config));
        let old = chrono::Utc::now().timestamp_millis() - age_ms;
        let workers = 64;
        let mut tasks = Vec::new();
        for w in 0..workers {
            let (writer, ingestor) = (store.writer.clone(), ingestor.clone());
            tasks.push(tokio::spawn(async move {
                let ctx = deadletter::ingest::RequestContext {
                    actor: "bench".into(),
                    ..Default::default()
                };
                let mut n = w;
                while n < rows {
                    let body = serde_json::json!({
                        "partition": format!("team-{}", n % 20),
                        "idempotency_key": format!("fill-{n}"),
                        "workflow_id": format!("wf-{}", n % 50),
                        "error": {"message": "upstream answered 503", "status": 503},
                        "payload": {"order": n, "customer": {"id": n * 7, "email": format!("c{n}@example.com")},
                                    "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-22", "qty": 1}],
                                    "note": "x".repeat(400)},
                    })
                    .to_string();
                    let rec = ingestor
                        .prepare(
                            deadletter::model::Source::Envelope,
                            body.as_bytes(),
                            &ctx,
                            old + n as i64,
                        )
                        .unwrap();
                    writer.ingest(rec).await.unwrap();
                    n += workers;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        store.writer.stop();
    });
    started.elapsed()
}
