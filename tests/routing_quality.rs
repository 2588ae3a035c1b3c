//! Routing quality through the running service over HTTP (the cost and mixed fleets):
//! the DESIGN §1 worked example with default knobs, its decode load built by real
//! routed requests, and the device-aware `kv` cost of a mixed CPU/GPU fleet with a
//! declared per-worker throughput. Each scenario runs with `--cores 1` and `--cores 2`
//! and must agree.

mod common;
use common::{hashes, Server};
use serde_json::{json, Value};

fn worker(id: &str, device: &str) -> Value {
    json!({"id": id, "role": "aggregated", "device": device, "model": "m", "capacity_blocks": 100000})
}

fn route(s: &Server, body: Value) -> Value {
    let (code, d) = s.post("/v1/route", body);
    assert_eq!(code, 200, "route failed: {d}");
    d
}

/// Routes a running request of `n` blocks (hash seed `seed`) pinned to `w` and marks
/// its prefill done, so it counts `n` active decode blocks and no prompt tokens.
fn run_on(s: &Server, id: &str, w: &str, seed: u64, n: usize) {
    route(
        s,
        json!({"request_id": id, "model": "m", "block_hashes": hashes(seed, n), "mode": "direct", "pin": w}),
    );
    let (code, b) = s.post(&format!("/v1/requests/{id}/first_token"), json!({}));
    assert_eq!(code, 200, "{b}");
}

fn decode_blocks(s: &Server, w: &str) -> f64 {
    s.workers()
        .iter()
        .find(|x| x["id"] == w)
        .and_then(|x| x["decode_blocks"].as_f64())
        .unwrap_or(-1.0)
}

