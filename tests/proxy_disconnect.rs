//! A client that goes away while the proxy waits on a worker is noticed at once
//! (src/proxy/watch.rs): the upstream request is aborted (its connection closed, as
//! vLLM aborts a generation on disconnect), its load released, its admission slot
//! freed. Waiting for the response head, for a P/D prefill leg, and between two chunks
//! of a stream; with a pipelined request behind it too. Real binary, fake OpenAI
//! workers (tests/py/fake_openai_worker.py) whose `x_head_delay_ms` / `x_stall_after`
//! hold an answer far longer than any wait here, so only an abort ends them.

mod common;

use common::proxy::{open_stream, post, register, router_active, wait_until, FakeWorker};
use common::Server;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Ten minutes: far beyond every wait of these tests.
const FOREVER_MS: u64 = 600_000;

fn send(s: &Server, body: &str) -> TcpStream {
    let mut c = TcpStream::connect(&s.proxy).expect("connect to the proxy");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    c
}

fn active(s: &Server) -> f64 {
    s.metric("kvroute_proxy_active ")
}

fn disconnects(s: &Server, worker: &str) -> f64 {
    s.metric(&format!(
        "kvroute_proxy_requests_total{{model=\"m\",worker=\"{worker}\",outcome=\"client_disconnect\"}}"
    ))
}

#[test]
fn clients_gone_before_the_head_abort_the_worker_and_free_their_slots() {
    if !common::python_has("json", "python3") {
        return;
    }
    let s = Server::start(1, &["--proxy-max-concurrent", "2"]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let slow = json!({"model": "m", "prompt": [1, 2], "max_tokens": 3,
                      "x_head_delay_ms": FOREVER_MS})
    .to_string();
    let clients: Vec<TcpStream> = (0..2).map(|_| send(&s, &slow)).collect();
    wait_until("both at the worker", || w.stats()["active"] == 2);
    assert_eq!(active(&s), 2.0);
    let quick = json!({"model": "m", "prompt": [1], "max_tokens": 1}).to_string();
    assert_eq!(post(&s, "/v1/completions", &quick, &[]).status, 429);
    drop(clients);
    wait_until("the worker saw both aborts", || w.stats()["aborted"] == 2);
    wait_until("slots and load released", || {
        active(&s) == 0.0 && router_active(&s) == 0.0
    });
    assert_eq!(disconnects(&s, "w1"), 2.0);
    // A new client is admitted and served.
    let a = post(&s, "/v1/completions", &quick, &[]);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(w.stats()["completed"], 1);
}

#[test]
fn a_client_gone_between_two_chunks_aborts_the_stream() {
    if !common::python_has("json", "python3") {
        return;
    }
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    // One event, then the worker goes quiet.
    let body = json!({"model": "m", "prompt": [1, 2], "stream": true, "max_tokens": 50,
                      "x_stall_after": 1})
    .to_string();
    let (c, _) = open_stream(&s, &body, 1);
    wait_until("routed and active", || router_active(&s) == 1.0);
    drop(c);
    wait_until("the worker saw the abort", || w.stats()["aborted"] == 1);
    wait_until("slot and load released", || {
        active(&s) == 0.0 && router_active(&s) == 0.0
    });
    assert_eq!(disconnects(&s, "w1"), 1.0);
    assert_eq!(w.stats()["completed"], 0);
}

#[test]
fn a_client_gone_during_the_prefill_leg_aborts_it() {
    if !common::python_has("json", "python3") {
        return;
    }
    let s = Server::start(1, &[]);
    let p = FakeWorker::start("p1", &[]);
    let d = FakeWorker::start("d1", &[]);
    register(&s, "p1", "m", "prefill", &p.url());
    register(&s, "d1", "m", "decode", &d.url());
    let body = json!({"model": "m", "prompt": [1, 2], "stream": true, "max_tokens": 3,
                      "x_head_delay_ms": FOREVER_MS})
    .to_string();
    let c = send(&s, &body);
    wait_until("at the prefill worker", || p.stats()["active"] == 1);
    drop(c);
    wait_until("the prefill worker saw the abort", || {
        p.stats()["aborted"] == 1
    });
    wait_until("slot and load released", || {
        active(&s) == 0.0 && router_active(&s) == 0.0
    });
    assert!(d.received().is_empty(), "the decode leg ran");
}

#[test]
fn a_client_gone_with_a_pipelined_request_behind_is_noticed_too() {
    if !common::python_has("json", "python3") {
        return;
    }
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let slow = json!({"model": "m", "prompt": [1, 2], "max_tokens": 3,
                      "x_head_delay_ms": FOREVER_MS})
    .to_string();
    let mut c = send(&s, &slow);
    // A second request on the same connection, unread by the proxy while the first runs.
    let quick = json!({"model": "m", "prompt": [1], "max_tokens": 1}).to_string();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{quick}",
        quick.len()
    )
    .unwrap();
    wait_until("at the worker", || w.stats()["active"] == 1);
    drop(c);
    wait_until("the worker saw the abort", || w.stats()["aborted"] == 1);
    wait_until("slot and load released", || {
        active(&s) == 0.0 && router_active(&s) == 0.0
    });
}

#[test]
fn a_client_that_waits_is_served_without_a_false_abort() {
    if !common::python_has("json", "python3") {
        return;
    }
    // The watch fires on the client's close only: one that keeps its connection open
    // while the worker takes its time gets its answer.
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let body = json!({"model": "m", "prompt": [1, 2], "max_tokens": 3,
                      "x_head_delay_ms": 300})
    .to_string();
    let mut c = send(&s, &body);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("\"usage\"") {
        let n = c.read(&mut buf).expect("read the answer");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert_eq!(w.stats()["aborted"], 0);
}
