//! Conformance of engine streams with the real publishers of vLLM 0.33.0 and SGLang
//! 0.5.23 (see tests/engine_conformance.rs): batches of another data-parallel rank
//! are refused and said so, an engine that restarted while kvroute was away is
//! detected on the fresh connection, a gap is replayed (or clears the worker without a
//! replay endpoint), and a request's `cache_salt` reaches the same salted blocks
//! through the binary API and the proxy (which forwards it unchanged).

mod common;
#[path = "common/engines.rs"]
mod engines;

use common::proxy::FakeWorker;
use common::Server;
use engines::{flag, prompt, send, stored, stream, sync, tiers, Engines, Ports};
use serde_json::json;
use std::time::{Duration, Instant};

/// A 32-byte digest, as vLLM publishes its default sha256 block hashes.
fn digest(i: u32) -> String {
    format!("0x{i:064x}")
}

fn stored_digests(ids: &[u32], parent: Option<u32>, tokens: &[u32]) -> serde_json::Value {
    json!({"type": "BlockStored", "block_hashes": ids.iter().map(|&i| digest(i)).collect::<Vec<_>>(),
           "parent_block_hash": parent.map(digest), "token_ids": tokens,
           "block_size": engines::BS, "medium": "$MEDIUM_GPU"})
}

#[test]
fn digest_chains_removals_and_gaps_with_and_without_replay() {
    if !engines::available() {
        return;
    }
    let mut e = Engines::new();
    let pr = e.start("r", "vllm", 0, true, None);
    let pn = e.start("n", "vllm", 0, false, None);
    let (fr, fnr) = (flag("wr", pr, ""), flag("wn", pn, ""));
    let s = Server::start(1, &["--block-size", "4", "--engine", &fr, "--engine", &fnr]);
    let (a, c, d) = (prompt(1, 4), prompt(2, 2), prompt(3, 2));
    for (name, w) in [("r", "wr"), ("n", "wn")] {
        sync(&mut e, &s, name, w);
        send(
            &mut e,
            &s,
            name,
            w,
            vec![stored_digests(&[1, 2], None, &a[..8])],
        );
        send(
            &mut e,
            &s,
            name,
            w,
            vec![stored_digests(&[3, 4], Some(2), &a[8..])],
        );
        assert_eq!(
            tiers(&s, &format!("{w}a"), w, &a, json!({})),
            (4, 0, 0),
            "chained"
        );
        let rm = json!({"type": "BlockRemoved", "block_hashes": [digest(3), digest(4)],
                        "medium": "$MEDIUM_GPU"});
        send(&mut e, &s, name, w, vec![rm]);
        assert_eq!(
            tiers(&s, &format!("{w}b"), w, &a, json!({})),
            (2, 0, 0),
            "removed"
        );
        e.publish_lost(name, vec![stored_digests(&[5, 6], None, &c)]);
        send(&mut e, &s, name, w, vec![stored_digests(&[7, 8], None, &d)]);
        assert_eq!(stream(&s, w, "gap"), 1.0);
    }
    // With replay the lost batch comes back; without, the worker is cleared.
    assert_eq!(tiers(&s, "rc", "wr", &c, json!({})), (2, 0, 0));
    assert_eq!(tiers(&s, "ra", "wr", &a, json!({})), (2, 0, 0));
    assert_eq!(
        (stream(&s, "wr", "replay"), stream(&s, "wr", "clear")),
        (1.0, 0.0)
    );
    assert_eq!(tiers(&s, "nc", "wn", &c, json!({})), (0, 0, 0));
    assert_eq!(tiers(&s, "na", "wn", &a, json!({})), (0, 0, 0));
    assert_eq!(stream(&s, "wn", "clear"), 1.0);
    for w in ["wr", "wn"] {
        assert_eq!(tiers(&s, &format!("{w}d"), w, &d, json!({})), (2, 0, 0));
    }
}

#[test]
fn batches_of_another_dp_rank_are_refused_logged_once_and_shown() {
    if !engines::available() {
        return;
    }
    let mut e = Engines::new();
    // Rank 1 of each engine, but the entries say rank 0 (pointed at the wrong port).
    let v = e.start("v", "vllm", 1, false, None);
    let g = e.start("g", "sglang", 1, false, None);
    let ok = e.start("ok", "sglang", 1, false, None);
    let fv = flag("wv", v, "dp_rank=0");
    let fg = flag("wg", g, "dp_rank=0");
    let fo = flag("wo", ok, "dp_rank=1");
    let s = Server::start_logged(
        1,
        &[
            "--block-size",
            "4",
            "--engine",
            &fv,
            "--engine",
            &fg,
            "--engine",
            &fo,
        ],
    );
    for (name, w) in [("v", "wv"), ("g", "wg"), ("ok", "wo")] {
        sync(&mut e, &s, name, w);
    }
    let a = prompt(1, 2);
    for _ in 0..2 {
        for (name, w) in [("v", "wv"), ("g", "wg"), ("ok", "wo")] {
            send(
                &mut e,
                &s,
                name,
                w,
                vec![stored(&[1, 2], None, &a, json!({}))],
            );
        }
    }
    assert_eq!(s.cached("wv"), 0, "vLLM data_parallel_rank 1 refused");
    assert_eq!(s.cached("wg"), 0, "SGLang attn_dp_rank 1 refused");
    assert_eq!(s.cached("wo"), 2, "the right rank is applied");
    assert!(stream(&s, "wv", "dp_rank_mismatch") >= 2.0);
    let issue = |id: &str| {
        s.workers()
            .into_iter()
            .find(|w| w["id"] == id)
            .map(|w| w["engine_issue"].to_string())
            .unwrap_or_default()
    };
    assert!(issue("wv").contains("dp_rank_mismatch"), "{}", issue("wv"));
    assert!(issue("wo").contains("null"), "{}", issue("wo"));
    let lines = |w: &str| {
        s.log()
            .iter()
            .filter(|l| {
                l.contains(&format!("worker \"{w}\"")) && l.contains("base port + its rank")
            })
            .count()
    };
    assert_eq!((lines("wv"), lines("wg")), (1, 1), "{:?}", s.log());
}