fn candidate(d: &Value, w: &str) -> Value {
    d["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|x| x["worker"] == w))
        .cloned()
        .unwrap_or(Value::Null)
}

fn worked_example(cores: usize) -> Value {
    let s = Server::start(cores, &[]);
    for w in ["w1", "w2", "w3"] {
        s.register(worker(w, "gpu"));
    }
    let h = hashes(1, 10);
    s.store("w1", "device", &h[..2]);
    s.store("w2", "device", &h[..5]);
    s.store("w3", "device", &h[..8]);
    s.wait_until("index", |s| {
        s.cached("w3") == 8 && s.cached("w2") == 5 && s.cached("w1") == 2
    });
    // Active decode loads 10 / 5 / 9 blocks, none of them the new request's blocks.
    for (id, w, seed, n) in [("a", "w1", 11, 10), ("b", "w2", 12, 5), ("c", "w3", 13, 9)] {
        run_on(&s, id, w, seed, n);
    }
    s.wait_until("load", |s| {
        decode_blocks(s, "w1") == 10.0
            && decode_blocks(s, "w2") == 5.0
            && decode_blocks(s, "w3") == 9.0
    });
    let d = route(
        &s,
        json!({"request_id": "x", "model": "m", "block_hashes": h, "explain": true}),
    );
    assert_eq!(d["decode_worker"], "w2", "{d}");
    assert_eq!(d["cost"], 20.0, "{d}");
    assert_eq!(d["overlap"]["device"], 5);
    // cost = (10 - cached) + (active + the 10 blocks the request pins).
    for (w, ov, adj, dec, cost) in [
        ("w1", 2, 8.0, 20.0, 28.0),
        ("w2", 5, 5.0, 15.0, 20.0),
        ("w3", 8, 2.0, 19.0, 21.0),
    ] {
        let x = candidate(&d, w);
        assert_eq!(x["prefill_blocks"], 10.0, "{x}");
        assert_eq!(x["overlap"]["device"], ov, "{x}");
        assert_eq!(x["adjusted_prefill"], adj, "{x}");
        assert_eq!(x["decode_blocks"], dec, "{x}");
        assert_eq!(x["cost"], cost, "{x}");
    }
    d
}

/// DESIGN's decode term is the default, through HTTP.
#[test]
fn design_worked_example_default_knobs_cores_1_and_2_agree() {
    let one = worked_example(1);
    let two = worked_example(2);
    assert_eq!(one, two);
}

fn mixed_fleet(cores: usize) -> Value {
    let s = Server::start(cores, &[]);
    s.register(worker("g", "gpu"));
    s.register(worker("c", "cpu"));
    let mut fast = worker("f", "cpu");
    fast["throughput_weight"] = json!(0.5);
    s.register(fast);
    let (_, body) = s.get("/v1/workers");
    assert!(body.contains("\"throughput_weight\":0.5"), "{body}");
    // The GPU worker runs 100 blocks; the CPU workers are idle.
    run_on(&s, "busy", "g", 21, 100);
    s.wait_until("load", |s| decode_blocks(s, "g") == 100.0);
    let d = route(
        &s,
        json!({"request_id": "x", "model": "m", "block_hashes": hashes(2, 10), "explain": true}),
    );
    // g: 10 + 110 = 120; c (8x slower): 8 * 20 = 160; f (declared 0.5): 2 * 20 = 40.
    for (w, cost) in [("g", 120.0), ("c", 160.0), ("f", 40.0)] {
        assert_eq!(candidate(&d, w)["cost"], cost, "{d}");
    }
    assert_eq!(d["decode_worker"], "f", "{d}");
    // Without the declared throughput the busy GPU still beats an idle CPU worker.
    let d2 = route(
        &s,
        json!({"request_id": "y", "model": "m", "block_hashes": hashes(3, 10),
               "explain": true, "allow": ["g", "c"]}),
    );
    assert_eq!(d2["decode_worker"], "g", "{d2}");
    // A bad declared throughput is refused.
    let mut bad = worker("z", "gpu");
    bad["throughput_weight"] = json!(0.0);
    let (code, _) = s.post("/v1/workers", bad);
    assert_eq!(code, 400);
    json!([d, d2])
}

/// `kv` weighs work by device speed and declared throughput.
#[test]
fn mixed_fleet_cost_weighs_by_speed_cores_1_and_2_agree() {
    let one = mixed_fleet(1);
    let two = mixed_fleet(2);
    assert_eq!(one, two);
}

fn disagg_prefill_choice(cores: usize, extra: &[&str]) -> Value {
    let mut flags = vec![
        "--prefill-load-scale",
        "8",
        "--track-prefill-tokens",
        "false",
    ];
    flags.extend_from_slice(extra);
    let s = Server::start(cores, &flags);
    let role =
        |id: &str, r: &str| json!({"id": id, "role": r, "model": "m", "capacity_blocks": 100000});
    s.register(role("p0", "prefill"));
    s.register(role("d0", "decode"));
    // A 40-block prompt in flight on p0 (no first token yet).
    let q = route(
        &s,
        json!({"request_id": "q", "model": "m", "block_hashes": hashes(31, 40)}),
    );
    assert_eq!(q["prefill_worker"], "p0", "{q}");
    s.register(role("p1", "prefill"));
    let h = hashes(4, 10);
    s.store("p0", "device", &h[..8]);
    s.wait_until("index", |s| s.cached("p0") == 8);
    let d = route(
        &s,
        json!({"request_id": "x", "model": "m", "block_hashes": h, "explain": true}),
    );
    d["prefill_worker"].clone()
}

/// Disaggregated fleets: the aggregated tuning (`track_prefill_tokens = false`) no longer
/// makes the prefill stage blind to queued prompts; the old behaviour is per stage.
#[test]
fn prefill_stage_counts_queued_prompts_under_aggregated_tuning() {
    for cores in [1, 2] {
        // p0: 8 * (50 - 8) = 336 > p1: 8 * 10 = 80.
        assert_eq!(disagg_prefill_choice(cores, &[]), "p1");
        let blind = ["--prefill-stage-track-prefill-tokens", "false"];
        assert_eq!(disagg_prefill_choice(cores, &blind), "p0");
    }
}
