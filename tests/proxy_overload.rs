//! The proxy under overload answers, it does not drop: the real
//! `kvroute serve` binary, fake OpenAI workers (tests/py/fake_openai_worker.py), and
//! small limits (`--proxy-max-concurrent 1`, `--max-connections 2` on one core) so no
//! high rate is needed.
//!
//! - `max_concurrent` reached: 429 in OpenAI's shape with `retry-after`;
//! - a worker's 429 is re-routed to another worker (not held against its breaker), and
//!   when every worker is at its limit the client gets 429 + `retry-after`, never 502;
//! - a connection the listener has no slot for gets a 429, not a reset, and a
//!   keep-alive connection in use is not closed to make room for it.

mod common;

use common::proxy::{post, register, wait_until, FakeWorker};
use common::Server;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn python_ok() -> bool {
    common::python_has("json", "python3")
}

const BODY: &str = r#"{"model":"m","prompt":[1,2,3],"max_tokens":2}"#;

fn assert_overloaded(status: u16, retry_after: Option<&str>, body: &str, code: &str) {
    assert_eq!(status, 429, "{body}");
    let ra: u32 = retry_after
        .unwrap_or_else(|| panic!("no retry-after: {body}"))
        .parse()
        .expect("retry-after in seconds");
    assert!(ra >= 1, "{ra}");
    let v: serde_json::Value = serde_json::from_str(body).expect("OpenAI error JSON");
    assert_eq!(v["error"]["type"], "rate_limit_exceeded", "{body}");
    assert_eq!(v["error"]["code"], code, "{body}");
}

/// One HTTP/1.1 response read off a raw connection: status, lower-cased headers, body
/// (content-length or chunked).
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Raw {
    fn header(&self, n: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    }
}

