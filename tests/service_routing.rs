//! End-to-end routing through the running service over HTTP: the DESIGN worked example
//! with explain, tiers, every mode and filter, disaggregation with topology and every
//! fallback. Each scenario runs with `--cores 1`, `--cores 2` and `--cores 2
//! --index-layout replicated`, and must agree.

mod common;
use common::{hashes, Server};
use serde_json::{json, Value};

/// A server with `cores` executors; `replicated`: `--index-layout replicated`.
fn start(cores: usize, replicated: bool, extra: &[&str]) -> Server {
    let mut args = extra.to_vec();
    if replicated {
        args.extend(["--index-layout", "replicated"]);
    }
    Server::start(cores, &args)
}

fn worker(id: &str) -> Value {
    json!({"id": id, "role": "aggregated", "device": "gpu", "model": "m", "capacity_blocks": 100000})
}

fn route(s: &Server, body: Value) -> Value {
    let (code, d) = s.post("/v1/route", body);
    assert_eq!(code, 200, "route failed: {d}");
    d
}

fn finish(s: &Server, id: &str) {
    let (code, b) = s.post(&format!("/v1/requests/{id}/finish"), json!({}));
    assert_eq!(code, 200, "{b}");
}

fn worked_example(cores: usize, replicated: bool) -> Value {
    // The pre-issue-15 decode term (device overlap counted as held), reached through
    // its opt-in flag; the default form is tests/routing_quality.rs.
    let s = start(cores, replicated, &["--assume-device-reuse", "true"]);
    for w in ["w1", "w2", "w3"] {
        s.register(worker(w));
    }
    let h = hashes(1, 10);
    s.store("w1", "device", &h[..2]);
    s.store("w2", "device", &h[..5]);
    s.store("w3", "device", &h[..8]);
    s.wait_until("index", |s| {
        s.cached("w3") == 8 && s.cached("w2") == 5 && s.cached("w1") == 2
    });
    // Running requests give w1 2 and w3 7 active blocks (prefill done).
    for (id, w, n) in [("a", "w1", 2), ("b", "w3", 7)] {
        route(
            &s,
            json!({"request_id": id, "model": "m", "block_hashes": &h[..n], "mode": "direct", "pin": w}),
        );
        let (code, _) = s.post(&format!("/v1/requests/{id}/first_token"), json!({}));
        assert_eq!(code, 200);
    }
    s.wait_until("load", |s| {
        s.workers()
            .iter()
            .any(|w| w["id"] == "w3" && w["decode_blocks"] == 7.0)
    });
    let d = route(
        &s,
        json!({"request_id": "x", "model": "m", "block_hashes": h, "explain": true}),
    );
    assert_eq!(d["decode_worker"], "w2", "{d}");
    assert_eq!(d["cost"], 10.0);
    assert_eq!(d["fallback"], "none");
    assert_eq!(d["overlap"]["device"], 5);
    let c = d["candidates"].as_array().unwrap();
    let by = |w: &str| c.iter().find(|x| x["worker"] == w).unwrap().clone();
    for (w, ov, adj, dec, cost) in [
        ("w1", 2, 8.0, 10.0, 18.0),
        ("w2", 5, 5.0, 5.0, 10.0),
        ("w3", 8, 2.0, 9.0, 11.0),
    ] {
        let x = by(w);
        assert_eq!(x["prefill_blocks"], 10.0, "{x}");
        assert_eq!(x["overlap"]["device"], ov, "{x}");
        assert_eq!(x["adjusted_prefill"], adj, "{x}");
        assert_eq!(x["decode_blocks"], dec, "{x}");
        assert_eq!(x["cost"], cost, "{x}");
    }
    // Lifecycle: finishing releases load; unknown ids are 404.
    finish(&s, "x");
    let (code, _) = s.post("/v1/requests/x/finish", json!({}));
    assert_eq!(code, 404);
    d
}

#[test]
fn worked_example_cores_1_and_2_agree() {
    let one = worked_example(1, false);
    let two = worked_example(2, false);
    assert_eq!(one, two);
    // Every core holding the whole index: the same decision, and the cached-block
    // figures (`s.cached`, the board) are not counted once per copy.
    assert_eq!(one, worked_example(2, true));
}

