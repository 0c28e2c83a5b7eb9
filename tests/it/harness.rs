//! Starts the real `deadletter` binary on port 0 with a temp data dir (and optional config),
//! talks to it over HTTP, runs its CLI, and kills it on drop.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_deadletter");

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/n8n")
            .join(name),
    )
    .unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

pub struct Server {
    pub child: Option<Child>,
    pub addr: String,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stderr: Option<std::thread::JoinHandle<String>>,
    pub client: reqwest::blocking::Client,
}

pub struct Reply {
    pub status: u16,
    pub json: Value,
    pub text: String,
}

impl Server {
    /// A fresh server on a fresh data dir with the embedded default config.
    pub fn start() -> Server {
        Server::start_with("")
    }

    /// A fresh server whose config file holds `toml` (data dir and listen are set by us).
    pub fn start_with(toml: &str) -> Server {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let mut s =
            Server::start_in(&dir, toml).unwrap_or_else(|e| panic!("server did not start: {e}"));
        s._tmp = Some(tmp);
        s
    }

    /// Start on an existing data dir (restarts keep the dir). Automatic retries are off unless
    /// the config has a `[delivery]` table: a test that wants them says so.
    pub fn start_in(dir: &Path, toml: &str) -> Result<Server, String> {
        let config = dir.join("deadletter.toml");
        let toml = if toml.contains("[delivery]") {
            toml.to_owned()
        } else {
            format!("{toml}\n[delivery]\nenabled = false\n")
        };
        std::fs::write(&config, toml).unwrap();
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let stderr_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(addr) = line.trim().strip_prefix("deadletter listening on http://") else {
            let _ = child.wait();
            return Err(format!(
                "first line {line:?}; stderr: {}",
                stderr_reader.join().unwrap()
            ));
        };
        let s = Server {
            addr: addr.to_owned(),
            child: Some(child),
            dir: dir.to_owned(),
            _tmp: None,
            stderr: Some(stderr_reader),
            client: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        };
        Ok(s)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn post(&self, path: &str, body: impl Into<Vec<u8>>) -> Reply {
        self.post_as(path, "application/json", body)
    }

    pub fn post_as(&self, path: &str, content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
        let res = self
            .client
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body.into())
            .send()
            .unwrap();
        reply(res)
    }

    /// PATCH a record as `actor`, optionally with `If-Match`.
    pub fn patch(
        &self,
        id: i64,
        body: serde_json::Value,
        actor: &str,
        if_match: Option<i64>,
    ) -> Reply {
        let mut req = self
            .client
            .patch(self.url(&format!("/v1/dead-letters/{id}")))
            .header("content-type", "application/json")
            .header("x-deadletter-actor", actor)
            .body(body.to_string());
        if let Some(v) = if_match {
            req = req.header("if-match", format!("\"{v}\""));
        }
        reply(req.send().unwrap())
    }

    /// Run a CLI verb that talks to this server.
    pub fn verb(&self, args: &[&str]) -> Output {
        let url = self.url("");
        let mut all = vec!["--server", url.as_str(), "--actor", "cli-tester"];
        all.extend_from_slice(args);
        self.cli(&all)
    }

    pub fn get(&self, path: &str) -> Reply {
        reply(self.client.get(self.url(path)).send().unwrap())
    }

    /// Run the CLI against this server's data dir.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Kill with SIGKILL: no shutdown, no flush, no checkpoint.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Stop with SIGTERM and wait; returns the exit status and everything logged to stderr.
    pub fn terminate(&mut self) -> (std::process::ExitStatus, String) {
        let mut c = self.child.take().expect("running");
        Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "did not stop within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, self.stderr.take().unwrap().join().unwrap())
    }
}

pub fn reply(res: reqwest::blocking::Response) -> Reply {
    let status = res.status().as_u16();
    let text = res.text().unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, json, text }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Poll `f` until it returns Some, or panic at the deadline. Tests never sleep to wait.
pub fn eventually<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
