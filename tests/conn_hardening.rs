//! Connection hardening (slots and deadlines) against the real binary: slow, idle
//! and silent peers cannot take every slot of a listener, pre-handshake connections are
//! bounded in number and size, and HTTP / API sessions have deadlines.
//!
//! Every test uses small limits (`--max-connections 20`, timeouts of about a second)
//! and at most ~60 attacking sockets, and bounds every wait.

mod common;
use common::{hashes, req, spec, Server};
use kvroute::client::{EventPublisher, RequestClient};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether the peer closes `s` within `within` (EOF or reset), reading and dropping
/// whatever it sends first.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Sockets that send one byte every `every` until dropped (a slowloris).
struct Trickle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Trickle {
    fn start(socks: Vec<TcpStream>, first: &'static [u8], every: Duration) -> Trickle {
        let socks = Arc::new(Mutex::new(socks));
        for s in socks.lock().unwrap().iter_mut() {
            let _ = s.write_all(first);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now() + every;
            while !st.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    for s in socks.lock().unwrap().iter_mut() {
                        let _ = s.write_all(b"x");
                    }
                    next += every;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Trickle {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn connect_many(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect()
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build()
}

/// GET with an optional bearer token; the status, or the transport error.
fn get(s: &Server, path: &str, token: Option<&str>) -> Result<u16, String> {
    let mut r = agent().get(&s.url(path));
    if let Some(t) = token {
        r = r.set("Authorization", &format!("Bearer {t}"));
    }
    match r.call() {
        Ok(r) => Ok(r.status()),
        Err(ureq::Error::Status(code, _)) => Ok(code),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn slowloris_http_does_not_block_healthz_or_metrics() {
    for token in [None, Some("s3cret")] {
        let mut flags = vec!["--max-connections", "20"];
        if let Some(t) = token {
            flags.extend(["--auth-token", t]);
        }
        let s = Server::start(1, &flags);
        // 60 connections on a listener with 20 slots, each sending a request head at
        // one byte per second.
        let _attack = Trickle::start(
            connect_many(&s.http, 60),
            b"GET /healthz HTTP/1.1\r\nX-Slow: ",
            Duration::from_secs(1),
        );
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..3 {
            assert_eq!(get(&s, "/healthz", None), Ok(200), "token {token:?}");
            assert_eq!(get(&s, "/metrics", token), Ok(200), "token {token:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
        if token.is_none() {
            assert!(s.metric("kvroute_protocol_errors_total{kind=\"preauth_displaced\"}") >= 1.0);
        }
    }
}

#[test]
fn http_head_must_arrive_within_the_header_timeout() {
    let s = Server::start(1, &["--http-header-timeout-ms", "1000"]);
    let mut socks = connect_many(&s.http, 2);
    let _attack = Trickle::start(
        socks.drain(1..).collect(),
        b"GET /healthz HTTP/1.1\r\nX-Slow: ",
        Duration::from_millis(200),
    );
    // One silent connection, one trickling: both closed at about 1 s, not later.
    let t0 = Instant::now();
    assert!(closed_within(&mut socks[0], Duration::from_secs(5)));
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "not before the deadline"
    );
    s.wait_until("timeouts counted", |s| {
        s.metric("kvroute_protocol_errors_total{kind=\"http_header_timeout\"}") >= 2.0
    });
    assert_eq!(get(&s, "/healthz", None), Ok(200));
}

#[test]
fn idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let s = Server::start(1, &["--http-idle-timeout-ms", "1500"]);
    let mut c = TcpStream::connect(&s.http).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 1024];
    let n = c.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // Still open well before the timeout: a second request on it is answered.
    std::thread::sleep(Duration::from_millis(900));
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let n = c.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // The timeout counts from this second response, not the first: the timer set
    // after the first (due ~600 ms from here) is not taken for the deadline.
    let t0 = Instant::now();
    assert!(closed_within(&mut c, Duration::from_secs(5)));
    assert!(
        t0.elapsed() >= Duration::from_millis(1200),
        "{:?}",
        t0.elapsed()
    );
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"http_idle_timeout\"}") >= 1.0);
}

#[test]
fn slow_but_steady_body_is_not_cut_and_a_stalled_one_is() {
    // The stall rule alone: this body (~17 B/s) is far below the default body rate,
    // whose own test is tests/slow_bodies.rs.
    let s = Server::start(
        1,
        &[
            "--http-body-timeout-ms",
            "1000",
            "--http-body-min-rate",
            "0",
        ],
    );
    let body = serde_json::json!({"id": "slow", "capacity_blocks": 100}).to_string();
    let head = format!(
        "POST /v1/workers HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // 2.4 s in total, a chunk every 300 ms: longer than the timeout, never stalled.
    let mut c = TcpStream::connect(&s.http).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    for chunk in body.as_bytes().chunks(body.len().div_ceil(8)) {
        std::thread::sleep(Duration::from_millis(300));
        c.write_all(chunk).unwrap();
    }
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 1024];
    let n = c.read(&mut buf).unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 201"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Half a body, then nothing: the connection is closed about a second later.
    let mut c = TcpStream::connect(&s.http).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&body.as_bytes()[..body.len() / 2]).unwrap();
    assert!(closed_within(&mut c, Duration::from_secs(5)));
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"http_body_timeout\"}") >= 1.0);
    assert_eq!(get(&s, "/healthz", None), Ok(200));
}