fn tiers(cores: usize, replicated: bool) -> Vec<Value> {
    let s = start(cores, replicated, &[]);
    s.register(json!({"id": "shared-store", "role": "shared", "model": "m"}));
    for w in ["a", "b"] {
        s.register(worker(w));
    }
    let h = hashes(2, 12);
    s.store("a", "device", &h[..2]);
    s.store("a", "host", &h[2..5]);
    s.store("a", "disk", &h[5..6]);
    s.store("shared-store", "device", &h[..9]);
    s.wait_until("index", |s| {
        s.cached("a") == 6 && s.cached("shared-store") == 9
    });
    let d = route(
        &s,
        json!({"request_id": "t", "model": "m", "block_hashes": h, "explain": true}),
    );
    let c = d["candidates"].as_array().unwrap().clone();
    let a = c.iter().find(|x| x["worker"] == "a").unwrap();
    assert_eq!(
        a["overlap"],
        json!({"device": 2, "host": 3, "disk": 1, "shared": 3})
    );
    // 12 - 2 - 0.75*3 - 0.25*1 - 0.5*3 = 6.0
    assert_eq!(a["adjusted_prefill"], 6.0);
    let b = c.iter().find(|x| x["worker"] == "b").unwrap();
    assert_eq!(
        b["overlap"],
        json!({"device": 0, "host": 0, "disk": 0, "shared": 9})
    );
    assert!(
        c.iter().all(|x| x["worker"] != "shared-store"),
        "shared store is never a candidate"
    );
    assert_eq!(d["decode_worker"], "a");
    c
}

#[test]
fn tiers_and_shared_cache() {
    let one = tiers(1, false);
    assert_eq!(one, tiers(2, false));
    assert_eq!(one, tiers(2, true));
}

fn modes_and_filters(cores: usize, replicated: bool) {
    let s = start(cores, replicated, &["--cuda-to-cpu-ratio", "4"]);
    s.register(json!({"id": "g1", "model": "m", "device": "gpu", "dp_ranks": {"lo": 0, "hi": 1}}));
    s.register(json!({"id": "g2", "model": "m", "device": "gpu", "dp_ranks": {"lo": 2, "hi": 3}, "taints": ["canary"]}));
    s.register(json!({"id": "c1", "model": "m", "device": "cpu"}));
    s.register(json!({"id": "other", "model": "n"}));
    let h = hashes(3, 4);
    // model filter: only "other" serves model n.
    for i in 0..5 {
        let d = route(
            &s,
            json!({"request_id": format!("n{i}"), "model": "n", "block_hashes": h}),
        );
        assert_eq!(d["decode_worker"], "other");
        finish(&s, &format!("n{i}"));
    }
    // allow-list
    let d = route(
        &s,
        json!({"request_id": "al", "model": "m", "block_hashes": h, "allow": ["c1"]}),
    );
    assert_eq!(d["decode_worker"], "c1");
    finish(&s, "al");
    // pin + direct
    let d = route(
        &s,
        json!({"request_id": "dr", "model": "m", "block_hashes": h, "mode": "direct", "pin": "g1"}),
    );
    assert_eq!(d["decode_worker"], "g1");
    finish(&s, "dr");
    let (code, e) = s.post(
        "/v1/route",
        json!({"request_id": "dr2", "model": "m", "block_hashes": h, "mode": "direct"}),
    );
    assert_eq!(code, 400, "{e}");
    // dp rank bounds pick the worker and report the rank
    let d = route(
        &s,
        json!({"request_id": "dp", "model": "m", "block_hashes": h, "dp_rank": 3, "tolerations": ["canary"]}),
    );
    assert_eq!(
        (d["decode_worker"].as_str(), d["dp_rank"].as_u64()),
        (Some("g2"), Some(3))
    );
    finish(&s, "dp");
    // taints: g2 only with toleration
    for i in 0..20 {
        let d = route(
            &s,
            json!({"request_id": format!("t{i}"), "model": "m", "block_hashes": h, "mode": "random"}),
        );
        assert_ne!(d["decode_worker"], "g2");
        finish(&s, &format!("t{i}"));
    }
    // round-robin cycles over the eligible workers
    let mut seen = Vec::new();
    for i in 0..4 {
        let d = route(
            &s,
            json!({"request_id": format!("rr{i}"), "model": "m", "block_hashes": h, "mode": "round-robin", "tolerations": ["canary"]}),
        );
        seen.push(d["decode_worker"].as_str().unwrap().to_string());
        finish(&s, &format!("rr{i}"));
    }
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen.len(),
        3,
        "round robin reaches every eligible worker: {seen:?}"
    );
    // least-loaded: load g1 with two requests → next goes elsewhere
    for i in 0..2 {
        route(
            &s,
            json!({"request_id": format!("ll{i}"), "model": "m", "block_hashes": h, "mode": "direct", "pin": "g1"}),
        );
    }
    s.wait_until("load", |s| {
        s.workers()
            .iter()
            .any(|w| w["id"] == "g1" && w["active_requests"] == 2)
    });
    let d = route(
        &s,
        json!({"request_id": "ll", "model": "m", "block_hashes": h, "mode": "least-loaded", "allow": ["g1", "c1"]}),
    );
    assert_eq!(d["decode_worker"], "c1");
    finish(&s, "ll");
    // device-aware-weighted: GPU group g1 has 2 in flight over 1 instance × 4 = 0.5,
    // CPU group 0 → CPU wins once; after 1 on c1 (1.0 > 0.5) GPU wins.
    let d = route(
        &s,
        json!({"request_id": "dw1", "model": "m", "block_hashes": h, "mode": "device-aware-weighted", "allow": ["g1", "c1"]}),
    );
    assert_eq!(d["decode_worker"], "c1");
    s.wait_until("load", |s| {
        s.workers()
            .iter()
            .any(|w| w["id"] == "c1" && w["active_requests"] == 1)
    });
    let d = route(
        &s,
        json!({"request_id": "dw2", "model": "m", "block_hashes": h, "mode": "device-aware-weighted", "allow": ["g1", "c1"]}),
    );
    assert_eq!(d["decode_worker"], "g1");
    // unknown model, unknown pin → no eligible worker (503)
    let (code, _) = s.post(
        "/v1/route",
        json!({"request_id": "u1", "model": "zzz", "block_hashes": h}),
    );
    assert_eq!(code, 503);
    let (code, _) = s.post(
        "/v1/route",
        json!({"request_id": "u2", "model": "m", "block_hashes": h, "pin": "nope"}),
    );
    assert_eq!(code, 503);
    // duplicate active request id → 409
    let (code, _) = s.post(
        "/v1/route",
        json!({"request_id": "dw2", "model": "m", "block_hashes": h}),
    );
    assert_eq!(code, 409);
}

