//! Prefix affinity across replicas (`--cluster`), through the real binaries: a
//! conversation whose first turn replica A routed keeps its worker when the next turn
//! reaches replica B, because A's shared route (`cluster::load::LoadOp::Route`) also
//! teaches B's affinity map. Every wait is a generous poll; no speed is asserted.
//!
//! Idle workers without KV events are an exact tie for the index, which B would take
//! in turn (`balance_slack`); `--speculative-ttl-ms 0` keeps speculative indexing from
//! holding the turn instead, so only the affinity can keep it.

mod common;

use common::cluster::{nats_available, NatsServer};
use common::{hashes, Server};
use serde_json::json;
use std::time::{Duration, Instant};

fn replica(nats: &NatsServer) -> Server {
    let url = nats.url();
    let s = Server::start(
        1,
        &[
            "--cluster",
            &url,
            "--cluster-name",
            "t",
            "--heartbeat-timeout-ms",
            "600000",
            "--speculative-ttl-ms",
            "0",
        ],
    );
    poll("/readyz 200", 60, || s.get("/readyz").0 == 200);
    s
}

fn poll(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn route(s: &Server, id: &str, h: &[u64]) -> String {
    route_with(s, id, json!({"block_hashes": h}))
}

/// Routes `body` (block hashes, pin, mode) with this id and model; the decode worker.
fn route_with(s: &Server, id: &str, mut body: serde_json::Value) -> String {
    body["request_id"] = json!(id);
    body["model"] = json!("m");
    let (code, d) = s.post("/v1/route", body);
    assert_eq!(code, 200, "route {id}: {d}");
    d["decode_worker"].as_str().unwrap_or_default().to_string()
}

fn finish(s: &Server, id: &str) {
    let (code, body) = s.post(&format!("/v1/requests/{id}/finish"), json!({}));
    assert_eq!(code, 200, "{body}");
}

/// Two replicas on one NATS server sharing a fleet of four idle workers.
fn pair(nats: &NatsServer) -> (Server, Server) {
    let a = replica(nats);
    let b = replica(nats);
    for id in ["w0", "w1", "w2", "w3"] {
        a.register(json!({
            "id": id, "role": "aggregated", "model": "m", "capacity_blocks": 100000
        }));
    }
    poll("B sees the fleet", 30, || b.workers().len() == 4);
    (a, b)
}

fn applied(s: &Server) -> f64 {
    s.metric("kvroute_cluster_load_ops_total{outcome=\"applied\"}")
}

/// Waits until `b` has applied `ops` of its peer's load ops and has no request left.
fn settle(b: &Server, ops: f64) {
    poll("B applies A's load ops", 30, || applied(b) >= ops);
    poll("B's fleet idle", 30, || {
        b.workers().iter().all(|w| w["active_requests"] == 0)
    });
}

/// The next turn of every conversation on `s` (whole `convs`, ids `{tag}{c}t2`), each
/// finished; routed in reverse order when `reverse`, so that taking ties in turn
/// cannot give the first turns' workers by coincidence. Workers in `convs` order.
fn next_turns(s: &Server, tag: &str, convs: &[Vec<u64>], reverse: bool) -> Vec<String> {
    let mut order: Vec<usize> = (0..convs.len()).collect();
    if reverse {
        order.reverse();
    }
    let mut out = vec![String::new(); convs.len()];
    for c in order {
        let id = format!("{tag}{c}t2");
        out[c] = route(s, &id, &convs[c]);
        finish(s, &id);
    }
    out
}

#[test]
fn a_conversation_keeps_its_worker_across_replicas() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let (a, b) = pair(&nats);
    // First turns on A (8 blocks each), finished, so no load is left to decide by.
    let convs: Vec<Vec<u64>> = (0..8u64).map(|c| hashes(3000 + c, 12)).collect();
    let mut first = Vec::new();
    for (c, conv) in convs.iter().enumerate() {
        let id = format!("c{c}t1");
        first.push(route(&a, &id, &conv[..8]));
        finish(&a, &id);
    }
    let spread: std::collections::BTreeSet<_> = first.iter().collect();
    assert!(spread.len() > 1, "A spread the first turns: {first:?}");
    // B has applied A's 8 routes and 8 finishes.
    settle(&b, 16.0);
    // Second turns (12 blocks, extending the first) on B follow the first turns.
    let second = next_turns(&b, "c", &convs, true);
    assert_eq!(
        second, first,
        "each second turn on B went to its first turn's worker"
    );
}

/// A route the caller pinned on A (`pin`, or mode `direct`) is no routing of its
/// prefix: B admits its load but notes no affinity for it (`CarriedRequest::pinned`),
/// so the next turns on B are near ties B takes in turn, not all on the pinned worker.
/// Conversations A routed itself in the same batches still pull theirs, which shows
/// B did read A's routes.
#[test]
fn a_pinned_route_on_one_replica_does_not_pull_the_next_turn_on_another() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let (a, b) = pair(&nats);
    let pinned: Vec<Vec<u64>> = (0..8u64).map(|c| hashes(5000 + c, 12)).collect();
    let routed: Vec<Vec<u64>> = (0..4u64).map(|c| hashes(6000 + c, 12)).collect();
    for (c, conv) in pinned.iter().enumerate() {
        let id = format!("p{c}t1");
        let body = if c % 2 == 0 {
            json!({"block_hashes": &conv[..8], "pin": "w3"})
        } else {
            json!({"block_hashes": &conv[..8], "pin": "w3", "mode": "direct"})
        };
        assert_eq!(route_with(&a, &id, body), "w3", "{id} went to its pin");
        finish(&a, &id);
    }
    let mut first = Vec::new();
    for (c, conv) in routed.iter().enumerate() {
        let id = format!("r{c}t1");
        first.push(route(&a, &id, &conv[..8]));
        finish(&a, &id);
    }
    // B has applied A's 12 routes and 12 finishes.
    settle(&b, 24.0);
    let second = next_turns(&b, "r", &routed, true);
    assert_eq!(second, first, "A's routed conversations follow on B");
    let after_pin = next_turns(&b, "p", &pinned, false);
    assert!(
        after_pin.iter().any(|w| w != "w3"),
        "B noted A's pinned routes as routed decisions: {after_pin:?}"
    );
}
