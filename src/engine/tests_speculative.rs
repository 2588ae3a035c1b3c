//! Speculative indexing in the in-process engine (the offline simulator's router):
//! the same behaviour the service shows in `tests/speculative.rs`.

use super::*;
use crate::types::WorkerSpec;

fn engine(ttl_ms: u64) -> Engine {
    let cfg = RouterConfig {
        speculative_ttl_ms: ttl_ms,
        ..RouterConfig::default()
    };
    let mut e = Engine::new(cfg, 1, EngineLimits::default(), 7).unwrap_or_else(|m| panic!("{m}"));
    for w in ["w1", "w2"] {
        e.register(WorkerSpec::new(w))
            .unwrap_or_else(|m| panic!("{m}"));
    }
    e
}

fn req(id: &str, h: &[u64]) -> RouteRequest {
    RouteRequest {
        request_id: id.into(),
        block_hashes: Some(h.to_vec()),
        explain: true,
        ..Default::default()
    }
}

/// (device overlap, speculative) of `w` in an explained decision.
fn credit(d: &RouteDecision, w: &str) -> (u32, u32) {
    d.candidates
        .as_ref()
        .and_then(|c| c.iter().find(|c| c.worker == w))
        .map_or((u32::MAX, u32::MAX), |c| (c.overlap.device, c.speculative))
}

fn other(w: &str) -> &'static str {
    if w == "w1" {
        "w2"
    } else {
        "w1"
    }
}

#[test]
fn burst_follows_until_ttl_and_events_confirm() {
    let mut e = engine(1_000);
    let h: Vec<u64> = (1..=10).collect();
    let a = e.route(&req("a", &h), 0).unwrap();
    let w = a.decode_worker.clone();
    assert_eq!(credit(&a, &w), (0, 0));
    e.first_token("a", 10).unwrap();
    let b = e.route(&req("b", &h), 20).unwrap();
    assert_eq!(b.decode_worker, w);
    assert_eq!(credit(&b, &w), (10, 10));
    assert_eq!(credit(&b, other(&w)), (0, 0));
    // A Stored event confirms four blocks: they are plain device overlap now.
    e.apply(
        &w,
        &KvEvent::Stored {
            tier: Tier::Device,
            parent: None,
            block_hashes: h[..4].to_vec(),
        },
    )
    .unwrap();
    let c = e.route(&req("c", &h), 30).unwrap();
    assert_eq!(credit(&c, &w), (10, 6));
    // Past the TTL of the last refresh (c at 30 µs... + 1 s) only the index counts.
    let d = e.route(&req("d", &h), 30 + 1_000_000).unwrap();
    assert_eq!(credit(&d, &w), (4, 0));
}

#[test]
fn clear_removal_finish_and_deregister_drop_pending() {
    let mut e = engine(60_000);
    let h: Vec<u64> = (100..110).collect();
    let a = e.route(&req("a", &h), 0).unwrap();
    let w = a.decode_worker.clone();
    e.apply(
        &w,
        &KvEvent::Removed {
            tier: Tier::Device,
            block_hashes: h[3..4].to_vec(),
        },
    )
    .unwrap();
    let b = e.route(&req("b", &h), 1).unwrap();
    assert_eq!(credit(&b, &w), (3, 3));
    e.apply(&w, &KvEvent::Cleared { tier: None }).unwrap();
    let c = e.route(&req("c", &h), 2).unwrap();
    assert_eq!(credit(&c, &w), (0, 0));
    // c made them pending on its worker again; its end drops them.
    let wc = c.decode_worker.clone();
    e.finish("c", 3).unwrap();
    let d = e.route(&req("d", &h), 4).unwrap();
    assert_eq!(credit(&d, &wc), (0, 0));
    let wd = d.decode_worker.clone();
    e.deregister(&wd).unwrap();
    e.register(WorkerSpec::new(wd.as_str())).unwrap();
    let f = e.route(&req("f", &h), 5).unwrap();
    assert_eq!(credit(&f, &wd), (0, 0));
}

#[test]
fn off_means_no_credit() {
    let mut e = engine(0);
    let h: Vec<u64> = (1..=10).collect();
    e.route(&req("a", &h), 0).unwrap();
    let b = e.route(&req("b", &h), 1).unwrap();
    for w in ["w1", "w2"] {
        assert_eq!(credit(&b, w), (0, 0));
    }
}