#[test]
fn modes_and_filters_cores_1() {
    modes_and_filters(1, false);
}

#[test]
fn modes_and_filters_cores_2() {
    modes_and_filters(2, false);
}

#[test]
fn modes_and_filters_cores_2_replicated() {
    modes_and_filters(2, true);
}

fn disagg(cores: usize, policy: &str, replicated: bool) -> Vec<Value> {
    let s = start(cores, replicated, &["--topology-policy", policy]);
    s.register(json!({"id": "p1", "role": "prefill", "model": "m", "topology": "zoneA"}));
    s.register(json!({"id": "d1", "role": "decode", "model": "m", "topology": "zoneA"}));
    s.register(json!({"id": "d2", "role": "decode", "model": "m", "topology": "zoneB"}));
    let h = hashes(4, 8);
    s.store("p1", "device", &h[..6]);
    s.wait_until("index", |s| s.cached("p1") == 6);
    // load d1 so that without topology d2 would win
    for i in 0..3 {
        route(
            &s,
            json!({"request_id": format!("load{i}"), "model": "m", "block_hashes": hashes(10 + i, 8), "pin": "d1"}),
        );
    }
    s.wait_until("load", |s| {
        s.workers()
            .iter()
            .any(|w| w["id"] == "d1" && w["active_requests"] == 3)
    });
    let mut out = Vec::new();
    let d = route(
        &s,
        json!({"request_id": "r", "model": "m", "block_hashes": h, "explain": true}),
    );
    assert_eq!(d["prefill_worker"], "p1");
    assert_eq!(d["overlap"]["device"], 6);
    assert_eq!(d["fallback"], "none");
    let stages: Vec<&str> = d["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["stage"].as_str().unwrap())
        .collect();
    assert!(stages.contains(&"prefill") && stages.contains(&"decode"));
    let decode_cands: Vec<&Value> = d["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["stage"] == "decode")
        .collect();
    assert!(
        decode_cands
            .iter()
            .all(|c| c["adjusted_prefill"] == 0.0 || c["overlap"]["device"] == 0),
        "decode stage gives no overlap credit"
    );
    match policy {
        "restrict" => assert_eq!(
            d["decode_worker"], "d1",
            "restrict keeps the prefill worker's domain"
        ),
        "none" => assert_eq!(
            d["decode_worker"], "d2",
            "without topology the idle decode worker wins"
        ),
        _ => {}
    }
    out.push(json!({"decode": d["decode_worker"], "prefill": d["prefill_worker"]}));
    // prefill failed → decode-only decision, fallback says so
    let (code, f) = s.post("/v1/requests/r/prefill_failed", json!({}));
    assert_eq!(code, 200, "{f}");
    assert_eq!(f["fallback"], "prefill_failed");
    assert_eq!(f["prefill_worker"], Value::Null);
    finish(&s, "r");
    // all prefill workers filtered out
    let d = route(
        &s,
        json!({"request_id": "f", "model": "m", "block_hashes": h, "allow": ["d1", "d2"]}),
    );
    assert_eq!(d["fallback"], "prefill_filtered_out");
    assert_eq!(d["prefill_worker"], Value::Null);
    finish(&s, "f");
    // prefill pool empty
    let (code, _) = s.delete("/v1/workers/p1");
    assert_eq!(code, 200);
    let d = route(
        &s,
        json!({"request_id": "e", "model": "m", "block_hashes": h}),
    );
    assert_eq!(d["fallback"], "no_prefill_workers");
    out.push(json!({"fallbacks": "ok"}));
    out
}

#[test]
fn disaggregated_restrict() {
    let one = disagg(1, "restrict", false);
    assert_eq!(one, disagg(2, "restrict", false));
    assert_eq!(one, disagg(2, "restrict", true));
}

#[test]
fn disaggregated_no_topology_and_prefer() {
    assert_eq!(disagg(1, "none", false), disagg(2, "none", false));
    let d = disagg(2, "prefer", false);
    assert_eq!(d[0]["prefill"], "p1");
}

#[test]
fn bad_http_input_gets_4xx_json_errors() {
    let s = Server::start(1, &["--max-body-bytes", "2048"]);
    let (code, e) = s.post_raw("/v1/route", "{not json");
    assert_eq!(code, 400);
    assert!(e["error"].as_str().unwrap().contains("JSON"));
    let (code, _) = s.post_raw(
        "/v1/route",
        &format!(
            "{{\"request_id\":\"a\",\"tokens\":[{}]}}",
            vec!["1"; 4000].join(",")
        ),
    );
    assert_eq!(code, 413);
    let (code, _) = s.post("/v1/route", json!({"request_id": "a"}));
    assert_eq!(code, 400);
    let (code, _) = s.post(
        "/v1/route",
        json!({"request_id": "a", "block_hashes": [1], "bogus": 1}),
    );
    assert_eq!(code, 400);
    let (code, _) = s.post("/v1/workers", json!({"id": "bad id"}));
    assert_eq!(code, 400);
    let (code, _) = s.post(
        "/v1/workers/nope/events",
        json!({"events": [{"type": "cleared"}]}),
    );
    assert_eq!(code, 404);
    let (code, _) = s.delete("/v1/workers/nope");
    assert_eq!(code, 404);
    let (code, _) = s.post("/v1/requests/nope/first_token", json!({}));
    assert_eq!(code, 404);
    let (code, _) = s.get("/v1/nothing");
    assert_eq!(code, 404);
    // Still healthy and routing afterwards.
    s.register(worker("w"));
    let d = route(
        &s,
        json!({"request_id": "ok", "model": "m", "tokens": (0..300).collect::<Vec<u32>>()}),
    );
    assert_eq!(d["decode_worker"], "w");
}

/// A JSON body larger than one index batch (several events, one of 3,000 hashes, a
/// removal and a clear of another tier) is cut into batches and applied whole, in
/// order, on every shard.
fn large_json_event_bodies(cores: usize) {
    let s = Server::start(cores, &[]);
    s.register(worker("big"));
    let h = hashes(77, 6000);
    s.store("big", "host", &h[5000..]);
    let (code, body) = s.post(
        "/v1/workers/big/events",
        json!({"events": [
            {"type": "stored", "tier": "device", "parent": null, "block_hashes": &h[..3000]},
            {"type": "stored", "tier": "device", "parent": null, "block_hashes": &h[3000..5500]},
            {"type": "removed", "tier": "device", "block_hashes": &h[5000..5500]},
            {"type": "cleared", "tier": "host"},
        ]}),
    );
    assert_eq!(code, 200, "{body}");
    s.wait_until("index", |s| s.cached("big") == 5000);
    let d = route(
        &s,
        json!({"request_id": "big", "model": "m", "block_hashes": &h[..5200], "explain": true}),
    );
    assert_eq!(d["decode_worker"], "big", "{d}");
    assert_eq!(d["overlap"]["device"], 5000, "{d}");
    assert_eq!(d["overlap"]["host"], 0, "{d}");
}

#[test]
fn large_json_event_bodies_are_cut_into_batches() {
    large_json_event_bodies(1);
    large_json_event_bodies(2);
}
