//! Speculative indexing end to end, against the real binary over
//! HTTP: a request's prompt blocks count as cached on the worker it was routed to
//! until that worker's events confirm or drop them, a TTL expires, the request ends,
//! or the worker is removed.
//! Each scenario runs with `--cores 1` and `--cores 2` (pending entries then live on
//! the core owning each hash, like the index).

mod common;
use common::{hashes, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TTL_MS: u64 = 2_000;

fn worker(id: &str) -> Value {
    json!({"id": id, "role": "aggregated", "device": "gpu", "model": "m", "capacity_blocks": 100000})
}

fn route(s: &Server, id: &str, h: &[u64]) -> Value {
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": id, "model": "m", "block_hashes": h, "explain": true}),
    );
    assert_eq!(code, 200, "route failed: {d}");
    d
}

fn post_ok(s: &Server, path: &str) {
    let (code, b) = s.post(path, json!({}));
    assert_eq!(code, 200, "{path}: {b}");
}

/// (device overlap, speculative blocks) of `worker` in an explained decision.
fn credit(d: &Value, worker: &str) -> (u64, u64) {
    let c = d["candidates"].as_array().expect("explain candidates");
    let x = c
        .iter()
        .find(|x| x["worker"] == worker)
        .unwrap_or_else(|| panic!("no candidate {worker} in {d}"));
    (
        x["overlap"]["device"].as_u64().unwrap_or(u64::MAX),
        x["speculative"].as_u64().unwrap_or(u64::MAX),
    )
}

fn other(w: &str) -> &'static str {
    if w == "w1" {
        "w2"
    } else {
        "w1"
    }
}

fn start(cores: usize) -> Server {
    let ttl = TTL_MS.to_string();
    let s = Server::start(cores, &["--speculative-ttl-ms", &ttl]);
    for w in ["w1", "w2"] {
        s.register(worker(w));
    }
    s
}

/// Two requests with a new shared prefix, routed before any event: the second goes
/// where the first went, credited with speculative blocks; after the TTL, with no
/// event, nothing is credited any more.
fn burst_then_ttl(cores: usize) {
    let s = start(cores);
    let h = hashes(7, 10);
    let t0 = Instant::now();
    let a = route(&s, "a", &h);
    let wa = a["decode_worker"].as_str().unwrap_or_default().to_string();
    assert_eq!(credit(&a, &wa), (0, 0), "{a}");
    // The first request's prefill is done (its first token is out), but the worker
    // has not reported its blocks yet.
    post_ok(&s, "/v1/requests/a/first_token");
    let b = route(&s, "b", &h);
    assert!(
        t0.elapsed() < Duration::from_millis(TTL_MS),
        "too slow to test"
    );
    assert_eq!(b["decode_worker"], wa.as_str(), "{b}");
    assert_eq!(credit(&b, &wa), (10, 10), "{b}");
    assert_eq!(credit(&b, other(&wa)), (0, 0), "{b}");
    assert_eq!(b["overlap"]["device"], 10, "{b}");
    // TTL passed with no event (both requests still running): the blocks are no
    // longer credited anywhere.
    std::thread::sleep(Duration::from_millis(TTL_MS + 300));
    let c = route(&s, "c", &h);
    for w in ["w1", "w2"] {
        assert_eq!(credit(&c, w), (0, 0), "{c}");
    }
    // The end of a request also ends its blocks' pending state.
    let e = route(&s, "e", &h);
    let we = e["decode_worker"].as_str().unwrap_or_default().to_string();
    post_ok(&s, "/v1/requests/e/finish");
    let f = route(&s, "f", &h);
    assert_eq!(credit(&f, &we), (0, 0), "{f}");
}

#[test]
fn burst_follows_the_first_then_ttl_expires_cores_1() {
    burst_then_ttl(1);
}

#[test]
fn burst_follows_the_first_then_ttl_expires_cores_2() {
    burst_then_ttl(2);
}

/// A `Stored` event confirms pending blocks (they are then plain device overlap), a
/// `Removed` event drops them, and removing the worker drops the rest.
fn confirm_remove_and_worker_removal(cores: usize) {
    let s = start(cores);
    let h = hashes(8, 10);
    let a = route(&s, "a", &h);
    let wa = a["decode_worker"].as_str().unwrap_or_default().to_string();
    post_ok(&s, "/v1/requests/a/first_token");
    // JSON events are applied everywhere when the call returns.
    s.store(&wa, "device", &h[..4]);
    let b = route(&s, "b", &h);
    assert_eq!(b["decode_worker"], wa.as_str(), "{b}");
    assert_eq!(credit(&b, &wa), (10, 6), "{b}");
    // Removed 6 and 7 (not pending any more), stored 4 (confirmed): device run 5,
    // then pending 5 only.
    let (code, body) = s.post(
        &format!("/v1/workers/{wa}/events"),
        json!({"events": [
            {"type": "removed", "tier": "device", "block_hashes": &h[6..8]},
            {"type": "stored", "tier": "device", "parent": null, "block_hashes": [h[4]]},
        ]}),
    );
    assert_eq!(code, 200, "{body}");
    let c = route(&s, "c", &h);
    assert_eq!(credit(&c, &wa), (6, 1), "{c}");
    // The worker leaves and comes back: nothing of it is pending (or cached) any more.
    let (code, body) = s.delete(&format!("/v1/workers/{wa}"));
    assert!(code == 200 || code == 204, "{code} {body}");
    s.register(worker(&wa));
    let d = route(&s, "d", &h);
    assert_eq!(credit(&d, &wa), (0, 0), "{d}");
}

#[test]
fn confirm_remove_and_worker_removal_cores_1() {
    confirm_remove_and_worker_removal(1);
}

#[test]
fn confirm_remove_and_worker_removal_cores_2() {
    confirm_remove_and_worker_removal(2);
}
