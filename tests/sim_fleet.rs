//! `kvroute-sim fleet` and `kvroute-sim replay` through the real binaries over
//! loopback: the OpenAI endpoints (streamed and not, `max_tokens`, shapes checked with
//! the `openai` Python client when installed), KV events that a real `kvroute serve`
//! ingests (ZMQ via `--engine`, the binary protocol, HTTP registration), the NIXL
//! prefill → decode flow, bounds and injected faults, a replay against a worker, and a
//! clean exit on SIGTERM. Every child process is stopped in `Drop`.

mod common;

use common::Server;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fast timing so tests do not wait on the model (1 ms prefill base, 2 ms per step).
const FAST: &str = "prefill_base_us=1000,prefill_us_per_token=1,prefill_attention_us=0,decode_step_base_us=2000,decode_us_per_seq=0";

struct SimWorker {
    id: String,
    role: String,
    url: String,
    engine: Option<String>,
}

struct Fleet {
    child: Option<Child>,
    workers: Vec<SimWorker>,
}

impl Fleet {
    fn start(args: &[&str]) -> Fleet {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
            .arg("fleet")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kvroute-sim fleet");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut f = Fleet {
            child: Some(child),
            workers: Vec::new(),
        };
        loop {
            let l = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("fleet did not get ready");
            if l.starts_with("ready:") {
                break;
            }
            if let Some(rest) = l.strip_prefix("worker ") {
                let mut w = SimWorker {
                    id: String::new(),
                    role: String::new(),
                    url: String::new(),
                    engine: None,
                };
                for (i, tok) in rest.split(' ').enumerate() {
                    if i == 0 {
                        w.id = tok.to_string();
                    } else if let Some((k, v)) = tok.split_once('=') {
                        match k {
                            "role" => w.role = v.to_string(),
                            "url" => w.url = v.to_string(),
                            "engine" => w.engine = Some(v.to_string()),
                            _ => {}
                        }
                    }
                }
                f.workers.push(w);
            }
        }
        f
    }

    fn url(&self, i: usize, path: &str) -> String {
        format!("{}{path}", self.workers[i].url)
    }

    fn stats(&self, i: usize) -> Value {
        ureq::get(&self.url(i, "/stats"))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    }

    /// SIGTERM, then waits; returns whether it exited successfully.
    fn stop(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            kvroute::process::terminate(c, Duration::from_secs(10));
        }
    }
}

fn post(url: &str, body: Value) -> (u16, String) {
    match ureq::post(url)
        .timeout(Duration::from_secs(60))
        .send_json(body)
    {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("POST {url}: {e}"),
    }
}

fn words(range: std::ops::Range<u32>) -> String {
    range.map(|i| format!("t{i}")).collect::<Vec<_>>().join(" ")
}

/// The `data:` payloads of an SSE body, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

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
        // 2 ms per token × 1,500 tokens: the slot is busy for ~3 s.
        let r = ureq::post(&slow)
            .send_json(json!({"prompt": "t1", "max_tokens": 1500, "stream": true}))
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
    let _ = held.join();
    assert_eq!(f.stats(0)["rejected"], 1);
    // Worker 1: --fail-rate 1 → every generation is a 500.
    assert_eq!(
        post(&f.url(1, "/v1/completions"), json!({"prompt": "t1"})).0,
        500
    );
    // ... and with --fail-rate off, streams die after 2 chunks (no [DONE]).
    drop(f);
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
        "sim_fleet",
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
    let dir = common::sim::tmp("sim_fleet", "tok");
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
