//! `kvroute-sim fleet` and `kvroute-sim replay` on their own, through the real binary
//! over loopback: the OpenAI endpoints (streamed and not, `max_tokens`, shapes checked
//! with the `openai` Python client when installed), the NIXL prefill → decode flow,
//! bounds and injected faults, a replay against a worker, and a clean exit on SIGTERM.
//! The fleet with a `kvroute serve` in front is `tests/sim_fleet_router.rs`. Every
//! child process is stopped in `Drop`.

mod common;

use common::fleet::{post, sse_data, words, Fleet, FAST};
use serde_json::{json, Value};
use std::io::Read;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn serves_completions_and_chat_streamed_and_not() {
    let f = Fleet::start(&["--workers", "1", "--events", "none", "--timing", FAST]);
    let (c, b) = post(
        &f.url(0, "/v1/completions"),
        json!({"model": "sim-model", "prompt": "t1 t2 t3", "max_tokens": 5}),
    );
    assert_eq!(c, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(
        v["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        5
    );

    let (c, b) = post(
        &f.url(0, "/v1/chat/completions"),
        json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}),
    );
    assert_eq!(c, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 2);

    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 3], "max_tokens": 4}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "t9"}], "max_tokens": 4}),
        ),
    ] {
        let mut body = body;
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let (c, b) = post(&f.url(0, path), body);
        assert_eq!(c, 200, "{b}");
        let d = sse_data(&b);
        assert_eq!(d.last().map(String::as_str), Some("[DONE]"), "{b}");
        let chunks: Vec<Value> = d[..d.len() - 1]
            .iter()
            .map(|x| serde_json::from_str(x).unwrap())
            .collect();
        let with_text = chunks
            .iter()
            .filter(|c| !c["choices"].as_array().unwrap().is_empty())
            .count();
        assert_eq!(with_text, 4, "{b}");
        assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 4);
        assert_eq!(
            chunks[with_text - 1]["choices"][0]["finish_reason"],
            "length"
        );
    }
    // Without include_usage, no usage chunk.
    let (_, b) = post(
        &f.url(0, "/v1/completions"),
        json!({"prompt": "t1", "max_tokens": 2, "stream": true}),
    );
    assert_eq!(sse_data(&b).len(), 3, "{b}");

    let m: Value = ureq::get(&f.url(0, "/v1/models"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(m["data"][0]["id"], "sim-model");
    assert_eq!(
        ureq::get(&f.url(0, "/health")).call().unwrap().status(),
        200
    );
    assert_eq!(
        post(
            &f.url(0, "/v1/completions"),
            json!({"model": "other", "prompt": "x"})
        )
        .0,
        404
    );
    assert_eq!(
        post(&f.url(0, "/v1/completions"), json!({"max_tokens": 3})).0,
        400
    );
    assert_eq!(
        post(
            &f.url(0, "/v1/completions"),
            json!({"prompt": "x", "max_tokens": -1})
        )
        .0,
        400
    );
    let s = f.stats(0);
    assert_eq!(s["requests"], 5);
    assert_eq!(s["active"], 0);
}

#[test]
fn body_limit_concurrency_limit_and_injected_faults() {
    let f = Fleet::start(&[
        "--workers",
        "2",
        "--events",
        "none",
        "--timing",
        FAST,
        "--max-body-bytes",
        "1000",
        "--max-active",
        "1",
        "--die-after-chunks",
        "2",
        "--fail-rate",
        "1",
        "--faulty",
        "1",
    ]);
    let big = words(0..400);
    assert_eq!(
        post(&f.url(0, "/v1/completions"), json!({"prompt": big})).0,
        413
    );
    // Worker 0: one slot. A long stream holds it while a second request is refused.
    let slow = f.url(0, "/v1/completions");
    let held = std::thread::spawn(move || {
        // 2 ms per token × 15,000 tokens: the slot stays busy for the rest of the
        // test (~30 s even on a stalled machine); stopping the fleet ends it.
        let r = ureq::post(&slow)
            .send_json(json!({"prompt": "t1", "max_tokens": 15000, "stream": true}))
            .unwrap();
        let mut s = String::new();
        let _ = r.into_reader().read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.stats(0)["active"] != 1 {
        assert!(Instant::now() < deadline, "the long stream never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        post(&f.url(0, "/v1/completions"), json!({"prompt": "t1"})).0,
        429
    );
    assert_eq!(f.stats(0)["rejected"], 1);
    // Worker 1: --fail-rate 1 → every generation is a 500.
    assert_eq!(
        post(&f.url(1, "/v1/completions"), json!({"prompt": "t1"})).0,
        500
    );
    // ... and with --fail-rate off, streams die after 2 chunks (no [DONE]).
    drop(f);
    let _ = held.join();
    let f = Fleet::start(&[
        "--workers",
        "1",
        "--events",
        "none",
        "--timing",
        FAST,
        "--die-after-chunks",
        "2",
    ]);
    let r = ureq::post(&f.url(0, "/v1/completions"))
        .send_json(json!({"prompt": "t1", "max_tokens": 10, "stream": true}))
        .unwrap();
    let mut s = String::new();
    let read = r.into_reader().read_to_string(&mut s);
    assert!(
        read.is_err() || !s.contains("[DONE]"),
        "stream did not die: {s}"
    );
    assert_eq!(sse_data(&s).len(), 2, "{s}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.stats(0)["active"] != 0 {
        assert!(
            Instant::now() < deadline,
            "the dead stream's slot was not released"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(f.stats(0)["injected_failures"], 1);
}

#[test]
fn nixl_prefill_then_decode() {
    let f = Fleet::start(&[
        "--workers",
        "2",
        "--prefill-workers",
        "1",
        "--block-size",
        "4",
        "--events",
        "none",
        "--timing",
        FAST,
    ]);
    assert_eq!(
        (f.workers[0].role.as_str(), f.workers[1].role.as_str()),
        ("prefill", "decode")
    );
    let prompt = words(0..40);
    let (c, b) = post(
        &f.url(0, "/v1/completions"),
        json!({"prompt": prompt, "max_tokens": 1, "stream": false,
               "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
                                      "remote_engine_id": null, "remote_block_ids": null,
                                      "remote_host": null, "remote_port": null}}),
    );
    assert_eq!(c, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    let kv = &v["kv_transfer_params"];
    assert_eq!(kv["do_remote_prefill"], true);
    assert_eq!(kv["remote_block_ids"].as_array().unwrap().len(), 10);
    assert_eq!(kv["remote_engine_id"], "sim-0");
    assert_eq!(kv["remote_host"], "127.0.0.1");
    assert!(kv["remote_port"].as_u64().is_some());
    assert_eq!(v["usage"]["completion_tokens"], 1);
    let (c, b) = post(
        &f.url(1, "/v1/completions"),
        json!({"prompt": prompt, "max_tokens": 3, "stream": true, "kv_transfer_params": kv}),
    );
    assert_eq!(c, 200, "{b}");
    assert_eq!(sse_data(&b).len(), 4, "{b}");
    let d = f.stats(1);
    assert_eq!(
        (
            d["transferred_blocks"].as_u64(),
            d["cached_blocks"].as_u64()
        ),
        (Some(10), Some(0))
    );
    assert_eq!(f.stats(0)["prompt_blocks"], 10);
}

#[test]
fn replay_against_a_worker_directly() {
    let f = Fleet::start(&["--workers", "1", "--events", "none", "--timing", FAST]);
    let url = f.workers[0].url.clone();
    let (line, r) = common::sim::run_json(
        "sim_fleet",
        "replay",
        &[
            "replay",
            "--trace",
            common::sim::SLICE,
            "--target",
            &url,
            "--limit",
            "40",
            "--rate",
            "40",
            "--stream",
            "--max-input-tokens",
            "1024",
            "--max-output-tokens",
            "8",
            "--workers-stats",
            &url,
        ],
    );
    assert!(line.contains("40 req, 0 err"), "{line}");
    assert_eq!(r["ok"], 40);
    let ttft = r["ttft_ms"]["p50"].as_f64().unwrap();
    let e2e = r["e2e_ms"]["p50"].as_f64().unwrap();
    assert!(ttft > 0.0 && e2e >= ttft, "{r}");
    assert!(r["itl_ms"]["p50"].as_f64().unwrap() > 0.0, "{r}");
    // Every slice request starts with hash id 0: its blocks hit from the second on.
    let hit = r["hit_rate"].as_f64().unwrap();
    assert!(hit > 0.0 && hit < 1.0, "{r}");
    assert_eq!(r["worker_prompt_blocks"], f.stats(0)["prompt_blocks"]);
    // Chat, non-streamed, new connections.
    let (line, r) = common::sim::run_json(
        "sim_fleet",
        "replay_chat",
        &[
            "replay",
            "--trace",
            common::sim::SLICE,
            "--target",
            &url,
            "--limit",
            "10",
            "--rate",
            "20",
            "--chat",
            "--new-connections",
            "--max-input-tokens",
            "512",
            "--max-output-tokens",
            "4",
        ],
    );
    assert_eq!(r["ok"], 10, "{line}");
    assert_eq!(r["connections"], "new");
}

#[test]
fn openai_python_client_reads_the_shapes() {
    if !common::python_has("openai", "openai") {
        return;
    }
    let f = Fleet::start(&["--workers", "1", "--events", "none", "--timing", FAST]);
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="x")
r = c.completions.create(model="sim-model", prompt="t1 t2", max_tokens=3)
assert r.usage.completion_tokens == 3, r
assert len(r.choices[0].text.split()) == 3
r = c.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 2, r
n = 0; u = None
for ch in c.chat.completions.create(model="sim-model", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=4, stream=True, stream_options={"include_usage": True}):
    if ch.choices and ch.choices[0].delta.content: n += 1
    if ch.usage: u = ch.usage.completion_tokens
assert (n, u) == (4, 4), (n, u)
n = sum(1 for ch in c.completions.create(model="sim-model", prompt="t1", max_tokens=5, stream=True) if ch.choices[0].text)
assert n == 5, n
print("ok")
"#;
    let out = Command::new("python3")
        .args(["-c", script, &f.workers[0].url])
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_stops_the_fleet_cleanly() {
    let mut f = Fleet::start(&["--workers", "3", "--timing", FAST]);
    let url = f.url(2, "/health");
    assert_eq!(ureq::get(&url).call().unwrap().status(), 200);
    assert!(f.stop(), "fleet did not exit 0 on SIGTERM");
    assert!(
        ureq::get(&url)
            .timeout(Duration::from_secs(2))
            .call()
            .is_err(),
        "still serving"
    );
}
