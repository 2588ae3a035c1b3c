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
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": id, "model": "m", "block_hashes": h}),
    );
    assert_eq!(code, 200, "route {id}: {d}");
    d["decode_worker"].as_str().unwrap_or_default().to_string()
}

fn applied(s: &Server) -> f64 {
    s.metric("kvroute_cluster_load_ops_total{outcome=\"applied\"}")
}

#[test]
fn a_conversation_keeps_its_worker_across_replicas() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let a = replica(&nats);
    let b = replica(&nats);
    for id in ["w0", "w1", "w2", "w3"] {
        a.register(json!({
            "id": id, "role": "aggregated", "model": "m", "capacity_blocks": 100000
        }));
    }
    poll("B sees the fleet", 30, || b.workers().len() == 4);
    // First turns on A (8 blocks each), finished, so no load is left to decide by.
    let convs: Vec<Vec<u64>> = (0..8u64).map(|c| hashes(3000 + c, 12)).collect();
    let mut first = Vec::new();
    for (c, conv) in convs.iter().enumerate() {
        let id = format!("c{c}t1");
        first.push(route(&a, &id, &conv[..8]));
        let (code, body) = a.post(&format!("/v1/requests/{id}/finish"), json!({}));
        assert_eq!(code, 200, "{body}");
    }
    let spread: std::collections::BTreeSet<_> = first.iter().collect();
    assert!(spread.len() > 1, "A spread the first turns: {first:?}");
    // B has applied A's 8 routes and 8 finishes.
    poll("B applies A's load ops", 30, || applied(&b) >= 16.0);
    poll("B's fleet idle", 30, || {
        b.workers().iter().all(|w| w["active_requests"] == 0)
    });
    // Second turns (12 blocks, extending the first) on B follow the first turns. They
    // go in the reverse order, so that B taking ties in turn as A did cannot give
    // the same workers by coincidence.
    let mut second: Vec<String> = convs
        .iter()
        .enumerate()
        .rev()
        .map(|(c, conv)| {
            let id = format!("c{c}t2");
            let w = route(&b, &id, conv);
            let (code, body) = b.post(&format!("/v1/requests/{id}/finish"), json!({}));
            assert_eq!(code, 200, "{body}");
            w
        })
        .collect();
    second.reverse();
    assert_eq!(
        second, first,
        "each second turn on B went to its first turn's worker"
    );
}
