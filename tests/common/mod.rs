//! Test harness: starts the real `kvroute serve` binary on free loopback ports and
//! talks to it over HTTP (ureq) and the binary protocols (kvroute::client).
#![allow(dead_code)]

pub mod cluster;
pub mod fleet;
pub mod ident;
pub mod proxy;
pub mod raw;
pub mod run;
pub mod sim;
pub mod tokenizer;
pub mod ui;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub events: String,
    pub api: String,
    pub http: String,
    /// The OpenAI proxy's address (`--proxy-addr`; a free port unless `extra` sets it).
    pub proxy: String,
    /// The router's stderr lines, when started with [`Server::start_logged`].
    log: Option<Arc<Mutex<Vec<String>>>>,
}

/// A free loopback port for a server the test starts, below Linux's ephemeral range
/// (32768+). A port 0 pick is free only until someone else takes it: the kernel hands
/// the same ephemeral numbers to every outgoing connection, and with many tests
/// connecting in parallel one of them took a just-picked port before the router bound
/// it ("address in use", seen in CI). Below the range, only another explicit pick can
/// collide, and the picks of one process never repeat (a process-wide sequence, salted
/// by pid and time so that parallel processes start apart).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ (u64::from(std::process::id()) << 16);
    for _ in 0..4000 {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        // 7919 is prime, so the sequence visits all 12,000 ports before repeating.
        let port = 20_000 + ((salt % 12_000 + i * 7919) % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    /// Starts `kvroute serve --cores N` plus extra flags; waits for /healthz.
    ///
    /// The ports are picked free but released before kvroute binds them, so another
    /// process can take one in between; kvroute then exits at once and the start is
    /// retried on fresh ports.
    pub fn start(cores: usize, extra: &[&str]) -> Server {
        Self::start_with(cores, extra, false)
    }

    /// [`Server::start`], with the router's stderr captured line by line (and echoed
    /// with a `[kvroute]` prefix) so a test can check what it logged ([`Server::log`]).
    pub fn start_logged(cores: usize, extra: &[&str]) -> Server {
        Self::start_with(cores, extra, true)
    }

    fn start_with(cores: usize, extra: &[&str], capture: bool) -> Server {
        for _ in 0..4 {
            if let Some(s) = Self::try_start(cores, extra, capture) {
                return s;
            }
        }
        panic!("kvroute did not start on free ports four times");
    }

    /// One attempt of [`Server::start`]; `None` if kvroute exited (a port was taken).
    fn try_start(cores: usize, extra: &[&str], capture: bool) -> Option<Server> {
        let (e, a, h) = (free_port(), free_port(), free_port());
        let events = format!("127.0.0.1:{e}");
        let api = format!("127.0.0.1:{a}");
        let http = format!("127.0.0.1:{h}");
        // Every test server gets its own proxy port (the default 8000 would collide).
        let given = extra.iter().position(|a| *a == "--proxy-addr");
        let proxy = match given {
            Some(i) => extra.get(i + 1).map(|a| a.to_string()).unwrap_or_default(),
            None => format!("127.0.0.1:{}", free_port()),
        };
        let proxy_flag: Vec<String> = match given {
            Some(_) => Vec::new(),
            None => vec!["--proxy-addr".into(), proxy.clone()],
        };
        let child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args([
                "serve",
                "--cores",
                &cores.to_string(),
                "--events-addr",
                &events,
                "--api-addr",
                &api,
                "--http-addr",
                &http,
            ])
            .args(&proxy_flag)
            .args(extra)
            // A short drain, so a test that ends with a stream in flight stops fast;
            // tests of the drain give `--proxy-drain-ms`, which wins over the env.
            .env("KVROUTE_PROXY_DRAIN_MS", "1000")
            // Replicas (`--cluster`) need a tier secret: every test replica gets the
            // same one (a `--cluster-secret` flag wins; none for a replica started
            // `--cluster-unauthenticated`); ignored without `--cluster`.
            .envs(
                (!extra.contains(&"--cluster-unauthenticated"))
                    .then_some(("KVROUTE_CLUSTER_SECRET", cluster::TEST_SECRET)),
            )
            .stdout(Stdio::null())
            .stderr(if capture {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .expect("spawn kvroute");
        let mut child = child;
        let log = child.stderr.take().map(|err| {
            let log = Arc::new(Mutex::new(Vec::new()));
            let l = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    eprintln!("[kvroute] {line}");
                    l.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            });
            log
        });
        let mut s = Server {
            child,
            events,
            api,
            http,
            proxy,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if s.child.try_wait().ok().flatten().is_some() {
                return None;
            }
            if ureq::get(&s.url("/healthz")).call().is_ok() {
                break;
            }
            assert!(Instant::now() < deadline, "kvroute did not become healthy");
            std::thread::sleep(Duration::from_millis(20));
        }
        // A /healthz answer from someone else's port while ours failed to bind: our
        // child exits within moments.
        std::thread::sleep(Duration::from_millis(50));
        if s.child.try_wait().ok().flatten().is_some() {
            return None;
        }
        Some(s)
    }

    /// Hands over the child process (the harness no longer stops it).
    pub fn into_child(self) -> Child {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so the child is moved out exactly once.
        unsafe { std::ptr::read(&me.child) }
    }

    /// Sends SIGTERM and returns at once (the drain tests watch what follows).
    pub fn sigterm(&self) {
        kvroute::process::sigterm(&self.child);
    }

    /// How the process ended, if it did within `within`.
    pub fn exited_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.http, path)
    }

    /// The stderr lines so far ([`Server::start_logged`]; empty otherwise).
    pub fn log(&self) -> Vec<String> {
        self.log
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default()
    }

    /// Whether the router process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// POST JSON; returns (status, body).
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        match ureq::post(&self.url(path)).send_json(body) {
            Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
            Err(e) => panic!("POST {path}: {e}"),
        }
    }

    pub fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        match ureq::post(&self.url(path))
            .set("content-type", "application/json")
            .send_string(body)
        {
            Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
            Err(e) => panic!("POST {path}: {e}"),
        }
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        match ureq::get(&self.url(path)).call() {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    pub fn delete(&self, path: &str) -> (u16, Value) {
        match ureq::delete(&self.url(path)).call() {
            Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
            Err(e) => panic!("DELETE {path}: {e}"),
        }
    }

    pub fn workers(&self) -> Vec<Value> {
        let (_, body) = self.get("/v1/workers");
        serde_json::from_str::<Vec<Value>>(&body).unwrap()
    }

    /// Value of a metric line (first sample whose name+labels start with `prefix`).
    pub fn metric(&self, prefix: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Registers a worker over HTTP.
    pub fn register(&self, spec: Value) {
        let (code, body) = self.post("/v1/workers", spec);
        assert!(code == 200 || code == 201, "register: {code} {body}");
    }

    /// Stores device blocks for a worker over HTTP.
    pub fn store(&self, worker: &str, tier: &str, hashes: &[u64]) {
        let (code, body) = self.post(
            &format!("/v1/workers/{worker}/events"),
            serde_json::json!({"events": [{"type": "stored", "tier": tier, "parent": null, "block_hashes": hashes}]}),
        );
        assert_eq!(code, 200, "events: {body}");
    }

    /// Polls until `f` holds (events are applied asynchronously by the shards).
    pub fn wait_until(&self, what: &str, mut f: impl FnMut(&Server) -> bool) {
        // Generous: CI runs many test binaries at once on two cores.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Cached blocks of a worker as reported by GET /v1/workers.
    pub fn cached(&self, worker: &str) -> u64 {
        self.workers()
            .iter()
            .find(|w| w["id"] == worker)
            .and_then(|w| w["cached_blocks"].as_u64())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM → graceful shutdown; then make sure it is gone.
        kvroute::process::terminate(&mut self.child, Duration::from_secs(10));
    }
}

/// Whether `python3` can import `modules` (e.g. `"zmq, msgspec"`). Tests that need
/// them skip without, except under CI, where a missing install is a failure: `.ci/run`
/// installs them (`pip install {pip}`).
pub fn python_has(modules: &str, pip: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false"),
            "CI is set but python3 cannot import {modules}: pip install {pip}"
        );
        eprintln!("SKIPPED: python3 cannot import {modules} (pip install {pip})");
    }
    ok
}

/// Sequence hashes 0..n mixed (stand-ins for real prefix hashes).
pub fn hashes(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| kvroute::hash::mix_external_id(seed * 1_000_000 + i))
        .collect()
}

/// A worker spec with a capacity small enough for tests.
pub fn spec(id: &str) -> kvroute::types::WorkerSpec {
    let mut s = kvroute::types::WorkerSpec::new(id);
    s.capacity_blocks = 10_000;
    s
}

/// A route request by precomputed block hashes.
pub fn req(id: &str, h: &[u64]) -> kvroute::engine::RouteRequest {
    kvroute::engine::RouteRequest {
        request_id: id.into(),
        block_hashes: Some(h.to_vec()),
        ..Default::default()
    }
}

/// Runs the Python client `tests/py/{script}` with `args` and reads the JSON object it
/// prints; a failed run fails the test with the client's stdout and stderr.
pub fn py_client(script: &str, args: &[&str]) -> Value {
    let path = format!("{}/tests/py/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("python3 {path}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{script} printed no JSON object ({e}):\n{stdout}"))
}