#[test]
fn idle_api_sessions_do_not_block_a_new_client() {
    let s = Server::start(1, &["--max-connections", "20"]);
    s.register(serde_json::to_value(spec("w")).unwrap());
    // 40 authenticated sessions that then say nothing.
    let idle: Vec<RequestClient> = (0..40)
        .filter_map(|_| RequestClient::connect(&s.api, "").ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut c = RequestClient::connect(&s.api, "").expect("a new client gets a slot");
    let d = c.route(&req("r1", &hashes(1, 4))).unwrap();
    assert_eq!(d.decode_worker, "w");
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"idle_displaced\"}") >= 1.0);
    drop(idle);
}

#[test]
fn api_session_idle_longer_than_the_timeout_is_closed_an_active_one_is_not() {
    let s = Server::start(1, &["--api-idle-timeout-ms", "1000"]);
    s.register(serde_json::to_value(spec("w")).unwrap());
    let mut idle = RequestClient::connect(&s.api, "").unwrap();
    let mut active = RequestClient::connect(&s.api, "").unwrap();
    // The active client sends a request every 400 ms for 2.4 s, pipelining two.
    for i in 0..6 {
        std::thread::sleep(Duration::from_millis(400));
        let a = active
            .send_route(&req(&format!("a{i}"), &hashes(i, 4)))
            .unwrap();
        let b = active
            .send_route(&req(&format!("b{i}"), &hashes(i, 4)))
            .unwrap();
        active.flush().unwrap();
        for want in [a, b] {
            match active.recv().unwrap() {
                kvroute::client::Answer::Decision(corr, _) => assert_eq!(corr, want),
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(idle.route(&req("late", &hashes(9, 4))).is_err());
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"api_idle_timeout\"}") >= 1.0);
}

#[test]
fn preauth_flood_does_not_lock_out_a_worker() {
    let s = Server::start(1, &["--max-connections", "20"]);
    // 40 connections that never send a Hello, and 20 that send a partial one.
    let mut silent = connect_many(&s.events, 40);
    let _partial = Trickle::start(
        connect_many(&s.events, 20),
        &[0x40, 0, 0, 0, 0x01],
        Duration::from_secs(1),
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut w = EventPublisher::connect(&s.events, spec("w"), "").expect("worker admitted");
    w.stored(kvroute::types::Tier::Device, None, &hashes(1, 8));
    w.flush().unwrap();
    s.wait_until("index", |s| s.cached("w") == 8);
    // The oldest silent connections were the ones displaced.
    assert!(closed_within(&mut silent[0], Duration::from_secs(2)));
    // The API port is unaffected by the event port's flood, and has its own slots.
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    assert_eq!(
        c.route(&req("r", &hashes(1, 8))).unwrap().decode_worker,
        "w"
    );
}

#[test]
fn preauth_connections_are_capped_and_timed_out_and_big_hellos_refused() {
    let s = Server::start(
        1,
        &[
            "--max-preauth-connections",
            "8",
            "--hello-timeout-ms",
            "1500",
        ],
    );
    let mut silent = connect_many(&s.events, 30);
    std::thread::sleep(Duration::from_millis(300));
    // Only the 8 newest are still open; the 22 oldest were dropped at once.
    for (i, c) in silent.iter_mut().enumerate().take(22) {
        assert!(closed_within(c, Duration::from_secs(1)), "socket {i}");
    }
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"preauth_displaced\"}") >= 22.0);
    // The rest are closed by the Hello timeout.
    for c in silent.iter_mut().skip(22) {
        assert!(closed_within(c, Duration::from_secs(5)));
    }
    // A Hello length prefix above max_hello_bytes (16 KiB) is refused before its body,
    // on both binary ports.
    for addr in [&s.events, &s.api] {
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.write_all(&(100_000u32).to_le_bytes()).unwrap();
        raw.write_all(&[0x01]).unwrap();
        assert!(closed_within(&mut raw, Duration::from_secs(1)), "{addr}");
    }
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"oversized_frame\"}") >= 2.0);
    // A real worker still gets in.
    EventPublisher::connect(&s.events, spec("w"), "").unwrap();
}

