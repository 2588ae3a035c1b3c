//! Routing quality you can watch in `/metrics`, through the real
//! binary: the block-weighted hit rate as routed, per worker and fleet-wide, and the
//! counter and warning for a worker that is routed to but sends no KV events.

mod common;

use common::Server;
use serde_json::json;

#[test]
fn hit_rate_as_routed_and_workers_routed_without_events() {
    let s = Server::start_logged(2, &[]);
    for id in ["w1", "w2"] {
        s.register(json!({"id": id, "model": "m", "capacity_blocks": 1000}));
    }
    s.store("w1", "device", &[11, 12, 13]);
    // 3 of 4 blocks cached on w1: chosen there, 3 cached of 4 routed.
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": "r1", "model": "m", "block_hashes": [11, 12, 13, 14]}),
    );
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["decode_worker"], "w1");
    // w2 never sent an event: a decision pinned to it is load-only.
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": "r2", "model": "m", "block_hashes": [21, 22, 23, 24], "pin": "w2"}),
    );
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["decode_worker"], "w2");
    let m = |name: &str| s.metric(name);
    assert_eq!(m("kvroute_worker_routed_prompt_blocks{worker=\"w1\"}"), 4.0);
    assert_eq!(m("kvroute_worker_routed_cached_blocks{worker=\"w1\"}"), 3.0);
    assert_eq!(m("kvroute_worker_hit_rate{worker=\"w1\"}"), 0.75);
    assert_eq!(m("kvroute_worker_hit_rate{worker=\"w2\"}"), 0.0);
    assert_eq!(m("kvroute_routed_prompt_blocks "), 8.0);
    assert_eq!(m("kvroute_routed_cached_blocks "), 3.0);
    assert_eq!(m("kvroute_hit_rate "), 3.0 / 8.0);
    assert_eq!(m("kvroute_routed_without_events_total{worker=\"w2\"}"), 1.0);
    assert_eq!(m("kvroute_routed_without_events_total{worker=\"w1\"}"), 0.0);
    s.wait_until("the load-only warning in the log", |s| {
        s.log()
            .iter()
            .any(|l| l.contains("\"w2\"") && l.contains("no KV cache event since it registered"))
    });
    // A second silent decision is counted but not logged again within the minute.
    let (code, _) = s.post(
        "/v1/route",
        json!({"request_id": "r3", "model": "m", "block_hashes": [31], "pin": "w2"}),
    );
    assert_eq!(code, 200);
    assert_eq!(m("kvroute_routed_without_events_total{worker=\"w2\"}"), 2.0);
    let warnings = s
        .log()
        .iter()
        .filter(|l| l.contains("\"w2\"") && l.contains("no KV cache event"))
        .count();
    assert_eq!(warnings, 1, "one warning per worker per minute");
}
