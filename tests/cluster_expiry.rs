//! Phantom load between replicas expires (`request_ttl_ms`), through the real
//! binaries: requests a replica routed and shared live on in its peers only while
//! lifecycle calls keep coming; when it is SIGKILLed they expire on the survivors, and
//! in a tier run without a secret (`--cluster-unauthenticated`) a forged load batch's
//! 256 phantom routes expire the same way. Counted as
//! `kvroute_requests_expired_total{reason="ttl"}`. Every wait is a generous poll; no
//! speed is asserted.

mod common;

use common::cluster::{nats_available, NatsServer, RawNats};
use common::{hashes, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn poll(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn replica(nats: &NatsServer, extra: &[&str]) -> Server {
    let url = nats.url();
    let mut flags = vec!["--cluster", &url, "--cluster-name", "t"];
    flags.extend_from_slice(extra);
    let s = Server::start_logged(1, &flags);
    poll("/readyz 200", 60, || s.get("/readyz").0 == 200);
    s
}

fn active(s: &Server, id: &str) -> u64 {
    s.workers()
        .into_iter()
        .find(|w| w["id"] == id)
        .and_then(|w| w["active_requests"].as_u64())
        .unwrap_or(0)
}

fn expired(s: &Server) -> f64 {
    s.metric("kvroute_requests_expired_total{reason=\"ttl\"}")
}

fn worker(id: &str) -> Value {
    json!({"id": id, "model": "m", "capacity_blocks": 100000})
}

#[test]
fn a_killed_replicas_requests_expire_on_its_peers() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let ttl = ["--request-ttl-ms", "2000"];
    let a = replica(&nats, &ttl);
    let b = replica(&nats, &ttl);
    a.register(worker("w1"));
    poll("B sees w1", 30, || b.workers().len() == 1);
    for id in ["k1", "k2", "k3"] {
        let (code, d) = a.post(
            "/v1/route",
            json!({"request_id": id, "model": "m", "block_hashes": hashes(7, 4),
                   "mode": "direct", "pin": "w1"}),
        );
        assert_eq!(code, 200, "{d}");
    }
    poll("B counts A's requests", 30, || active(&b, "w1") == 3);
    // k1's stream goes on for 1.5 TTLs at least (and until B expired the others): its
    // progress, sent to A, reaches B and keeps it there.
    let until = Instant::now() + Duration::from_millis(3000);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    while Instant::now() < until || expired(&b) < 2.0 {
        assert!(Instant::now() < deadline, "k2 and k3 never expired on B");
        n += 1;
        let (code, body) = a.post("/v1/requests/k1/progress", json!({"output_tokens": n}));
        assert_eq!(code, 200, "{body}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        active(&b, "w1"),
        1,
        "k2 and k3 expired, k1 kept by its progress"
    );
    assert_eq!(expired(&b), 2.0);
    // A dies: nobody will ever call about k1 again.
    let mut child = a.into_child();
    child.kill().expect("SIGKILL A");
    let _ = child.wait();
    poll("k1 expires on B", 30, || active(&b, "w1") == 0);
    assert_eq!(expired(&b), 3.0);
    assert!(b.log().iter().any(|l| l.contains("expired 1 in-flight")));
}

#[test]
fn an_unauthenticated_tiers_forged_load_expires() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let a = replica(
        &nats,
        &["--cluster-unauthenticated", "--request-ttl-ms", "2000"],
    );
    assert!(a
        .log()
        .iter()
        .any(|l| l.contains("WARNING: unauthenticated")));
    a.register(worker("w1"));
    let ops: Vec<Value> = (0..256)
        .map(|i| {
            json!({"op": "route", "id": format!("ph{i}"), "decode": "w1", "input_tokens": 4096,
                   "cached_tokens": 0, "prompt_blocks": 256, "hashes": []})
        })
        .collect();
    let batch = json!({"origin": "rogue/1", "seq": 1, "ops": ops}).to_string();
    let mut rogue = RawNats::connect(nats.port, None).expect("rogue connects");
    rogue.publish("kvroute.t.load", None, batch.as_bytes());
    assert_eq!(rogue.flush(), Vec::<String>::new());
    poll("the forged load lands", 30, || active(&a, "w1") == 256);
    poll("and expires", 30, || active(&a, "w1") == 0);
    assert_eq!(expired(&a), 256.0);
}