fn read_response(r: &mut BufReader<TcpStream>) -> std::io::Result<Raw> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let find = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if let Some(n) = find("content-length") {
        let n: usize = n.parse().expect("content-length");
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).expect("chunk size");
            let mut c = vec![0u8; n + 2];
            r.read_exact(&mut c)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&c[..n]);
        }
    }
    Ok(Raw {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A raw keep-alive client connection to the proxy.
struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    fn connect(s: &Server) -> Client {
        let w = TcpStream::connect(&s.proxy).expect("connect proxy");
        w.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        Client { w, r }
    }

    fn send(&mut self, body: &str) -> std::io::Result<()> {
        write!(
            self.w,
            "POST /v1/completions HTTP/1.1\r\nhost: kvroute\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        self.w.flush()
    }

    fn request(&mut self, body: &str) -> std::io::Result<Raw> {
        self.send(body)?;
        read_response(&mut self.r)
    }
}

#[test]
fn max_concurrent_reached_is_a_429_with_retry_after_then_served_again() {
    if !python_ok() {
        return;
    }
    let s = Server::start(2, &["--proxy-max-concurrent", "1"]);
    // A slow stream (40 chunks, 200 ms apart) holds the one admission.
    let w = FakeWorker::start("w1", &["--delay-ms", "200"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let mut held = Client::connect(&s);
    held.send(r#"{"model":"m","prompt":[1,2,3],"max_tokens":40,"stream":true}"#)
        .expect("send held request");
    wait_until("the held request admitted", || {
        s.metric("kvroute_proxy_active ") == 1.0
    });
    let a = post(&s, "/v1/completions", BODY, &[]);
    assert_overloaded(
        a.status,
        a.header("retry-after"),
        &a.body,
        "too_many_requests",
    );
    assert_eq!(
        s.metric("kvroute_proxy_refused_total{kind=\"too_many\"}"),
        1.0
    );
    // The held stream ends whole; its admission is released and the next is served.
    let h = read_response(&mut held.r).expect("held stream");
    assert_eq!(h.status, 200);
    assert!(h.body.contains("[DONE]"), "{}", h.body);
    wait_until("admission released", || {
        s.metric("kvroute_proxy_active ") == 0.0
    });
    let b = post(&s, "/v1/completions", BODY, &[]);
    assert_eq!(b.status, 200, "{b:?}");
}

#[test]
fn a_workers_429_is_retried_elsewhere_and_all_busy_is_a_429_never_a_502() {
    if !python_ok() {
        return;
    }
    // The admission queue off: every worker refusing is then answered at once (with
    // the queue on, the request waits instead: `tests/proxy_policies.rs`).
    let s = Server::start(
        2,
        &[
            "--proxy-retries",
            "3",
            "--proxy-retry-backoff-ms",
            "1",
            "--admission-queue",
            "false",
        ],
    );
    let w1 = FakeWorker::start("w1", &["--mode", "busy"]);
    let w2 = FakeWorker::start("w2", &[]);
    register(&s, "w1", "m", "aggregated", &w1.url());
    register(&s, "w2", "m", "aggregated", &w2.url());
    // w1 at its limit: every request ends on w2, some after a re-route from w1.
    for i in 0..8 {
        let a = post(&s, "/v1/completions", BODY, &[]);
        assert_eq!(a.status, 200, "request {i}: {a:?}");
        assert_eq!(a.header("x-kvroute-worker"), Some("w2"), "{a:?}");
    }
    let busy = s.metric("kvroute_proxy_upstream_errors_total{kind=\"busy\"}");
    assert!(busy >= 1.0, "w1 was never tried: {busy}");
    assert_eq!(
        s.metric("kvroute_proxy_breaker_open{worker=\"w1\"}"),
        0.0,
        "a 429 is not a health failure"
    );
    // Both at their limit: 429 with the worker's retry-after, not 502.
    w2.set_mode("busy");
    for _ in 0..4 {
        let a = post(&s, "/v1/completions", BODY, &[]);
        assert_overloaded(a.status, a.header("retry-after"), &a.body, "workers_busy");
        assert_eq!(a.header("retry-after"), Some("3"));
    }
    assert_eq!(
        s.metric("kvroute_proxy_refused_total{kind=\"workers_busy\"}"),
        4.0
    );
    // Neither breaker opened: both serve again as soon as they can.
    w1.set_mode("ok");
    w2.set_mode("ok");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..16 {
        let a = post(&s, "/v1/completions", BODY, &[]);
        assert_eq!(a.status, 200, "{a:?}");
        seen.insert(a.header("x-kvroute-worker").unwrap_or("").to_string());
    }
    assert!(seen.contains("w1"), "w1 never served again: {seen:?}");
}

#[test]
fn no_slot_is_a_429_and_keep_alive_connections_in_use_stay_open() {
    if !python_ok() {
        return;
    }
    // One core, two proxy connection slots.
    let s = Server::start(1, &["--max-connections", "2"]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let mut a = Client::connect(&s);
    let mut b = Client::connect(&s);
    let t0 = Instant::now();
    assert_eq!(a.request(BODY).expect("a").status, 200);
    assert_eq!(b.request(BODY).expect("b").status, 200);
    // Both slots hold keep-alive connections that just answered (in use): a third
    // connection is answered 429 + connection: close instead of closing one of them.
    let mut c = Client::connect(&s);
    let r = c
        .request(BODY)
        .expect("the refused connection gets an answer");
    if r.status == 429 {
        assert_overloaded(
            r.status,
            r.header("retry-after"),
            &r.body,
            "too_many_connections",
        );
        assert_eq!(r.header("connection"), Some("close"));
        assert!(s.metric("kvroute_protocol_errors_total{kind=\"connection_limit\"}") >= 1.0);
        // Neither keep-alive connection was closed to make room.
        for (name, cl) in [("a", &mut a), ("b", &mut b)] {
            let r = cl.request(BODY).unwrap_or_else(|e| {
                panic!("keep-alive connection {name} was closed while in use: {e}")
            });
            assert_eq!(r.status, 200, "{name}: {}", r.body);
        }
    } else {
        // Only when this machine took longer than the in-use window
        // (`proxy::server::KEEPALIVE_IN_USE_MS`, 2 s) between the requests may an idle
        // connection have been displaced for the new one.
        assert!(
            t0.elapsed() >= Duration::from_millis(2000),
            "a keep-alive connection in use was displaced: {}",
            r.status
        );
    }
}
