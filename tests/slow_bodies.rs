//! Slow request bodies cannot lock an HTTP listener, on the JSON API port or the proxy
//! port, against the real binary: a request body must keep `http_body_min_rate` from
//! its head, and a connection waiting for the rest of a body is displaced for a new
//! connection as a slow head is.
//!
//! Sockets are bounded (150 attacking connections per port), and so is every wait.

mod common;
use common::proxy::{self, FakeWorker};
use common::Server;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` connections to `addr`, each sending `head` (which announces a 100,000-byte
/// body) and then one body byte every `every`. A connection the router closes (or
/// answers) is opened again at the next tick, so the attack never lets up. Stopped
/// on drop.
struct BodyTrickle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    reopened: Arc<AtomicUsize>,
}

/// A request head announcing a body of 100,000 bytes that will never come in time.
fn slow_head(path: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{"
    )
}

fn open(addr: &str, head: &str) -> Option<TcpStream> {
    let sa = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(1)).ok()?;
    s.write_all(head.as_bytes()).ok()?;
    s.set_nonblocking(true).ok()?;
    Some(s)
}

/// Whether the router closed `s` or answered on it (an answer means it is closing).
fn done(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    match s.read(&mut buf) {
        // EOF, or an answer (408, 429): the router is closing it.
        Ok(0) | Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

impl BodyTrickle {
    fn start(addr: &str, head: String, n: usize, every: Duration) -> BodyTrickle {
        let stop = Arc::new(AtomicBool::new(false));
        let reopened = Arc::new(AtomicUsize::new(0));
        let (st, re, addr) = (stop.clone(), reopened.clone(), addr.to_string());
        let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| open(&addr, &head)).collect();
        let thread = std::thread::spawn(move || {
            let mut next_byte = Instant::now() + every;
            while !st.load(Ordering::Relaxed) {
                let byte = Instant::now() >= next_byte;
                if byte {
                    next_byte += every;
                }
                for slot in socks.iter_mut() {
                    let alive = match slot {
                        Some(s) => !done(s) && (!byte || s.write_all(b" ").is_ok()),
                        None => false,
                    };
                    if !alive {
                        *slot = open(&addr, &head);
                        re.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        BodyTrickle {
            stop,
            thread: Some(thread),
            reopened,
        }
    }
}

impl Drop for BodyTrickle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fresh connection per call (no pooled connection to find displaced): the status,
/// or the transport error.
fn call(method: &str, url: &str, body: Option<&str>) -> Result<u16, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .max_idle_connections(0)
        .build();
    let r = agent
        .request(method, url)
        .set("content-type", "application/json");
    let r = match body {
        Some(b) => r.send_string(b),
        None => r.call(),
    };
    match r {
        Ok(r) => Ok(r.status()),
        Err(ureq::Error::Status(code, _)) => Ok(code),
        Err(e) => Err(e.to_string()),
    }
}

/// The issue's probe: `--max-connections 32` on 2 cores, 150 connections per port
/// trickling a body at a byte every 3 s (reopened whenever cut), on the JSON API and
/// the proxy at once. Every real call during the attack is answered: proxied
/// completions, the proxy's `/health`, `/healthz` and `/v1/workers`, back to back on
/// fresh connections (thousands of them), each racing the attack's reconnections for
/// a slot.
#[test]
fn trickled_bodies_do_not_lock_either_http_port() {
    let s = Server::start(2, &["--max-connections", "32"]);
    let w = FakeWorker::start("w1", &[]);
    proxy::register(&s, "w1", "m", "aggregated", &w.url());
    let every = Duration::from_secs(3);
    let api = BodyTrickle::start(&s.http, slow_head("/v1/workers"), 150, every);
    let px = BodyTrickle::start(&s.proxy, slow_head("/v1/completions"), 150, every);
    std::thread::sleep(Duration::from_millis(500));
    let completion = r#"{"model":"m","prompt":"hello there","max_tokens":2}"#;
    let mut failures = Vec::new();
    let mut answered = 0;
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        for (what, r) in [
            (
                "proxy completion",
                call(
                    "POST",
                    &format!("http://{}/v1/completions", s.proxy),
                    Some(completion),
                ),
            ),
            (
                "proxy /health",
                call("GET", &format!("http://{}/health", s.proxy), None),
            ),
            ("/healthz", call("GET", &s.url("/healthz"), None)),
            ("/v1/workers", call("GET", &s.url("/v1/workers"), None)),
        ] {
            match r {
                Ok(200) => answered += 1,
                other => failures.push(format!("{what}: {other:?}")),
            }
        }
    }
    let reopened = api.reopened.load(Ordering::Relaxed) + px.reopened.load(Ordering::Relaxed);
    drop((api, px));
    assert!(
        failures.is_empty(),
        "{answered} answered, {} failed: {failures:?}",
        failures.len()
    );
    assert!(answered >= 40, "{answered} calls answered");
    // The attack was cut again and again: displaced for new connections (and, when
    // none came, cut for its rate).
    let cut = |kind: &str| s.metric(&format!("kvroute_protocol_errors_total{{kind=\"{kind}\"}}"));
    let (slow, displaced) = (cut("http_body_too_slow"), cut("body_displaced"));
    eprintln!("{answered} answered; attack reopened {reopened}, cut for its rate {slow}, displaced {displaced}");
    assert!(displaced > 0.0, "no body reader displaced");
    assert!(
        w.received().len() >= 10,
        "the worker got {} completions",
        w.received().len()
    );
}

/// Sends `body` on `s` in pieces of `piece` bytes every `gap`, then reads the answer's
/// status line (`None`: closed without one).
fn upload(s: &mut TcpStream, path: &str, body: &[u8], piece: usize, gap: Duration) -> Option<u16> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(head.as_bytes()).ok()?;
    for c in body.chunks(piece) {
        std::thread::sleep(gap);
        if s.write_all(c).is_err() {
            break;
        }
    }
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// A registration body padded to `n` bytes with spaces (JSON whitespace).
fn padded_spec(id: &str, n: usize) -> Vec<u8> {
    let mut b = format!(r#"{{"id":"{id}","model":"m","capacity_blocks":100}}"#).into_bytes();
    b.resize(n.max(b.len()), b' ');
    b
}

/// A body slow but above the rate (4 KiB/s against 1 KiB/s) is taken; one below it (a
/// byte every 100 ms) is cut within about a second of its head and counted; with the
/// rate rule off (`--http-body-min-rate 0`) only the stall timeout applies.
#[test]
fn the_body_rate_cuts_trickles_and_keeps_slow_uploads() {
    let s = Server::start(1, &[]);
    let mut c = TcpStream::connect(&s.http).unwrap();
    let t0 = Instant::now();
    let slow_ok = upload(
        &mut c,
        "/v1/workers",
        &padded_spec("steady", 12 << 10),
        1024,
        Duration::from_millis(250),
    );
    assert_eq!(slow_ok, Some(201), "a 4 KiB/s upload was refused");
    assert!(t0.elapsed() >= Duration::from_secs(2));
    let mut c = TcpStream::connect(&s.http).unwrap();
    let t0 = Instant::now();
    let cut = upload(
        &mut c,
        "/v1/workers",
        &padded_spec("trickle", 40),
        1,
        Duration::from_millis(100),
    );
    assert_ne!(cut, Some(201), "a trickled body was taken");
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "cut after {:?}",
        t0.elapsed()
    );
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"http_body_too_slow\"}") >= 1.0);
    assert!(!s.workers().iter().any(|w| w["id"] == "trickle"));

    let off = Server::start(1, &["--http-body-min-rate", "0"]);
    let mut c = TcpStream::connect(&off.http).unwrap();
    let taken = upload(
        &mut c,
        "/v1/workers",
        &padded_spec("trickle", 12),
        1,
        Duration::from_millis(100),
    );
    assert_eq!(taken, Some(201), "with no rate rule the trickle is taken");
}

/// The body rules end with the body: a proxied request whose worker takes seconds
/// before its answer's head (a non-streamed completion of 5 slow tokens) waits for it,
/// far past the body rate's deadline, and is answered.
#[test]
fn waiting_for_the_worker_is_not_reading_a_body() {
    let s = Server::start(1, &[]);
    let slow = "prefill_base_us=1000,prefill_us_per_token=1,prefill_attention_us=0,decode_step_base_us=600000,decode_us_per_seq=0";
    let f = common::fleet::Fleet::start(&["--workers", "1", "--events", "none", "--timing", slow]);
    proxy::register(&s, "slow", "sim-model", "aggregated", &f.workers[0].url);
    let prompt = format!(
        r#"{{"model":"sim-model","prompt":"{}","max_tokens":5}}"#,
        common::fleet::words(0..400)
    );
    let t0 = Instant::now();
    let a = proxy::post(&s, "/v1/completions", &prompt, &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "the worker answered in {:?}",
        t0.elapsed()
    );
}
