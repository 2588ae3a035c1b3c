//! The proxy on router replicas (`--cluster`, a real `nats-server`): two replicas
//! given the same client `x-request-id` at the same time each route their own request
//! (the ids they mint carry each process's nonce), and the shared load is released on
//! both when the streams end.

mod common;

use common::cluster::{nats_available, NatsServer};
use common::proxy::{events, post, register, router_active, wait_until, FakeWorker};
use common::Server;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn replica(nats: &NatsServer) -> Server {
    let url = nats.url();
    let s = Server::start(1, &["--cluster", &url, "--cluster-name", "pxids"]);
    wait_until("/readyz 200", || s.get("/readyz").0 == 200);
    s
}

/// Sends a streamed completion with `x-request-id: rid` and returns the connection
/// once the response head (and, for a 200, a first event) came back, with the bytes
/// read so far.
fn start_stream(s: &Server, rid: &str) -> (TcpStream, String) {
    let body =
        json!({"model": "m", "prompt": [1, 2, 3], "stream": true, "max_tokens": 60}).to_string();
    let mut c = TcpStream::connect(&s.proxy).expect("connect to the proxy");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-request-id: {rid}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got);
        let head_done = text.contains("\r\n\r\n");
        if text.contains("data: ") || (head_done && !text.starts_with("HTTP/1.1 200")) {
            break;
        }
        let n = c.read(&mut buf).expect("read the answer");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    (c, String::from_utf8_lossy(&got).into_owned())
}

#[test]
fn two_replicas_given_the_same_request_id_both_serve_it() {
    if !nats_available() || !common::python_has("json", "python3") {
        return;
    }
    let nats = NatsServer::start();
    let a = replica(&nats);
    let b = replica(&nats);
    let w = FakeWorker::start("w1", &["--delay-ms", "50"]);
    register(&a, "w1", "m", "aggregated", &w.url());
    wait_until("B sees the worker", || b.workers().len() == 1);
    // A's stream runs (60 tokens, 50 ms apart) while B gets the same client id.
    let (mut ca, head_a) = start_stream(&a, "client-42");
    assert!(head_a.starts_with("HTTP/1.1 200"), "{head_a}");
    wait_until("B counts A's request", || router_active(&b) == 1.0);
    let (mut cb, head_b) = start_stream(&b, "client-42");
    assert!(head_b.starts_with("HTTP/1.1 200"), "B refused it: {head_b}");
    let id_of = |head: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix("x-kvroute-request-id: "))
            .map(str::to_string)
            .expect("x-kvroute-request-id")
    };
    let (ida, idb) = (id_of(&head_a), id_of(&head_b));
    assert_ne!(ida, idb);
    assert!(ida.starts_with("px=client-42.") && idb.starts_with("px=client-42."));
    // Both streams run to their end, and the load goes away on both replicas.
    for c in [&mut ca, &mut cb] {
        let mut rest = String::new();
        let _ = c.read_to_string(&mut rest);
        assert!(rest.contains("data: [DONE]"), "{rest}");
    }
    drop((ca, cb));
    for s in [&a, &b] {
        wait_until("load released", || router_active(s) == 0.0);
    }
    // A plain request through B after that works too.
    let r = post(
        &b,
        "/v1/completions",
        &json!({"model": "m", "prompt": [1], "stream": true, "max_tokens": 2}).to_string(),
        &[("x-request-id", "client-42")],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(events(&r.body).last().map(String::as_str), Some("[DONE]"));
}
