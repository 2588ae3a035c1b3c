//! Memory the proxy holds per response, through the real binary: a non-streamed JSON
//! answer is scanned for its `usage` as it streams through (src/proxy/jscan.rs), so a
//! huge or endless answer costs a few KiB per request, not a buffer of it. Measured
//! as the router's RSS (/proc/PID/status) with a generous bound; the answer still
//! reaches the client byte for byte.

mod common;

use common::proxy::{register, router_active, wait_until, FakeWorker};
use common::Server;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib << 10
}

/// The answer tests/py/fake_openai_worker.py sends for `x_json_bytes: n`.
fn big_answer(n: usize) -> Vec<u8> {
    let mut a = br#"{"id":"cmpl-big","object":"text_completion","model":"m","choices":[{"index":0,"text":""#.to_vec();
    a.extend(b"abcdefghij".iter().cycle().take(n));
    a.extend_from_slice(br#"","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":7,"total_tokens":8}}"#);
    a
}

/// Opens a non-streamed request whose answer never ends and reads until `n` bytes of
/// its body arrived; the connection stays open.
fn held(s: &Server, n: usize) -> TcpStream {
    let body =
        json!({"model": "m", "prompt": [1, 2], "x_json_bytes": n, "x_hold": true}).to_string();
    let mut c = TcpStream::connect(&s.proxy).expect("connect to the proxy");
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    // The answer's first bytes, to say what came back if it ends early.
    let mut head = Vec::new();
    while got < n {
        let k = c.read(&mut buf).expect("read the answer");
        assert!(
            k > 0,
            "closed after {got} bytes: {}",
            String::from_utf8_lossy(&head)
        );
        if head.len() < 512 {
            head.extend_from_slice(&buf[..k.min(512 - head.len())]);
        }
        got += k;
    }
    c
}

#[test]
fn json_answers_of_any_size_hold_no_memory_per_request() {
    if !common::python_has("json", "python3") {
        return;
    }
    let s = Server::start(2, &[]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    // A 48 MiB answer arrives unchanged, and its usage (at its very end) is read.
    let n = 48 << 20;
    let body = json!({"model": "m", "prompt": [1, 2], "x_json_bytes": n}).to_string();
    let resp = common::proxy::agent()
        .post(&format!("http://{}/v1/completions", s.proxy))
        .set("content-type", "application/json")
        .send_string(&body)
        .expect("the big answer");
    let mut got = Vec::new();
    resp.into_reader().read_to_end(&mut got).expect("read it");
    assert!(
        got == big_answer(n),
        "the answer changed on its way ({} bytes)",
        got.len()
    );
    assert_eq!(s.metric("kvroute_proxy_ttft_seconds_count"), 1.0);
    // Answers in flight at once, each 3.5 MiB in: the router's memory does not grow
    // with them (it held up to 4 MiB of each before).
    let part = 3 << 20 | 512 << 10;
    let warm = (held(&s, part), held(&s, part));
    let before = rss_bytes(s.pid());
    let clients: Vec<TcpStream> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..32).map(|_| sc.spawn(|| held(&s, part))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let grown = rss_bytes(s.pid()).saturating_sub(before);
    assert_eq!(s.metric("kvroute_proxy_active "), 34.0);
    eprintln!(
        "router RSS grew {} KiB for 32 answers 3.5 MiB in",
        grown >> 10
    );
    assert!(
        grown < 48 << 20,
        "router RSS grew {} MiB for 32 answers in flight",
        grown >> 20
    );
    drop((clients, warm));
    wait_until("the worker saw every client go", || {
        w.stats()["aborted"] == 34
    });
    wait_until("load released", || {
        router_active(&s) == 0.0 && s.metric("kvroute_proxy_active ") == 0.0
    });
}
