//! Anthropic Messages, OpenAI Responses and the pass-through endpoints through the
//! real `kvroute serve` proxy in front of a `kvroute-sim fleet` that wants an API key
//! (vLLM's `--api-key`) and shares the router's tokenizer:
//! - the official `anthropic` and `openai` clients, streamed and not, with their own
//!   key headers (`x-api-key` / bearer); the proxy's errors reach them in each API's
//!   shape; a `previous_response_id` follow-up reaches the worker that stored it;
//! - the same long conversation sent twice, as Messages and as Responses, lands on
//!   the same worker as a full cache hit there (the prompt the router tokenized is the
//!   one the engine rendered);
//! - `/v1/embeddings`, `/tokenize`, `/detokenize` are routed to a worker and counted;
//! - a client that leaves a Messages stream releases its load;
//! - once the worker holding a response is removed, a follow-up is the engine's 404,
//!   not a request sent to a worker that cannot hold it.

mod common;

use common::fleet::{words, Fleet, FAST};
use common::Server;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

const CLIENT_KEY: &str = "ck-agents";
const FLEET_KEY: &str = "sk-fleet";

/// POST with one header; (status, `x-kvroute-worker`, body).
fn call(url: &str, header: (&str, &str), body: &Value) -> (u16, String, String) {
    let r = ureq::post(url)
        .timeout(Duration::from_secs(60))
        .set(header.0, header.1)
        .send_json(body.clone());
    let r = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let w = r.header("x-kvroute-worker").unwrap_or("").to_string();
    (r.status(), w, r.into_string().unwrap_or_default())
}

fn bearer() -> String {
    format!("Bearer {CLIENT_KEY}")
}

