//! `kvroute-sim fleet` feeding a real `kvroute serve` over loopback: KV events that the
//! router ingests (ZMQ via `--engine`, the binary protocol, HTTP registration), and
//! requests through kvroute's OpenAI proxy that hit at the simulated worker (token ids,
//! and chat text with one tokenizer on both sides). The fleet on its own is
//! `tests/sim_fleet.rs`. Every child process is stopped in `Drop`.

mod common;

use common::fleet::{post, sse_data, words, Fleet, FAST};
use common::Server;
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

/// Sends distinct prompts to worker `i` until the router shows cached blocks for it
/// (a PUB drops what was sent before the subscription arrived); returns the prompt.
fn prompt_until_indexed(f: &Fleet, s: &Server, i: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for k in 0u32.. {
        let toks: Vec<u32> = (0..16).map(|j| 1000 * (k + 1) + j).collect();
        let (c, b) = post(
            &f.url(i, "/v1/completions"),
            json!({"prompt": toks, "max_tokens": 1}),
        );
        assert_eq!(c, 200, "{b}");
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if s.cached(&f.workers[i].id) > 0 {
                return toks;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            Instant::now() < deadline,
            "the router never saw worker {i}'s blocks"
        );
    }
    unreachable!()
}

fn overlap(s: &Server, id: &str, toks: &[u32], worker: &str) -> (String, u64) {
    let (c, d) = s.post(
        "/v1/route",
        json!({"request_id": id, "model": "sim-model", "tokens": toks, "explain": true}),
    );
    assert_eq!(c, 200, "{d}");
    let o = d["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["worker"] == worker)
        .and_then(|c| c["overlap"]["device"].as_u64())
        .unwrap_or(0);
    let _ = s.post(&format!("/v1/requests/{id}/finish"), json!({}));
    (d["decode_worker"].as_str().unwrap_or("").to_string(), o)
}

#[test]
fn zmq_events_are_ingested_by_kvroute_serve() {
    let f = Fleet::start(&["--workers", "2", "--block-size", "4", "--timing", FAST]);
    let e0 = f.workers[0].engine.clone().expect("engine flag");
    let e1 = f.workers[1].engine.clone().expect("engine flag");
    let s = Server::start(2, &["--block-size", "4", "--engine", &e0, "--engine", &e1]);
    let toks = prompt_until_indexed(&f, &s, 1);
    let (best, o) = overlap(&s, "z1", &toks, "sim-1");
    assert_eq!((best.as_str(), o), ("sim-1", 4));
    // A longer continuation of the same prompt: new blocks chained on the old ones.
    let mut more = toks.clone();
    more.extend(5000..5008);
    let (c, _) = post(
        &f.url(1, "/v1/completions"),
        json!({"prompt": more, "max_tokens": 1}),
    );
    assert_eq!(c, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while overlap(&s, "z2", &more, "sim-1").1 != 6 {
        assert!(Instant::now() < deadline, "continuation not indexed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(overlap(&s, "z3", &more, "sim-0").1, 0);
}

#[test]
fn binary_events_and_http_registration_reach_kvroute_serve() {
    let s = Server::start(2, &["--block-size", "4"]);
    let f = Fleet::start(&[
        "--workers",
        "1",
        "--block-size",
        "4",
        "--timing",
        FAST,
        "--events",
        "binary",
        "--router-events",
        &s.events,
        "--id-prefix",
        "bin-",
    ]);
    s.wait_until("bin-0 registered", |s| {
        s.workers().iter().any(|w| w["id"] == "bin-0")
    });
    let toks = prompt_until_indexed(&f, &s, 0);
    assert_eq!(overlap(&s, "b1", &toks, "bin-0").1, 4);
    // --register: the workers appear through POST /v1/workers (ZMQ fleet, no --engine).
    let g = Fleet::start(&[
        "--workers",
        "2",
        "--events",
        "none",
        "--register",
        &s.http,
        "--id-prefix",
        "reg-",
    ]);
    let ids: Vec<String> = s
        .workers()
        .iter()
        .filter_map(|w| w["id"].as_str().map(String::from))
        .collect();
    assert!(
        ids.contains(&"reg-0".to_string()) && ids.contains(&"reg-1".to_string()),
        "{ids:?}"
    );
    drop(g);
}

/// Through kvroute's proxy (ZMQ-fed, `url=` in `--engine`): a long token-id prompt sent
/// twice lands on the same simulated worker, and the second is a hit there; replay
/// through the proxy measures the same way as direct.
#[test]
fn through_the_proxy_a_repeated_prefix_hits_at_the_worker() {
    let f = Fleet::start(&["--workers", "2", "--block-size", "4", "--timing", FAST]);
    let e0 = f.workers[0].engine.clone().expect("engine flag");
    let e1 = f.workers[1].engine.clone().expect("engine flag");
    assert!(e0.contains("url=http://127.0.0.1:"), "{e0}");
    let s = Server::start(2, &["--block-size", "4", "--engine", &e0, "--engine", &e1]);
    // Wait until both subscriptions carry events (a PUB drops earlier ones).
    prompt_until_indexed(&f, &s, 0);
    prompt_until_indexed(&f, &s, 1);
    let proxy = format!("http://{}/v1/completions", s.proxy);
    let toks: Vec<u32> = (0..64).map(|i| 70_000 + i).collect();
    let (c, b) = post(
        &proxy,
        json!({"model": "sim-model", "prompt": toks, "max_tokens": 2}),
    );
    assert_eq!(c, 200, "{b}");
    let before: Vec<u64> = (0..2)
        .map(|i| f.stats(i)["cached_blocks"].as_u64().unwrap())
        .collect();
    let first: Vec<u64> = (0..2)
        .map(|i| f.stats(i)["prompt_blocks"].as_u64().unwrap())
        .collect();
    let w = if first[0] > first[1] {
        "sim-0"
    } else {
        "sim-1"
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.cached(w) < 16 + 4 {
        assert!(
            Instant::now() < deadline,
            "the first request's blocks never reached the router"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (c, b) = post(
        &proxy,
        json!({"model": "sim-model", "prompt": toks, "max_tokens": 2, "stream": true}),
    );
    assert_eq!(c, 200, "{b}");
    assert_eq!(
        sse_data(&b).last().map(String::as_str),
        Some("[DONE]"),
        "{b}"
    );
    let i = if w == "sim-0" { 0 } else { 1 };
    let hit = f.stats(i)["cached_blocks"].as_u64().unwrap() - before[i];
    assert_eq!(hit, 16, "second request was not a full hit on {w}");
    let (line, r) = common::sim::run_json(
        "sim_fleet_router",
        "replay_proxy",
        &[
            "replay",
            "--trace",
            common::sim::SLICE,
            "--target",
            &format!("http://{}", s.proxy),
            "--limit",
            "20",
            "--rate",
            "20",
            "--stream",
            "--token-ids",
            "--max-input-tokens",
            "256",
            "--max-output-tokens",
            "4",
            "--trace-block",
            "16",
            "--workers-stats",
            &format!("{},{}", f.workers[0].url, f.workers[1].url),
        ],
    );
    assert_eq!(r["ok"], 20, "{line}");
    assert!(r["hit_rate"].as_f64().unwrap() > 0.0, "{line}");
}

/// Text through the proxy with one tokenizer on both sides (`kvroute-sim tokenizer`,
/// fleet `--tokenizer`, `kvroute serve --tokenizer`): a long chat prompt sent twice is
/// a full hit at the worker that served it first.
#[test]
fn with_a_shared_tokenizer_a_repeated_chat_prompt_hits_through_the_proxy() {
    let dir = common::sim::tmp("sim_fleet_router", "tok");
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["tokenizer", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = dir.to_str().unwrap();
    let f = Fleet::start(&[
        "--workers",
        "2",
        "--block-size",
        "4",
        "--timing",
        FAST,
        "--tokenizer",
        d,
    ]);
    let e0 = f.workers[0].engine.clone().unwrap();
    let e1 = f.workers[1].engine.clone().unwrap();
    let tok = format!("sim-model={d}");
    let s = Server::start(
        2,
        &[
            "--block-size",
            "4",
            "--engine",
            &e0,
            "--engine",
            &e1,
            "--tokenizer",
            &tok,
        ],
    );
    prompt_until_indexed(&f, &s, 0);
    prompt_until_indexed(&f, &s, 1);
    let chat = format!("http://{}/v1/chat/completions", s.proxy);
    let body = json!({"model": "sim-model", "max_tokens": 2, "stream": true,
                      "messages": [{"role": "user", "content": words(100..180)}]});
    let (c, b) = post(&chat, body.clone());
    assert_eq!(c, 200, "{b}");
    let reqs: Vec<u64> = (0..2)
        .map(|i| f.stats(i)["requests"].as_u64().unwrap())
        .collect();
    let cached: Vec<u64> = (0..2)
        .map(|i| f.stats(i)["cached_blocks"].as_u64().unwrap())
        .collect();
    let blocks: Vec<u64> = (0..2)
        .map(|i| f.stats(i)["prompt_blocks"].as_u64().unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.cached("sim-0") + s.cached("sim-1") < 8 + 20 {
        assert!(
            Instant::now() < deadline,
            "the chat prompt's blocks never reached the router"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (c, b) = post(&chat, body);
    assert_eq!(c, 200, "{b}");
    let i = (0..2)
        .find(|&i| f.stats(i)["requests"].as_u64().unwrap() > reqs[i])
        .unwrap();
    let hit = f.stats(i)["cached_blocks"].as_u64().unwrap() - cached[i];
    let new_blocks = f.stats(i)["prompt_blocks"].as_u64().unwrap() - blocks[i];
    assert!(new_blocks >= 20, "prompt of {new_blocks} blocks");
    assert_eq!(
        hit, new_blocks,
        "the second chat request was not a full hit on worker {i}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_fleet_that_wants_an_api_key_is_served_once_kvroute_sends_it() {
    let f = Fleet::start(&[
        "--workers",
        "1",
        "--block-size",
        "4",
        "--timing",
        FAST,
        "--api-key",
        "sk-fleet",
    ]);
    let e0 = f.workers[0].engine.clone().expect("engine flag");
    let body = json!({"model": "sim-model", "prompt": [1, 2, 3, 4, 5], "max_tokens": 2});
    // The worker alone answers as vLLM's `--api-key` does; /health stays open.
    let (c, b) = post(&f.url(0, "/v1/completions"), body.clone());
    assert_eq!((c, b.as_str()), (401, r#"{"error":"Unauthorized"}"#));
    assert_eq!(
        ureq::get(&f.url(0, "/health"))
            .call()
            .map(|r| r.status())
            .ok(),
        Some(200)
    );
    // kvroute without the key: the worker's 401 reaches the client unchanged, and a
    // refusal is no failure: the worker's breaker stays closed.
    let s = Server::start(1, &["--block-size", "4", "--engine", &e0]);
    let proxy = format!("http://{}/v1/completions", s.proxy);
    for _ in 0..3 {
        let (c, b) = post(&proxy, body.clone());
        assert_eq!((c, b.as_str()), (401, r#"{"error":"Unauthorized"}"#));
    }
    assert_eq!(
        s.metric("kvroute_proxy_breaker_open{worker=\"sim-0\"}"),
        0.0
    );
    drop(s);
    // With it (flag), the request is served.
    let s = Server::start(
        1,
        &[
            "--block-size",
            "4",
            "--engine",
            &e0,
            "--proxy-upstream-api-key",
            "sk-fleet",
        ],
    );
    let (c, b) = post(&format!("http://{}/v1/completions", s.proxy), body);
    assert_eq!(c, 200, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}