/// How many times kvroute subscribed to worker `w`.
fn subscriptions(s: &Server, w: &str) -> usize {
    s.log()
        .iter()
        .filter(|l| l.contains(&format!("worker \"{w}\"")) && l.contains(": subscribed ("))
        .count()
}

/// The engine of worker `w` restarts on the same ports while kvroute is away and
/// publishes its seq 0 (blocks `b`) before kvroute reconnects, then seq 1 (`c`).
fn restart(e: &mut Engines, s: &Server, p: Ports, w: &str, b: &[u32], c: &[u32]) {
    e.stop("e");
    e.start("e", "vllm", 0, p.replay.is_some(), Some(p));
    e.publish("e", vec![stored(&[21, 22], None, b, json!({}))]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while subscriptions(s, w) < 2 {
        assert!(Instant::now() < deadline, "kvroute did not reconnect");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The subscription reaches the PUB socket just after the handshake.
    let before = stream(s, w, "batch");
    let deadline = Instant::now() + Duration::from_secs(10);
    e.publish("e", vec![stored(&[31, 32], None, c, json!({}))]);
    while stream(s, w, "batch") <= before {
        assert!(
            Instant::now() < deadline,
            "nothing received after the restart"
        );
        e.publish("e", vec![]);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn restart_case(replay: bool) {
    let mut e = Engines::new();
    let p = e.start("e", "vllm", 0, replay, None);
    let f = flag("w", p, "");
    let s = Server::start_logged(1, &["--block-size", "4", "--engine", &f]);
    sync(&mut e, &s, "e", "w");
    let (a, b, c) = (prompt(1, 2), prompt(2, 2), prompt(3, 2));
    for _ in 0..5 {
        send(&mut e, &s, "e", "w", vec![]);
    }
    send(
        &mut e,
        &s,
        "e",
        "w",
        vec![stored(&[11, 12], None, &a, json!({}))],
    );
    assert_eq!(tiers(&s, "r0", "w", &a, json!({})), (2, 0, 0));
    restart(&mut e, &s, p, "w", &b, &c);
    s.wait_until("the restart", |s| stream(s, "w", "restart") >= 1.0);
    let want_c = if replay { 4 } else { 2 };
    s.wait_until("the new blocks", |s| s.cached("w") == want_c);
    assert_eq!(
        tiers(&s, "ra", "w", &a, json!({})),
        (0, 0, 0),
        "old blocks cleared"
    );
    let b_blocks = if replay { 2 } else { 0 };
    assert_eq!(
        tiers(&s, "rb", "w", &b, json!({})),
        (b_blocks, 0, 0),
        "seq 0"
    );
    assert_eq!(tiers(&s, "rc", "w", &c, json!({})), (2, 0, 0), "seq 1");
}

#[test]
fn a_restart_while_away_is_detected_and_synced_from_replay() {
    if !engines::available() {
        return;
    }
    restart_case(true);
}

#[test]
fn a_restart_while_away_without_replay_continues_from_the_live_stream() {
    if !engines::available() {
        return;
    }
    restart_case(false);
}

#[test]
fn cache_salt_routes_through_the_binary_api_and_the_proxy_unchanged() {
    if !engines::available() {
        return;
    }
    let mut e = Engines::new();
    let (w0, w1) = (FakeWorker::start("w0", &[]), FakeWorker::start("w1", &[]));
    let p0 = e.start("e0", "vllm", 0, false, None);
    let p1 = e.start("e1", "vllm", 0, false, None);
    let f0 = flag("w0", p0, &format!("url={}", w0.url()));
    let f1 = flag("w1", p1, &format!("url={}", w1.url()));
    let s = Server::start(1, &["--block-size", "4", "--engine", &f0, "--engine", &f1]);
    sync(&mut e, &s, "e0", "w0");
    sync(&mut e, &s, "e1", "w1");
    let a = prompt(1, 4);
    // w0 holds the prompt unsalted, w1 under tenant-a's salt.
    send(
        &mut e,
        &s,
        "e0",
        "w0",
        vec![stored(&[1, 2, 3, 4], None, &a, json!({}))],
    );
    send(
        &mut e,
        &s,
        "e1",
        "w1",
        vec![stored(
            &[1, 2, 3, 4],
            None,
            &a,
            json!({"extra_keys": [["tenant-a"], null, null, null]}),
        )],
    );
    let mut c = kvroute::client::RequestClient::connect(&s.api, "").unwrap();
    let d = c
        .route(&kvroute::engine::RouteRequest {
            request_id: "bin".into(),
            model: Some("m".into()),
            tokens: Some(a.clone()),
            cache_salt: Some("tenant-a".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((d.decode_worker.as_str(), d.overlap.device), ("w1", 4));
    let body = json!({"model": "m", "prompt": a, "max_tokens": 1, "cache_salt": "tenant-a"});
    let r = common::proxy::post(&s, "/v1/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let got = w1.received();
    assert_eq!(got.len(), 1, "routed to the salted copy: {got:?}");
    assert_eq!(
        got[0]["body"]["cache_salt"], "tenant-a",
        "forwarded unchanged"
    );
    let body = json!({"model": "m", "prompt": a, "max_tokens": 1});
    let r = common::proxy::post(&s, "/v1/completions", &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(w0.received().len(), 1, "unsalted: the plain copy");
}
