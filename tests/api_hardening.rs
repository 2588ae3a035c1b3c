//! Issue 13 items 8, 9, 10 and 16 against the real `kvroute serve` binary over
//! loopback: read-your-writes of JSON events, one id rule at every door, the binary
//! handshake's error codes, and LoRA-salted routing over HTTP and the binary API.

mod common;
use common::{hashes, Server};
use serde_json::{json, Value};
use std::time::Duration;

fn worker(id: &str) -> Value {
    json!({"id": id, "role": "aggregated", "device": "gpu", "model": "m", "capacity_blocks": 100000})
}

/// POST with a keep-alive agent; returns (status, body).
fn post(agent: &ureq::Agent, url: &str, body: Value) -> (u16, Value) {
    match agent.post(url).send_json(body) {
        Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("POST {url}: {e}"),
    }
}

// ---- item 8: read-your-writes ------------------------------------------------------

/// `{"applied": n}` means visible: a route sent right after the events answer, on the
/// same keep-alive connection, sees every block the events stored. Before the fix the
/// route's shard queries (urgent lane) overtook the queued index batches (bulk lane)
/// and missed in 1–9 % of tries.
#[test]
fn events_are_visible_to_the_next_route() {
    let s = Server::start(2, &[]);
    s.register(worker("w"));
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let (events, route) = (s.url("/v1/workers/w/events"), s.url("/v1/route"));
    let mut misses = Vec::new();
    for i in 0..500u64 {
        let h = hashes(1000 + i, 64);
        let (code, body) = post(
            &agent,
            &events,
            json!({"events": [{"type": "stored", "tier": "device", "parent": null, "block_hashes": h}]}),
        );
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["applied"], 1, "{body}");
        let id = format!("ryw-{i}");
        let (code, d) = post(
            &agent,
            &route,
            json!({"request_id": id, "model": "m", "block_hashes": h}),
        );
        assert_eq!(code, 200, "{d}");
        if d["overlap"]["device"] != 64 {
            misses.push((i, d["overlap"]["device"].clone()));
        }
        let (code, b) = post(
            &agent,
            &s.url(&format!("/v1/requests/{id}/finish")),
            json!({}),
        );
        assert_eq!(code, 200, "{b}");
    }
    assert!(
        misses.is_empty(),
        "{} of 500 routes missed blocks just applied: {misses:?}",
        misses.len()
    );
}
