//! Phantom load expires (`request_ttl_ms`), through the real binary: proxied streams
//! in flight when the router is SIGKILLed are not re-admitted from its `--state-dir`
//! snapshot (their connections died with it), a routed request restored beside them
//! expires a TTL after the restart unless its frontend calls again, and any request
//! with no lifecycle call for the TTL leaves while progress calls keep a long one.
//! Each expiry is counted (`kvroute_requests_expired_total{reason}`) and logged. Every
//! wait is a generous poll; no speed is asserted.

mod common;

use common::proxy::{open_stream, register, FakeWorker};
use common::{hashes, Server};
use serde_json::json;
use std::time::{Duration, Instant};

fn poll(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Active requests of worker `id` as the router counts them.
fn active(s: &Server, id: &str) -> u64 {
    s.workers()
        .into_iter()
        .find(|w| w["id"] == id)
        .and_then(|w| w["active_requests"].as_u64())
        .unwrap_or(0)
}

fn expired(s: &Server, reason: &str) -> f64 {
    s.metric(&format!(
        "kvroute_requests_expired_total{{reason=\"{reason}\"}}"
    ))
}

fn route(s: &Server, id: &str, worker: &str) {
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": id, "model": "m", "block_hashes": hashes(3, 4),
               "mode": "direct", "pin": worker}),
    );
    assert_eq!(code, 200, "{d}");
}

fn python_ok() -> bool {
    common::python_has("json", "(python3 itself)")
}

#[test]
fn proxied_streams_of_a_killed_router_do_not_come_back_as_load() {
    if !python_ok() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().to_str().expect("utf-8 path").to_string();
    let w = FakeWorker::start("w1", &["--delay-ms", "500"]);
    let s = Server::start(1, &["--state-dir", &state, "--snapshot-interval-ms", "200"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    // Five long proxied streams, and one request a frontend routed over HTTP.
    let body =
        json!({"model": "m", "prompt": [1, 2, 3], "stream": true, "max_tokens": 1000}).to_string();
    let streams: Vec<_> = (0..5).map(|_| open_stream(&s, &body, 1)).collect();
    route(&s, "frontend-1", "w1");
    poll("six in flight", 30, || active(&s, "w1") == 6);
    let taken = s.metric("kvroute_snapshots_total");
    poll("a snapshot holds them", 30, || {
        s.metric("kvroute_snapshots_total") >= taken + 2.0
    });
    let mut child = s.into_child();
    child.kill().expect("SIGKILL the router");
    let _ = child.wait();
    drop(streams);
    // The restart restores the registry, the index and the frontend's request; the
    // dead process's proxied streams are not re-admitted.
    let s = Server::start_logged(1, &["--state-dir", &state, "--request-ttl-ms", "2000"]);
    assert_eq!(
        active(&s, "w1"),
        1,
        "phantom proxied load after the restart"
    );
    assert_eq!(expired(&s, "restart"), 5.0);
    assert!(
        s.log()
            .iter()
            .any(|l| l.contains("5 restored in-flight request(s)")),
        "{:?}",
        s.log()
    );
    // Its frontend never calls again (it died too): it expires after the TTL.
    poll("the restored request expires", 30, || active(&s, "w1") == 0);
    assert_eq!(expired(&s, "ttl"), 1.0);
    assert!(s.log().iter().any(|l| l.contains("expired 1 in-flight")));
    let (code, _) = s.post("/v1/requests/frontend-1/finish", json!({}));
    assert_eq!(code, 404, "an expired request is gone");
}

#[test]
fn a_request_nobody_calls_about_expires_and_progress_keeps_a_long_one() {
    let s = Server::start_logged(1, &["--request-ttl-ms", "1500"]);
    s.register(json!({"id": "w1", "model": "m"}));
    route(&s, "idle", "w1");
    route(&s, "long", "w1");
    assert_eq!(active(&s, "w1"), 2);
    // `long` streams for three TTLs at least (and until `idle` expired), one progress
    // call every 300 ms.
    let until = Instant::now() + Duration::from_millis(4500);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while Instant::now() < until || expired(&s, "ttl") < 1.0 {
        assert!(Instant::now() < deadline, "the idle request never expired");
        n += 1;
        let (code, body) = s.post("/v1/requests/long/progress", json!({"output_tokens": n}));
        assert_eq!(code, 200, "{body}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(active(&s, "w1"), 1, "only the idle one expired");
    assert_eq!(expired(&s, "ttl"), 1.0);
    let (code, _) = s.post("/v1/requests/idle/finish", json!({}));
    assert_eq!(code, 404);
    let (code, _) = s.post("/v1/requests/long/finish", json!({}));
    assert_eq!(code, 200);
    assert_eq!(active(&s, "w1"), 0);
    assert!(s
        .log()
        .iter()
        .any(|l| l.contains("expired 1 in-flight request(s)") && l.contains("\"idle\"")));
}