/// Sends a prompt straight to worker `i` until the router indexed its blocks.
fn index_worker(f: &Fleet, s: &Server, i: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let auth = format!("Bearer {FLEET_KEY}");
    for k in 0u32.. {
        let toks: Vec<u32> = (0..16).map(|j| 1000 * (k + 1) + j).collect();
        let body = json!({"model": "sim-model", "prompt": toks, "max_tokens": 1});
        let (c, _, b) = call(
            &f.url(i, "/v1/completions"),
            ("authorization", &auth),
            &body,
        );
        assert_eq!(c, 200, "{b}");
        let until = Instant::now() + Duration::from_millis(500);
        while Instant::now() < until {
            if s.cached(&f.workers[i].id) > 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(Instant::now() < deadline, "worker {i} never indexed");
    }
}

fn fleet_totals(f: &Fleet) -> Vec<(u64, u64)> {
    (0..f.workers.len())
        .map(|i| {
            let s = f.stats(i);
            let n = |k: &str| s[k].as_u64().unwrap();
            (n("prompt_blocks"), n("cached_blocks"))
        })
        .collect()
}

/// Sends `body` to `path` twice (the second once the router indexed the first):
/// both on one worker, the second a full hit there.
fn repeated_is_a_hit(f: &Fleet, s: &Server, path: &str, body: &Value) -> String {
    let url = format!("http://{}{path}", s.proxy);
    let key = ("x-api-key", CLIENT_KEY);
    let before = s.cached(&f.workers[0].id) + s.cached(&f.workers[1].id);
    let (c, w1, b) = call(&url, key, body);
    assert_eq!(c, 200, "{path}: {b}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.cached(&f.workers[0].id) + s.cached(&f.workers[1].id) < before + 20 {
        assert!(Instant::now() < deadline, "{path}: blocks never indexed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = fleet_totals(f);
    let (c, w2, b) = call(&url, key, body);
    assert_eq!(c, 200, "{path}: {b}");
    assert_eq!(w1, w2, "{path}: the repeat went elsewhere");
    let i = f.workers.iter().position(|w| w.id == w2).unwrap();
    let t1 = fleet_totals(f);
    let (blocks, hit) = (t1[i].0 - t0[i].0, t1[i].1 - t0[i].1);
    assert!(blocks >= 20, "{path}: {blocks} blocks");
    assert_eq!(hit, blocks, "{path}: the repeat was not a full hit on {w2}");
    eprintln!("{path}: the repeat went to {w2}, {hit} of its {blocks} blocks cached there");
    b
}

#[test]
fn agent_apis_route_by_their_rendered_prompt_through_the_proxy() {
    let dir = common::sim::tmp("proxy_agents", "tok");
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["tokenizer", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
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
        "--api-key",
        FLEET_KEY,
    ]);
    let (e0, e1) = (
        f.workers[0].engine.clone().unwrap(),
        f.workers[1].engine.clone().unwrap(),
    );
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
            "--proxy-api-keys",
            CLIENT_KEY,
            "--proxy-upstream-api-key",
            FLEET_KEY,
        ],
    );
    index_worker(&f, &s, 0);
    index_worker(&f, &s, 1);
    let base = format!("http://{}", s.proxy);

    // The official clients.
    let r = common::py_client(
        "proxy_agent_clients.py",
        &[&base, CLIENT_KEY, "sim-model", "t1 t2 t3 t4"],
    );
    let m = &r["messages"];
    assert!(
        m["worker"].as_str().is_some_and(|w| w.starts_with("sim-")),
        "{r}"
    );
    assert_eq!(
        (m["stop_reason"].as_str(), m["output_tokens"].as_u64()),
        (Some("max_tokens"), Some(4)),
        "{r}"
    );
    let ev = r["messages_stream"]["events"].as_array().unwrap();
    assert_eq!(
        (ev.first().unwrap(), ev.last().unwrap()),
        (&json!("message_start"), &json!("message_stop")),
        "{r}"
    );
    assert_eq!(r["messages_stream"]["output_tokens"], 3, "{r}");
    // The proxy's own refusals, in Anthropic's shape.
    let bad = &r["messages_bad"];
    assert_eq!(
        (bad["status"].as_u64(), bad["body"]["type"].as_str()),
        (Some(400), Some("error")),
        "{r}"
    );
    assert_eq!(bad["body"]["error"]["type"], "invalid_request_error", "{r}");
    let un = &r["messages_unauthorized"];
    assert_eq!(
        (un["status"].as_u64(), un["body"]["error"]["type"].as_str()),
        (Some(401), Some("authentication_error")),
        "{r}"
    );
    // The follow-up went to the worker holding the response, which rendered its history.
    let (first, fu) = (&r["responses"], &r["follow_up"]);
    assert_eq!(first["worker"], fu["worker"], "{r}");
    assert!(
        fu["input_tokens"].as_u64() > first["input_tokens"].as_u64(),
        "{r}"
    );
    let ev = r["responses_stream"]["events"].as_array().unwrap();
    assert_eq!(
        (ev.first().unwrap(), ev.last().unwrap()),
        (&json!("response.created"), &json!("response.completed")),
        "{r}"
    );
    assert_eq!(r["responses_stream"]["output_tokens"], 3, "{r}");
    assert_eq!(r["embeddings"]["n"], 2, "{r}");
    assert!(r["embeddings"]["worker"].as_str().is_some(), "{r}");

    // A long conversation sent twice is a full hit on the worker that served it.
    let sys = words(0..60);
    let msgs = json!({"model": "sim-model", "max_tokens": 1, "system": sys,
        "messages": [{"role": "user", "content": words(60..100)},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"p": 1}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": words(100..120)}]}]});
    repeated_is_a_hit(&f, &s, "/v1/messages", &msgs);
    let resp = json!({"model": "sim-model", "max_output_tokens": 1, "instructions": words(200..260),
        "input": [{"role": "user", "content": words(260..300)}]});
    let stored: Value =
        serde_json::from_str(&repeated_is_a_hit(&f, &s, "/v1/responses", &resp)).unwrap();

    // Pass-through endpoints: routed to a worker, counted, load released.
    let auth = bearer();
    let (c, w, b) = call(
        &format!("{base}/tokenize"),
        ("authorization", &auth),
        &json!({"model": "sim-model", "prompt": "t5 t6 t7"}),
    );
    assert_eq!(c, 200, "{b}");
    assert!(w.starts_with("sim-"), "{w}");
    let ids = serde_json::from_str::<Value>(&b).unwrap()["tokens"].clone();
    let (c, _, b) = call(
        &format!("{base}/detokenize"),
        ("authorization", &auth),
        &json!({"model": "sim-model", "tokens": ids}),
    );
    assert_eq!(c, 200, "{b}");
    assert!(b.contains("t5 t6 t7"), "{b}");
    let (c, _, _) = call(
        &format!("{base}/tokenize"),
        ("authorization", "Bearer wrong"),
        &json!({"model": "sim-model", "prompt": "x"}),
    );
    assert_eq!(c, 401);
    assert_eq!(s.metric("kvroute_active_requests "), 0.0);

    // A client that leaves a Messages stream releases its load.
    let mut conn = std::net::TcpStream::connect(&s.proxy).unwrap();
    let b = json!({"model": "sim-model", "max_tokens": 2000, "stream": true,
        "messages": [{"role": "user", "content": "t1"}]})
    .to_string();
    write!(conn, "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {CLIENT_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}", b.len()).unwrap();
    let (mut buf, mut got) = ([0u8; 4096], String::new());
    while !got.contains("content_block_delta") {
        let k = conn.read(&mut buf).unwrap();
        assert!(k > 0, "{got}");
        got.push_str(&String::from_utf8_lossy(&buf[..k]));
    }
    assert_eq!(s.metric("kvroute_active_requests "), 1.0);
    drop(conn);
    common::proxy::wait_until("load released", || {
        s.metric("kvroute_active_requests ") == 0.0
    });

    // The worker holding a response leaves: its follow-up is the engine's 404.
    let id = stored["id"].as_str().unwrap();
    let (c, w, _) = call(
        &format!("{base}/v1/responses"),
        ("authorization", &auth),
        &json!({"model": "sim-model", "previous_response_id": id, "input": "t1", "max_output_tokens": 1}),
    );
    assert_eq!(c, 200);
    let (c, _) = s.delete(&format!("/v1/workers/{w}"));
    assert_eq!(c, 200);
    // Said by the proxy (no worker got it), naming the worker that is gone.
    let r = ureq::post(&format!("{base}/v1/responses"))
        .set("authorization", &auth)
        .send_json(json!({"model": "sim-model", "previous_response_id": id, "input": "t1", "max_output_tokens": 1}));
    let Err(ureq::Error::Status(c, r)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(c, 404);
    assert_eq!(r.header("x-kvroute-stored-on"), Some(w.as_str()));
    assert_eq!(r.header("x-kvroute-worker"), None);
    let b = r.into_string().unwrap();
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        v["error"]["message"],
        format!("Response with id '{id}' not found.")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker that dies mid-stream: the Messages stream ends with Anthropic's `event:
/// error` (the Responses one with OpenAI's), and the load is released either way.
#[test]
fn a_stream_cut_by_its_worker_ends_in_the_apis_error_shape_and_releases_load() {
    let s = Server::start(1, &[]);
    let f = Fleet::start(&[
        "--workers",
        "1",
        "--events",
        "none",
        "--timing",
        FAST,
        "--die-after-chunks",
        "2",
        "--register",
        &s.http,
    ]);
    s.wait_until("the worker", |s| s.workers().len() == 1);
    let cases = [
        (
            "/v1/messages",
            json!({"model": "sim-model", "max_tokens": 50, "stream": true,
            "messages": [{"role": "user", "content": "t1 t2"}]}),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"",
        ),
        (
            "/v1/responses",
            json!({"model": "sim-model", "max_output_tokens": 50, "stream": true,
            "input": "t1 t2"}),
            "data: {\"error\":",
        ),
    ];
    for (path, body, tail) in cases {
        let (c, w, b) = call(
            &format!("http://{}{path}", s.proxy),
            ("x-other", "1"),
            &body,
        );
        assert_eq!((c, w.as_str()), (200, f.workers[0].id.as_str()), "{b}");
        assert!(b.matches("delta").count() >= 2, "{b}");
        assert!(b.contains(tail), "{path}: {b}");
        assert_eq!(s.metric("kvroute_active_requests "), 0.0, "{path}");
    }
    assert_eq!(
        s.metric("kvroute_proxy_upstream_errors_total{kind=\"mid_stream\"}"),
        2.0
    );
}

/// A disaggregated fleet: a Messages or Responses request goes to a decode worker
/// alone (no prefill leg: their answers carry no `kv_transfer_params`), so it neither
/// falls back nor counts against the prefill worker.
#[test]
fn agent_apis_are_routed_decode_only_in_a_disaggregated_fleet() {
    let s = Server::start(1, &[]);
    let f = Fleet::start(&[
        "--workers",
        "2",
        "--prefill-workers",
        "1",
        "--events",
        "none",
        "--timing",
        FAST,
        "--register",
        &s.http,
    ]);
    s.wait_until("two workers", |s| s.workers().len() == 2);
    let (prefill, decode) = (&f.workers[0], &f.workers[1]);
    assert_eq!(
        (prefill.role.as_str(), decode.role.as_str()),
        ("prefill", "decode")
    );
    let cases = [
        (
            "/v1/messages",
            json!({"model": "sim-model", "max_tokens": 3,
            "messages": [{"role": "user", "content": "t1 t2"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "sim-model", "max_output_tokens": 3, "input": "t1 t2"}),
        ),
    ];
    for (path, body) in cases {
        let r = ureq::post(&format!("http://{}{path}", s.proxy))
            .send_json(body)
            .unwrap();
        assert_eq!(
            r.header("x-kvroute-worker"),
            Some(decode.id.as_str()),
            "{path}"
        );
        assert_eq!(r.header("x-kvroute-prefill-fallback"), None, "{path}");
    }
    assert_eq!(f.stats(0)["requests"], 0, "the prefill worker was asked");
    assert_eq!(s.metric("kvroute_proxy_prefill_fallbacks_total"), 0.0);
}

/// `proxy.responses_max_entries`: past it the oldest Responses id is forgotten, and
/// its follow-up is routed like a new request (a worker answers) instead of being
/// held to the worker that stored it.
#[test]
fn a_forgotten_responses_id_is_routed_as_a_new_request() {
    let s = Server::start(1, &["--proxy-responses-max-entries", "1"]);
    let _f = Fleet::start(&[
        "--workers",
        "2",
        "--events",
        "none",
        "--timing",
        FAST,
        "--register",
        &s.http,
    ]);
    s.wait_until("the workers", |s| s.workers().len() == 2);
    let url = format!("http://{}/v1/responses", s.proxy);
    let create = |input: &str| {
        let b = json!({"model": "sim-model", "max_output_tokens": 1, "input": input});
        let (c, w, b) = call(&url, ("x-other", "1"), &b);
        assert_eq!(c, 200, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        (v["id"].as_str().unwrap().to_string(), w)
    };
    let (first, w) = create("t1 t2");
    create("t3 t4");
    // The first id's worker leaves: remembered, its follow-up would be the proxy's
    // own 404 naming it; forgotten, another worker gets it.
    assert_eq!(s.delete(&format!("/v1/workers/{w}")).0, 200);
    let r = ureq::post(&url)
        .timeout(Duration::from_secs(60))
        .send_json(json!({"model": "sim-model", "previous_response_id": first,
            "input": "t5", "max_output_tokens": 1}));
    let r = match r {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(r.header("x-kvroute-stored-on"), None);
    let other = r.header("x-kvroute-worker").unwrap_or("").to_string();
    assert!(other.starts_with("sim-") && other != w, "{other} {w}");
}
