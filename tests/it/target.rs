//! A scripted HTTP target for delivery tests: answers each request with the next behaviour
//! of its script (then a default), and records every request it got.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub enum Behave {
    /// Answer with this status, extra headers and body.
    Answer(u16, Vec<(&'static str, String)>, String),
    /// Read the request, then say nothing for this long (and close).
    Hang(Duration),
    /// Read the request and close the connection without answering.
    Close,
    /// Answer with bytes that are not HTTP.
    Garbage,
    /// Answer 200 with a body of this many bytes (streamed; the client may stop reading).
    Huge(usize),
    /// Take this long, then answer like `ok()` (a slow but healthy target).
    Slow(Duration),
}

pub fn ok() -> Behave {
    Behave::Answer(200, vec![], r#"{"ok":true,"executionId":"77"}"#.into())
}

pub fn status(code: u16) -> Behave {
    Behave::Answer(code, vec![], format!(r#"{{"status":{code}}}"#))
}

#[derive(Clone, Debug)]
pub struct Got {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct Target {
    pub url: String,
    script: Arc<Mutex<VecDeque<Behave>>>,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Target {
    pub fn start(script: Vec<Behave>, default: Behave) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (s, g) = (script.clone(), got.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (s, g, d) = (s.clone(), g.clone(), default.clone());
                std::thread::spawn(move || serve(conn, s, g, d));
            }
        });
        Target { url, script, got }
    }

    pub fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    pub fn push(&self, b: Behave) {
        self.script.lock().unwrap().push_back(b);
    }
}

fn serve(
    conn: TcpStream,
    script: Arc<Mutex<VecDeque<Behave>>>,
    got: Arc<Mutex<Vec<Got>>>,
    default: Behave,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let path = parts.next().unwrap_or("").to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    got.lock().unwrap().push(Got {
        at: Instant::now(),
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let mut behave = script.lock().unwrap().pop_front().unwrap_or(default);
    if let Behave::Slow(d) = behave {
        std::thread::sleep(d);
        behave = ok();
    }
    let mut conn = conn;
    match behave {
        Behave::Answer(code, extra, body) => {
            let mut head = format!("HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
            for (k, v) in extra {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            let _ = conn.write_all(format!("{head}\r\n{body}").as_bytes());
        }
        Behave::Hang(d) => std::thread::sleep(d),
        Behave::Close | Behave::Slow(_) => {}
        Behave::Garbage => {
            let _ = conn.write_all(b"\x00\x01NOT HTTP AT ALL\r\n\r\n\xff\xfe");
        }
        Behave::Huge(n) => {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {n}\r\nconnection: close\r\n\r\n");
            if conn.write_all(head.as_bytes()).is_ok() {
                let chunk = vec![b'a'; 64 * 1024];
                let mut left = n;
                while left > 0 {
                    let k = left.min(chunk.len());
                    if conn.write_all(&chunk[..k]).is_err() {
                        break;
                    }
                    left -= k;
                }
            }
        }
    }
}