#[test]
fn a_silent_event_connection_makes_room_but_a_live_one_does_not() {
    let s = Server::start(
        1,
        &["--max-connections", "2", "--heartbeat-timeout-ms", "2000"],
    );
    let mut live = EventPublisher::connect(&s.events, spec("live"), "").unwrap();
    let _silent = EventPublisher::connect(&s.events, spec("silent"), "").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let beat = std::thread::spawn(move || {
        while !st.load(Ordering::Relaxed) {
            live.heartbeat(0, 0, 100);
            let _ = live.flush();
            std::thread::sleep(Duration::from_millis(100));
        }
        live
    });
    // Both slots are busy: the silent worker has been silent for less than the
    // heartbeat timeout, so a third connection is refused.
    std::thread::sleep(Duration::from_millis(200));
    assert!(EventPublisher::connect(&s.events, spec("third"), "").is_err());
    // Once silent past the heartbeat timeout it is idle, and gives up its slot.
    std::thread::sleep(Duration::from_millis(2200));
    EventPublisher::connect(&s.events, spec("fourth"), "").expect("silent worker displaced");
    stop.store(true, Ordering::Relaxed);
    let _live = beat.join().unwrap();
    let live_ok = s
        .workers()
        .iter()
        .any(|w| w["id"] == "live" && w["state"] == "live");
    assert!(live_ok, "{:?}", s.workers());
}

#[test]
fn new_settings_layer_defaults_file_env_and_flags() {
    let dir = std::env::temp_dir().join(format!("kvroute-conns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "api_idle_timeout_ms = 7777\nhello_timeout_ms = 1\n[limits]\nmax_hello_bytes = 2048\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["print-config", "--config", file.to_str().unwrap()])
        .args(["--hello-timeout-ms", "1234"])
        .env("KVROUTE_HTTP_IDLE_TIMEOUT_MS", "4321")
        .env("KVROUTE_MAX_PREAUTH_CONNECTIONS", "9")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "hello_timeout_ms = 1234",        // flag over file
        "api_idle_timeout_ms = 7777",     // file
        "http_idle_timeout_ms = 4321",    // env
        "http_header_timeout_ms = 10000", // default
        "http_body_timeout_ms = 30000",
        "max_preauth_connections = 9",
        "max_hello_bytes = 2048",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
}

/// Pipelines `n` `GET /metrics` on one connection, waits `stall`, then reads `chunk`
/// bytes every `every`; the bytes received before the connection ended (or all
/// `total` arrived).
fn pipelined_metrics(
    s: &Server,
    n: usize,
    total: usize,
    stall: Duration,
    chunk: usize,
    every: Duration,
) -> usize {
    let mut c = TcpStream::connect(&s.http).unwrap();
    let reqs = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".repeat(n);
    c.write_all(&reqs).unwrap();
    std::thread::sleep(stall);
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut got, mut buf) = (0usize, vec![0u8; chunk]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < total && Instant::now() < deadline {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => got += k,
        }
        std::thread::sleep(every);
    }
    got
}

#[test]
fn responses_to_a_slow_reader_are_sent_in_full_to_a_stalled_one_cut() {
    let s = Server::start(1, &["--http-body-timeout-ms", "700"]);
    // Enough pipelined /metrics answers (~8 MB) to fill the loopback socket buffers,
    // so the router's writes wait for the reader.
    let (_, one) = s.get("/metrics");
    let n = ((8 << 20) / (one.len() + 200)).min(4000);
    let total = n * (one.len() + 100);
    // Steady: 64 KiB every 10 ms, seconds in all: never cut.
    let got = pipelined_metrics(
        &s,
        n,
        total,
        Duration::ZERO,
        64 << 10,
        Duration::from_millis(10),
    );
    assert!(
        got >= total,
        "slow but steady reader cut after {got} of ~{total} bytes"
    );
    // Stalled: nothing read for 2.5 s while the router's writes wait: cut.
    let got = pipelined_metrics(
        &s,
        n,
        total,
        Duration::from_millis(2500),
        64 << 10,
        Duration::ZERO,
    );
    assert!(got < total, "a stalled reader got all {got} bytes");
    assert!(s.metric("kvroute_protocol_errors_total{kind=\"http_write_timeout\"}") >= 1.0);
}

#[test]
fn a_fleet_reconnecting_at_once_is_not_displaced_by_the_preauth_cap() {
    // 200 workers whose Hellos are all in the backlog at once, against a cap of 16
    // pre-handshake connections: each accepted connection reads its Hello before the
    // next accept, so none is displaced for the cap.
    let s = Server::start(1, &["--max-preauth-connections", "16"]);
    let mut socks = Vec::new();
    for i in 0..200 {
        let mut out = bytes::BytesMut::new();
        kvroute::codec::EventMsg::Hello(kvroute::codec::EventHello {
            auth_token: String::new(),
            spec: spec(&format!("w{i}")),
        })
        .encode(&mut out);
        let mut c = TcpStream::connect(&s.events).unwrap();
        c.write_all(&out).unwrap();
        socks.push(c);
    }
    for (i, c) in socks.iter_mut().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = [0u8; 5];
        assert!(c.read_exact(&mut head).is_ok(), "worker {i} got no answer");
        assert_eq!(head[4], 0x41, "worker {i}: HelloAck");
    }
    assert_eq!(
        s.metric("kvroute_protocol_errors_total{kind=\"preauth_displaced\"}"),
        0.0
    );
}
