//! Who may do what, and what faults get: tokens and roles, the two-person rule on tokens,
//! refusing an open non-loopback listener, private files, one server per data dir, a locked
//! database at start, a full disk (507, then writes again once space is freed), slow clients,
//! and a bounded shutdown.

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::harness::{stderr, stdout, Server, BIN};

const ADMIN: &str = "admin-token-0123456789abcdef";
const OPS: &str = "operator-token-0123456789abcd";
const N8N: &str = "ingest-token-0123456789abcdef";

fn tokens_config(dir: &std::path::Path) -> String {
    std::fs::write(dir.join("ops.token"), format!("{OPS}\n")).unwrap();
    std::fs::write(dir.join("n8n.token"), N8N).unwrap();
    format!(
        "[[auth.tokens]]\nname = \"admin\"\nrole = \"admin\"\nsha256 = \"{}\"\n\
         [[auth.tokens]]\nname = \"ops\"\nrole = \"operator\"\nfile = \"{}\"\n\
         [[auth.tokens]]\nname = \"n8n\"\nrole = \"ingest\"\nfile = \"{}\"\n",
        hex::encode(Sha256::digest(ADMIN.as_bytes())),
        dir.join("ops.token").display(),
        dir.join("n8n.token").display()
    )
}

fn call(
    s: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    actor: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = s.client.request(method.parse().unwrap(), s.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(a) = actor {
        req = req.header("x-deadletter-actor", a);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let res = req.send().unwrap();
    let status = res.status().as_u16();
    (status, res.json().unwrap_or(Value::Null))
}

#[test]
fn tokens_and_roles_decide_who_may_do_what() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(&tokens_config(dir.path()));
    let item = json!({"payload": {"n": 1}, "error": {"message": "order cancelled"}, "partition": "orders"});

    assert_eq!(s.get("/healthz").status, 200, "health stays open");
    let (st, body) = call(&s, "GET", "/v1/dead-letters", None, None, None);
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let res = s.client.get(s.url("/v1/dead-letters")).send().unwrap();
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    assert_eq!(
        call(
            &s,
            "GET",
            "/v1/dead-letters",
            Some("not-a-real-token-at-all"),
            None,
            None
        )
        .0,
        401
    );

    // n8n's token may only post failures.
    let (st, body) = call(
        &s,
        "POST",
        "/v1/dead-letters",
        Some(N8N),
        None,
        Some(item.clone()),
    );
    assert_eq!(st, 201, "{body}");
    let id = body["id"].as_i64().unwrap();
    let (st, body) = call(&s, "GET", "/v1/dead-letters", Some(N8N), None, None);
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    assert_eq!(
        call(
            &s,
            "PATCH",
            &format!("/v1/dead-letters/{id}"),
            Some(N8N),
            None,
            Some(json!({"note": "x"}))
        )
        .0,
        403
    );

    // An operator reads and triages; the actor is the token, narrowed by the header.
    assert_eq!(
        call(
            &s,
            "GET",
            &format!("/v1/dead-letters/{id}"),
            Some(OPS),
            None,
            None
        )
        .0,
        200
    );
    let (st, _) = call(
        &s,
        "PATCH",
        &format!("/v1/dead-letters/{id}"),
        Some(OPS),
        Some("ana"),
        Some(json!({"note": "looking"})),
    );
    assert_eq!(st, 200);
    let rec = call(
        &s,
        "GET",
        &format!("/v1/dead-letters/{id}"),
        Some(ADMIN),
        None,
        None,
    )
    .1;
    let events = rec["events"].as_array().unwrap();
    assert_eq!(events[0]["actor"], "n8n");
    assert_eq!(events[1]["actor"], "ana (ops)");

    // Approving needs admin, and a different token than the one that asked.
    let s2 = Server::start_with(
        &(tokens_config(dir.path()) + "\n[replay]\nrequire_approval = [\"orders\"]\n"),
    );
    let (_, b) = call(
        &s2,
        "POST",
        "/v1/dead-letters",
        Some(N8N),
        None,
        Some(item.clone()),
    );
    let rid = b["id"].as_i64().unwrap();
    let (st, job) = call(
        &s2,
        "POST",
        "/v1/replays",
        Some(OPS),
        Some("ana"),
        Some(json!({"ids": [rid]})),
    );
    assert_eq!(
        (st, job["status"].as_str()),
        (201, Some("awaiting_approval")),
        "{job}"
    );
    let jid = job["id"].as_i64().unwrap();
    let (st, b) = call(
        &s2,
        "POST",
        &format!("/v1/replays/{jid}/approve"),
        Some(OPS),
        Some("bo"),
        None,
    );
    assert_eq!(st, 403, "an operator cannot approve: {b}");
    let (st, b) = call(
        &s2,
        "POST",
        &format!("/v1/replays/{jid}/approve"),
        Some(ADMIN),
        Some("carla"),
        None,
    );
    assert_eq!(st, 200, "{b}");
    assert_eq!(b["approved_by"], "carla (admin)");
    // With tokens, a second name under the asking token is not a second person.
    let (_, job) = call(
        &s2,
        "POST",
        "/v1/replays",
        Some(ADMIN),
        Some("carla"),
        Some(json!({"ids": [rid], "dry_run": false})),
    );
    let (st, b) = call(
        &s2,
        "POST",
        &format!("/v1/replays/{}/approve", job["id"]),
        Some(ADMIN),
        Some("someone-else"),
        None,
    );
    assert_eq!(st, 409, "{b}");
    assert!(b["error"]["message"]
        .as_str()
        .unwrap()
        .contains("second person"));

    // The CLI takes its token from a file (never a flag).
    let o = s.cli(&[
        "--server",
        &s.url(""),
        "--token-file",
        dir.path().join("ops.token").to_str().unwrap(),
        "--actor",
        "dee",
        "resolve",
        &id.to_string(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = s.cli(&["--server", &s.url(""), "resolve", &id.to_string()]);
    assert!(!o.status.success());
    assert!(stdout(&o).contains("401"), "{}", stdout(&o));
}

#[test]
fn an_open_api_is_refused_on_a_non_loopback_address() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .arg("--data-dir")
        .arg(dir.path())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stdout(&o).is_empty(), "nothing listened");
    assert!(
        stderr(&o).contains("refusing to listen on 0.0.0.0:0 with no API token"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn files_are_private_and_one_server_owns_a_data_dir() {
    use std::os::unix::fs::PermissionsExt;
    let s = Server::start();
    assert_eq!(s.post("/v1/dead-letters", r#"{"payload":1}"#).status, 201);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.dir), 0o700);
    for f in ["deadletter.db", "deadletter.db-wal", "deadletter.db-shm"] {
        assert_eq!(mode(&s.dir.join(f)), 0o600, "{f}");
    }
    for log in std::fs::read_dir(s.dir.join("logs")).unwrap() {
        assert_eq!(mode(&log.unwrap().path()), 0o600);
    }
    let err = Server::start_in(&s.dir, "")
        .err()
        .expect("a second server on the same dir must refuse");
    assert!(
        err.contains("another deadletter is already serving"),
        "{err}"
    );
}

#[test]
fn a_locked_database_at_start_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    drop(Server::start_in(dir.path(), "").unwrap());
    let conn = rusqlite::Connection::open(dir.path().join("deadletter.db")).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let err = Server::start_in(dir.path(), "[storage]\nbusy_timeout_ms = 300\n")
        .err()
        .expect("must refuse");
    assert!(err.contains("is locked by another process"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    conn.execute_batch("ROLLBACK").unwrap();
    assert!(
        Server::start_in(dir.path(), "").is_ok(),
        "starts once the lock is gone"
    );
}

/// A small tmpfs the test mounts (the suite runs as root, as CI does), unmounted on drop.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap().keep();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(
            ok.success(),
            "mounting a tmpfs needs root (CI runs as root)"
        );
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_answers_507_keeps_reads_and_recovers_without_a_restart() {
    let disk = SmallDisk::mount("3m");
    let data = disk.0.join("data");
    std::fs::create_dir_all(&data).unwrap();
    // Logs go elsewhere, so that only the database fills the small disk.
    let logs = tempfile::tempdir().unwrap();
    let s = Server::start_in(
        &data,
        &format!("[logging]\ndir = \"{}\"\n", logs.path().display()),
    )
    .unwrap();
    let first = s.post(
        "/v1/dead-letters",
        json!({"payload": {"keep": "me"}}).to_string(),
    );
    assert_eq!(first.status, 201);
    // Leave little room, then ingest until the disk is full.
    let filler = disk.0.join("filler");
    let free = || {
        let out = Command::new("df")
            .arg("--output=avail")
            .arg("-B1")
            .arg(&disk.0)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let mut f = std::fs::File::create(&filler).unwrap();
    let leave = 96 * 1024;
    let chunk = vec![0u8; 4096];
    while free() > leave {
        if f.write_all(&chunk).is_err() {
            break;
        }
        f.flush().unwrap();
    }
    drop(f);
    let mut full = None;
    for n in 0..2000 {
        let r = s.post("/v1/dead-letters", json!({"payload": {"n": n, "pad": "x".repeat(3000)}, "idempotency_key": format!("k{n}")}).to_string());
        if r.status == 507 {
            full = Some(r);
            break;
        }
        assert_eq!(r.status, 201, "{}", r.text);
    }
    let full = full.expect("the disk never filled");
    assert_eq!(full.json["error"]["code"], "disk_full");
    // What was stored is intact and readable.
    let rec = s.get(&format!("/v1/dead-letters/{}", first.json["id"]));
    assert_eq!(
        (rec.status, rec.json["payload"]["keep"].as_str()),
        (200, Some("me"))
    );
    assert_eq!(s.get("/healthz").status, 200);
    // Space freed: writes work again, same process.
    std::fs::remove_file(&filler).unwrap();
    let again = s.post(
        "/v1/dead-letters",
        json!({"payload": {"after": true}}).to_string(),
    );
    assert_eq!(again.status, 201, "{}", again.text);
    drop(s);
}

#[test]
fn oversized_headers_get_431_naming_the_limit() {
    let s = Server::start_with("[server]\nmax_header_bytes = 2048\n");
    let r = s
        .client
        .get(s.url("/v1/dead-letters"))
        .header("x-filler", "a".repeat(4000))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 431);
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["code"], "headers_too_large");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("server.max_header_bytes"));
    assert_eq!(s.get("/v1/dead-letters").status, 200);
}

#[test]
fn slow_clients_time_out_and_shutdown_is_bounded() {
    let mut s =
        Server::start_with("[server]\nrequest_timeout = \"500ms\"\nshutdown_timeout = \"1s\"\n");
    // A body that never finishes: 408 after the request timeout.
    let mut slow = std::net::TcpStream::connect(&s.addr).unwrap();
    slow.write_all(b"POST /v1/dead-letters HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"pay").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 512];
    let n = std::io::Read::read(&mut slow, &mut buf).unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Another slow client holds a connection open across SIGTERM: exit is bounded anyway.
    let mut held = std::net::TcpStream::connect(&s.addr).unwrap();
    held.write_all(b"POST /v1/dead-letters HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let (status, log) = s.terminate();
    assert!(status.success(), "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_readable_config_with_a_literal_secret_header_gets_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[[targets]]\nname = \"t\"\nurl = \"http://127.0.0.1:1/\"\nheaders = { Authorization = \"Bearer abc\" }\n").unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .args(["config", "check"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success());
    let o = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("list")
        .output()
        .unwrap();
    assert!(
        stderr(&o).contains("holds a literal `Authorization` header"),
        "{}",
        stderr(&o)
    );
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("list")
        .output()
        .unwrap();
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}
