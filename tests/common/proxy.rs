//! Proxy test helpers (tests/proxy.rs): the fake OpenAI worker
//! (tests/py/fake_openai_worker.py) as a child process, and HTTP calls to the proxy
//! port.

use super::Server;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const WORKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/py/fake_openai_worker.py"
);

/// One fake worker process; killed on drop.
pub struct FakeWorker {
    child: Option<Child>,
    pub id: String,
    pub port: u16,
}

impl FakeWorker {
    pub fn start(id: &str, extra: &[&str]) -> FakeWorker {
        let mut child = Command::new("python3")
            .args([WORKER, "--id", id])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn python3 fake worker");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).expect("PORT line");
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("fake worker said {line:?}"));
        FakeWorker {
            child: Some(child),
            id: id.into(),
            port,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn stats(&self) -> Value {
        agent()
            .get(&format!("{}/_stats", self.url()))
            .call()
            .expect("stats")
            .into_json()
            .expect("stats json")
    }

    pub fn received(&self) -> Vec<Value> {
        self.stats()["received"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub fn set_mode(&self, mode: &str) {
        agent()
            .post(&format!("{}/_mode", self.url()))
            .send_json(serde_json::json!({ "mode": mode }))
            .expect("mode");
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build()
}

/// Registers worker `id` of `model` with role `role` and upstream `url`.
pub fn register(s: &Server, id: &str, model: &str, role: &str, url: &str) {
    let (code, body) = s.post(
        "/v1/workers",
        serde_json::json!({"id": id, "model": model, "role": role, "url": url}),
    );
    assert!(code == 201 || code == 200, "register {id}: {code} {body}");
}

/// An answer from the proxy port.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// POSTs `body` (sent as these exact bytes) to the proxy's `path`.
pub fn post(s: &Server, path: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
    let mut r = agent()
        .post(&format!("http://{}{}", s.proxy, path))
        .set("content-type", "application/json");
    for (k, v) in headers {
        r = r.set(k, v);
    }
    let resp = match r.send_string(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {path}: {e}"),
    };
    let status = resp.status();
    let headers = resp
        .headers_names()
        .into_iter()
        .filter_map(|n| resp.header(&n).map(|v| (n.clone(), v.to_string())))
        .collect();
    let body = resp.into_string().unwrap_or_default();
    Answer {
        status,
        headers,
        body,
    }
}

pub fn get(s: &Server, path: &str, token: Option<&str>) -> (u16, String) {
    let mut r = agent().get(&format!("http://{}{}", s.proxy, path));
    if let Some(t) = token {
        r = r.set("authorization", &format!("Bearer {t}"));
    }
    match r.call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

/// Sends a streamed completion `body` on a raw connection (so the test can drop it,
/// or read it to its end) and returns it once the first `chunks` SSE chunks have
/// arrived, with everything read so far.
pub fn open_stream(s: &Server, body: &str, chunks: usize) -> (TcpStream, Vec<u8>) {
    let mut c = TcpStream::connect(&s.proxy).expect("connect to the proxy");
    c.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(6).filter(|w| w == b"data: ").count() < chunks {
        let n = c.read(&mut buf).expect("read the stream");
        assert!(n > 0, "closed before {chunks} chunks");
        got.extend_from_slice(&buf[..n]);
    }
    (c, got)
}

/// The `data:` payloads of an SSE body.
pub fn events(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(String::from)
        .collect()
}

/// Waits (generously) until `f` holds.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The router's tracked in-flight requests (all workers).
pub fn router_active(s: &Server) -> f64 {
    s.metric("kvroute_active_requests ")
}
