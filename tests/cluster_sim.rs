//! The load tool against router replicas: `kvroute-sim run` with two
//! comma-separated request and event ports, i.e. two `kvroute serve --cluster` replicas
//! joined to one `nats-server` (tests/common/cluster.rs). Route calls go round-robin
//! over the replicas and each simulated worker publishes to one replica only, so a
//! request routed by the other replica can hit only through the replicated log. Checks
//! every request finished without errors, both replicas made decisions, and each
//! replica knows the blocks of the workers that published to the other one. Skips with
//! a message when nats-server is absent (outside CI). No speed is asserted.

mod common;

use common::cluster::{nats_available, NatsServer};
use common::sim::SLICE;
use common::Server;
use serde_json::Value;
use std::time::{Duration, Instant};

fn replica(nats: &NatsServer) -> Server {
    let url = nats.url();
    let s = Server::start(1, &["--cluster", &url, "--cluster-name", "sim"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.get("/readyz").0 != 200 {
        assert!(Instant::now() < deadline, "replica never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

/// Cached blocks a replica reports for worker `id` (0 if unknown).
fn cached(s: &Server, id: &str) -> u64 {
    s.workers()
        .iter()
        .find(|w| w["id"] == id)
        .and_then(|w| w["cached_blocks"].as_u64())
        .unwrap_or(0)
}

#[test]
fn sim_spreads_over_two_replicas_and_events_reach_both() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let a = replica(&nats);
    let b = replica(&nats);
    let apis = format!("{},{}", a.api, b.api);
    let events = format!("{},{}", a.events, b.events);
    let (stdout, v) = common::sim::run_json(
        "cluster-sim",
        "two",
        &[
            "run",
            "--trace",
            SLICE,
            "--limit",
            "120",
            "--workers",
            "4",
            "--speed",
            "2",
            "--time-scale",
            "40",
            "--router-api",
            &apis,
            "--router-events",
            &events,
            "--no-progress",
        ],
    );
    let r: &Value = &v["reports"][0];
    assert_eq!(r["requests"], 120, "{r}");
    assert_eq!(r["finished"], 120, "{r}");
    assert_eq!(r["errors"], 0, "{}", r["error_samples"]);
    assert_eq!(v["pacing"][0]["replicas"], 2, "{v}");
    assert!(stdout.contains("over 2 router replica(s)"), "{stdout}");
    assert!(r["hit_rate"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    // Both replicas made decisions (round-robin) and applied the other's records.
    for s in [&a, &b] {
        assert!(
            s.metric("kvroute_routes_total") > 0.0,
            "a replica made no decision"
        );
    }
    // Workers w0/w2 published to A, w1/w3 to B; each replica knows every worker's
    // blocks, so events were routable on both (a generous wait for the log).
    let ids: Vec<String> = a
        .workers()
        .iter()
        .filter_map(|w| w["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let all = ids
            .iter()
            .all(|id| cached(&a, id) > 0 && cached(&b, id) > 0);
        if all {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas disagree: {:?} vs {:?}",
            a.workers(),
            b.workers()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Each replica ingested some workers' events itself (published them to the log)
    // and applied the other's.
    for s in [&a, &b] {
        assert!(s.metric("kvroute_cluster_records_total{outcome=\"published\"}") >= 1.0);
        assert!(s.metric("kvroute_cluster_records_total{outcome=\"applied\"}") >= 1.0);
    }
}
