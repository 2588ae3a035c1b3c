//! The proxy's drain at shutdown (`[proxy] drain_ms`), end to end through the real
//! binary: at SIGTERM a stream in flight runs to its end while new connections are
//! refused and `/readyz` says `draining`, and the process then exits by itself; a
//! second signal, or the drain's bound, stops it with a request still running.

mod common;

use common::proxy::{events, open_stream, register, FakeWorker};
use common::Server;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn python_ok() -> bool {
    common::python_has("json", "python3")
}

/// A streamed completion of `tokens` tokens, open once its first chunk arrived.
fn start_stream(s: &Server, tokens: u32) -> (TcpStream, Vec<u8>) {
    let body = format!(r#"{{"model":"m","prompt":[1,2,3],"stream":true,"max_tokens":{tokens}}}"#);
    open_stream(s, &body, 1)
}

/// `GET /health` on an open keep-alive connection: the whole answer (it has a
/// content-length), lower-cased.
fn health_on(c: &mut TcpStream) -> String {
    c.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains('}') {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the answer");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).to_ascii_lowercase()
}

/// Whether a new connection to the proxy gets an HTTP answer to `GET /health`.
fn proxy_answers(s: &Server) -> bool {
    let Ok(mut c) = TcpStream::connect(&s.proxy) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    if c.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 64];
    matches!(c.read(&mut buf), Ok(n) if n > 0)
}

#[test]
fn a_stream_in_flight_at_sigterm_runs_to_its_end_and_then_the_router_exits() {
    if !python_ok() {
        return;
    }
    let mut s = Server::start(1, &["--proxy-drain-ms", "20000"]);
    let w = FakeWorker::start("w1", &["--delay-ms", "40"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    assert!(proxy_answers(&s));
    let mut kept = TcpStream::connect(&s.proxy).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(health_on(&mut kept).starts_with("http/1.1 200"));
    let (mut c, mut got) = start_stream(&s, 40);
    s.sigterm();
    // Draining: not ready, and no new proxy connection is served.
    common::proxy::wait_until("readyz says draining", || {
        let (code, body) = s.get("/readyz");
        code == 503 && body.contains("draining")
    });
    assert!(!proxy_answers(&s));
    // A kept-alive connection is answered once more, 503 `draining`, and closed.
    let h = health_on(&mut kept);
    assert!(
        h.starts_with("http/1.1 503") && h.contains("draining"),
        "{h}"
    );
    assert!(h.contains("connection: close"), "{h}");
    assert_eq!(kept.read(&mut [0u8; 16]).unwrap(), 0);
    // The stream in flight still gets every token and its end.
    c.read_to_end(&mut got).unwrap();
    let text = String::from_utf8_lossy(&got);
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    let ev = events(body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{text}");
    assert_eq!(ev.len(), 41, "{text}");
    // Then the router stops by itself, long before the drain's bound.
    let st = s
        .exited_within(Duration::from_secs(10))
        .expect("router still running");
    assert!(st.success(), "{st:?}");
}

#[test]
fn a_second_signal_or_the_drain_bound_stops_it_with_a_request_still_running() {
    if !python_ok() {
        return;
    }
    for (drain_ms, second_signal) in [("60000", true), ("300", false)] {
        let mut s = Server::start(1, &["--proxy-drain-ms", drain_ms]);
        let w = FakeWorker::start("w1", &["--delay-ms", "1000"]);
        register(&s, "w1", "m", "aggregated", &w.url());
        let (_c, _) = start_stream(&s, 600);
        s.sigterm();
        common::proxy::wait_until("draining", || s.get("/readyz").0 == 503);
        if second_signal {
            s.sigterm();
        }
        let st = s.exited_within(Duration::from_secs(10));
        assert!(
            st.is_some_and(|st| st.success()),
            "drain {drain_ms}: {st:?}"
        );
    }
}
