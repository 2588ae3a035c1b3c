//! The status page's per-worker window through the real binary and its proxy: a fleet
//! registers after the router started (so the router's first window snapshot holds no
//! worker), traffic goes through the proxy, then a pause long enough for later
//! snapshots: `routes_1m` / `share_1m` / `hit_rate_1m` still hold all of the traffic
//! (they emptied out as soon as traffic paused before the window slid over the whole
//! minute), and `window_s` says how much time they cover.

mod common;

use common::fleet::{post, Fleet, FAST};
use common::Server;
use serde_json::{json, Value};
use std::time::Duration;

#[test]
fn the_window_still_holds_the_traffic_after_a_pause() {
    let s = Server::start(1, &["--block-size", "4"]);
    // The sampler's first snapshot is taken at start, before any worker exists.
    std::thread::sleep(Duration::from_millis(1500));
    let f = Fleet::start(&[
        "--workers",
        "2",
        "--events",
        "none",
        "--block-size",
        "4",
        "--timing",
        FAST,
        "--register",
        &s.http,
    ]);
    s.wait_until("two workers", |s| s.workers().len() == 2);
    let n = 40u32;
    for i in 0..n {
        let prompt: Vec<u32> = (0..8).map(|j| 100 * i + j).collect();
        let (code, body) = post(
            &format!("http://{}/v1/completions", s.proxy),
            json!({"model": "sim-model", "prompt": prompt, "max_tokens": 1}),
        );
        assert_eq!(code, 200, "{body}");
    }
    // Long enough for several window snapshots after the traffic.
    std::thread::sleep(Duration::from_secs(11));
    let (code, body) = s.get("/v1/status");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let rows = v["workers"].as_array().unwrap();
    let routes: u64 = rows.iter().map(|w| w["routes_1m"].as_u64().unwrap()).sum();
    assert_eq!(routes, u64::from(n), "{rows:?}");
    let share: f64 = rows.iter().filter_map(|w| w["share_1m"].as_f64()).sum();
    assert!((share - 1.0).abs() < 0.01, "{share} {rows:?}");
    assert!(
        rows.iter().all(|w| w["hit_rate_1m"].is_number()),
        "{rows:?}"
    );
    assert_eq!(v["summary"]["decisions_total"], n);
    let window = v["window_s"].as_f64().unwrap();
    assert!((12.0..62.0).contains(&window), "{window}");
    drop(f);
}
