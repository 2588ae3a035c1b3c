//! Approximate mode in the in-process engine: the same behaviour the service shows in
//! `tests/approximate.rs`.

use super::*;
use crate::types::WorkerSpec;

/// Two workers registered with a url (approximate by default), speculative indexing
/// and prefix affinity off so that only the model credits blocks.
fn engine(cfg: RouterConfig, capacity: u64) -> Engine {
    let cfg = RouterConfig {
        speculative_ttl_ms: 0,
        affinity_max_entries: 0,
        ..cfg
    };
    let mut e = Engine::new(cfg, 1, EngineLimits::default(), 7).unwrap_or_else(|m| panic!("{m}"));
    for (w, port) in [("w1", 9001), ("w2", 9002)] {
        let mut s = WorkerSpec::new(w);
        s.url = Some(format!("http://127.0.0.1:{port}"));
        s.capacity_blocks = capacity;
        e.register(s).unwrap_or_else(|m| panic!("{m}"));
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

/// Device overlap of `w` in an explained decision.
fn device(d: &RouteDecision, w: &str) -> u32 {
    d.candidates
        .as_ref()
        .and_then(|c| c.iter().find(|c| c.worker == w))
        .map_or(u32::MAX, |c| c.overlap.device)
}

fn status(e: &Engine, w: &str) -> (bool, Option<u64>) {
    let s = e.workers(0);
    let r = s
        .iter()
        .find(|s| s.id == w)
        .unwrap_or_else(|| panic!("{w}"));
    (r.approximate, r.approximate_entries)
}

/// Routes `h` as request `id` and finishes it; returns its worker.
fn route_done(e: &mut Engine, id: &str, h: &[u64], now: u64) -> String {
    let d = e.route(&req(id, h), now).unwrap();
    e.finish(id, now + 1).unwrap();
    d.decode_worker
}

#[test]
fn a_prompt_stays_modelled_after_its_request_ends() {
    let mut e = engine(RouterConfig::default(), 1000);
    let h: Vec<u64> = (1..=10).collect();
    let w = route_done(&mut e, "a", &h, 0);
    assert_eq!(status(&e, &w), (true, Some(10)));
    let b = e.route(&req("b", &h[..6]), 100).unwrap();
    assert_eq!((b.decode_worker.as_str(), device(&b, &w)), (w.as_str(), 6));
    // Off: the worker is exact (load-only without events).
    let cfg = RouterConfig {
        approximate: false,
        ..RouterConfig::default()
    };
    let mut off = engine(cfg, 1000);
    let w = route_done(&mut off, "a", &h, 0);
    assert_eq!(status(&off, &w), (false, None));
    assert_eq!(device(&off.route(&req("b", &h), 100).unwrap(), &w), 0);
}

#[test]
fn the_first_event_switches_a_worker_to_exact() {
    let mut e = engine(RouterConfig::default(), 1000);
    let h: Vec<u64> = (1..=10).collect();
    let w = route_done(&mut e, "a", &h, 0);
    let ev = KvEvent::Stored {
        tier: Tier::Device,
        parent: None,
        block_hashes: h[..3].to_vec(),
    };
    e.apply(&w, &ev).unwrap();
    assert_eq!(status(&e, &w), (false, None));
    let b = e.route(&req("b", &h), 10).unwrap();
    assert_eq!(device(&b, &w), 3, "only what the events say");
    e.finish("b", 11).unwrap();
    // Routes no longer feed the model.
    let c = e.route(&req("c", &[77, 78]), 20).unwrap();
    e.finish("c", 21).unwrap();
    assert_eq!(
        device(
            &e.route(&req("d", &[77, 78]), 30).unwrap(),
            &c.decode_worker
        ),
        0
    );
}

#[test]
fn the_model_is_an_lru_of_the_declared_capacity_with_an_idle_ttl() {
    let cfg = RouterConfig {
        approximate_ttl_ms: 1_000,
        ..RouterConfig::default()
    };
    let mut e = engine(cfg, 8);
    e.set_approximate("w2", false).unwrap();
    // Three 4-block prompts on w1 (w2 is exact and empty, so w1 is never cheaper
    // unless it holds the prefix: pin the first ones).
    for (i, base) in [100u64, 200, 300].into_iter().enumerate() {
        let mut r = req(&format!("p{i}"), &[base, base + 1, base + 2, base + 3]);
        r.pin = Some("w1".into());
        e.route(&r, i as u64 * 10).unwrap();
        e.finish(&format!("p{i}"), i as u64 * 10 + 1).unwrap();
    }
    assert_eq!(status(&e, "w1"), (true, Some(8)));
    // A decision reports the overlaps from before its own touch.
    let probe = |e: &mut Engine, id: &str, h: &[u64], now: u64| {
        let d = e.route(&req(id, h), now).unwrap();
        e.finish(id, now + 1).unwrap();
        device(&d, "w1")
    };
    assert_eq!(probe(&mut e, "q2", &[300, 301, 302, 303], 50), 4);
    let first = probe(&mut e, "q1", &[100, 101, 102, 103], 60);
    assert!(
        first < 4,
        "least recently used: its tail went first ({first})"
    );
    // 1 s after its last touch (q2, at 50 µs) a block is gone.
    assert_eq!(
        probe(&mut e, "q3", &[300, 301, 302, 303], 50 + 1_000_000),
        0
    );
}
