//! The OpenAI proxy of `kvroute serve` end to end: the real binary, fake OpenAI
//! workers (tests/py/fake_openai_worker.py) registered with their `url`, and clients
//! over loopback (ureq and the official `openai` Python package). What the
//! proxy does when an upstream fails (retries, breakers, timeouts, aborts) is in
//! tests/proxy_failures.rs.

mod common;

use common::proxy::{events, get, post, register, router_active, wait_until, Answer, FakeWorker};
use common::tokenizer::TestTokenizer;
use common::Server;
use serde_json::{json, Value};

fn python_ok() -> bool {
    common::python_has("json", "python3")
}

fn completion(s: &Server, body: &Value) -> Answer {
    post(s, "/v1/completions", &body.to_string(), &[])
}

#[test]
fn streams_through_and_forwards_the_clients_bytes_unchanged() {
    if !python_ok() {
        return;
    }
    let s = Server::start(2, &[]);
    let w = FakeWorker::start("w1", &["--delay-ms", "5"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    // Odd spacing, key order and unknown fields: the worker must get these bytes.
    let sent = r#"{ "model":"m",  "prompt":[1,2,3],"stream":true, "max_tokens":5,
        "vendor_ext": {"nested": [1, "x", null]}, "top_k": 3 }"#;
    let a = post(&s, "/v1/completions", sent, &[("x-request-id", "client-7")]);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("x-request-id"), Some("client-7"));
    assert_eq!(a.header("x-kvroute-worker"), Some("w1"));
    assert!(a
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let ev = events(&a.body);
    assert_eq!(ev.len(), 6, "{}", a.body);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let got = w.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["raw"], sent, "forwarded byte for byte");
    assert_eq!(got[0]["x_request_id"], "client-7");
    // A client reusing its id is still a new request to the router.
    let b = post(&s, "/v1/completions", sent, &[("x-request-id", "client-7")]);
    assert_eq!(b.status, 200);
    assert_ne!(
        a.header("x-kvroute-request-id"),
        b.header("x-kvroute-request-id")
    );
    // Non-streamed chat: the worker's JSON as is.
    let c = post(
        &s,
        "/v1/chat/completions",
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#,
        &[],
    );
    assert_eq!(c.status, 200);
    assert_eq!(c.json()["usage"]["completion_tokens"], 3);
    assert!(a.header("x-request-id").is_some());
    // Lifecycle from the stream: everything finished, nothing left active.
    wait_until("load released", || router_active(&s) == 0.0);
    assert_eq!(
        s.metric("kvroute_proxy_requests_total{model=\"m\",worker=\"w1\",outcome=\"ok\"}"),
        3.0
    );
    assert_eq!(s.metric("kvroute_proxy_ttft_seconds_count"), 3.0);
    let (code, models) = get(&s, "/v1/models", None);
    assert_eq!(code, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(get(&s, "/health", None).0, 200);
    // The worker list shows the url.
    assert_eq!(s.workers()[0]["url"], w.url());
}

#[test]
fn the_official_openai_client_works_streamed_and_not() {
    if !common::python_has("openai", "openai") {
        return;
    }
    let s = Server::start(1, &["--proxy-api-keys", "sk-test"]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let r = common::py_client(
        "openai_client.py",
        &[&format!("http://{}/v1", s.proxy), "sk-test", "m"],
    );
    assert_eq!(r["chat"], "t0 t1 t2 ");
    assert_eq!(r["chat_stream"], "t0 t1 t2 ");
    assert_eq!(r["completion"], "t0 t1 ");
    assert_eq!(r["completion_stream"], "t0 t1 ");
    assert_eq!(r["usage_stream"], 2);
    assert_eq!(w.received().len(), 4);
}

#[test]
fn a_shared_prefix_goes_back_to_the_worker_that_cached_it() {
    if !python_ok() {
        return;
    }
    for layout in ["sharded", "replicated"] {
        shared_prefix_rounds(layout);
    }
}

fn shared_prefix_rounds(layout: &str) {
    let s = Server::start(2, &["--block-size", "4", "--index-layout", layout]);
    let ws: Vec<FakeWorker> = (0..3)
        .map(|i| FakeWorker::start(&format!("w{i}"), &[]))
        .collect();
    for w in &ws {
        register(&s, &w.id, "m", "aggregated", &w.url());
    }
    // Blocks a worker reports before any request: the index alone sends the prompt
    // there (no affinity yet), whichever core takes the connection.
    let cached: Vec<u32> = (0..32).map(|i| 50_000 + i).collect();
    let mut hashes = Vec::new();
    kvroute::hash::sequence_hashes_after(None, &cached, 4, &mut hashes);
    s.store("w1", "device", &hashes);
    s.wait_until("blocks indexed", |s| s.cached("w1") == 8);
    for _ in 0..4 {
        let a = completion(
            &s,
            &json!({"model": "m", "prompt": cached, "max_tokens": 2}),
        );
        assert_eq!(a.status, 200);
        assert_eq!(a.header("x-kvroute-worker"), Some("w1"), "{layout}");
        let rid = a.header("x-kvroute-request-id").unwrap_or("");
        assert!(rid.starts_with(kvroute::ids::PROXY_ID_PREFIX), "{rid}");
    }
    for round in 0..4u32 {
        let prefix: Vec<u32> = (0..32).map(|i| round * 1000 + i).collect();
        let a = completion(
            &s,
            &json!({"model": "m", "prompt": prefix, "max_tokens": 2}),
        );
        assert_eq!(a.status, 200);
        let first = a.header("x-kvroute-worker").unwrap().to_string();
        // That worker reports the prompt's blocks (as its engine would).
        let mut hashes = Vec::new();
        kvroute::hash::sequence_hashes_after(None, &prefix, 4, &mut hashes);
        let before = s.cached(&first);
        s.store(&first, "device", &hashes);
        s.wait_until("blocks indexed", |s| s.cached(&first) >= before + 8);
        let mut longer = prefix.clone();
        longer.extend([7, 7, 7, 7, 9, 9, 9, 9]);
        let b = completion(
            &s,
            &json!({"model": "m", "prompt": longer, "max_tokens": 2}),
        );
        assert_eq!(b.status, 200);
        assert_eq!(
            b.header("x-kvroute-worker"),
            Some(first.as_str()),
            "{layout} round {round}"
        );
    }
}

#[test]
fn disaggregated_requests_take_the_nixl_flow_and_fall_back_to_decode_only() {
    if !python_ok() {
        return;
    }
    let s = Server::start(1, &[]);
    let p = FakeWorker::start("p1", &[]);
    let d = FakeWorker::start("d1", &[]);
    register(&s, "p1", "m", "prefill", &p.url());
    register(&s, "d1", "m", "decode", &d.url());
    let body = json!({"model": "m", "prompt": [1, 2, 3], "stream": true, "max_tokens": 4,
                      "stream_options": {"include_usage": true}});
    let a = completion(&s, &body);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("x-kvroute-worker"), Some("d1"));
    assert_eq!(a.header("x-kvroute-prefill-fallback"), None);
    assert_eq!(events(&a.body).last().map(String::as_str), Some("[DONE]"));
    let pr = p.received();
    assert_eq!(pr.len(), 1);
    assert_eq!(pr[0]["body"]["max_tokens"], 1);
    assert_eq!(pr[0]["body"]["stream"], false);
    assert!(pr[0]["body"].get("stream_options").is_none());
    let kv = &pr[0]["body"]["kv_transfer_params"];
    assert_eq!(kv["do_remote_decode"], true);
    assert_eq!(kv["do_remote_prefill"], false);
    assert!(kv["remote_engine_id"].is_null() && kv["remote_port"].is_null());
    let dr = d.received();
    assert_eq!(dr.len(), 1);
    assert_eq!(
        dr[0]["body"]["kv_transfer_params"]["remote_engine_id"],
        "p1"
    );
    assert_eq!(
        dr[0]["body"]["kv_transfer_params"]["do_remote_prefill"],
        true
    );
    assert_eq!(dr[0]["body"]["max_tokens"], 4);
    assert_eq!(dr[0]["body"]["stream"], true);
    // The prefill worker fails: served decode-only, and the response says so.
    p.set_mode("fail");
    let b = completion(&s, &body);
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(b.header("x-kvroute-prefill-fallback"), Some("1"));
    assert_eq!(b.header("x-kvroute-worker"), Some("d1"));
    let dr = d.received();
    assert_eq!(dr.len(), 2);
    assert!(dr[1]["body"].get("kv_transfer_params").is_none());
    assert_eq!(s.metric("kvroute_proxy_prefill_fallbacks_total"), 1.0);
    wait_until("load released", || router_active(&s) == 0.0);
}

#[test]
fn a_model_without_a_tokenizer_is_still_served() {
    if !python_ok() {
        return;
    }
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "text-model", "aggregated", &w.url());
    let a = post(
        &s,
        "/v1/chat/completions",
        r#"{"model":"text-model","messages":[{"role":"user","content":"hello"}],"stream":true,"max_tokens":2}"#,
        &[],
    );
    assert_eq!(a.status, 200, "{a:?}");
    let b = completion(&s, &json!({"model": "text-model", "prompt": "plain text"}));
    assert_eq!(b.status, 200);
    assert_eq!(s.metric("kvroute_proxy_untokenized_total"), 2.0);
    // A model nobody serves: an OpenAI error, not a hang.
    let c = completion(&s, &json!({"model": "other", "prompt": "x"}));
    assert!(c.status >= 400, "{c:?}");
    assert!(c.json()["error"]["message"].is_string());
}

#[test]
fn auth_takes_the_service_token_or_a_client_key() {
    if !python_ok() {
        return;
    }
    let s = Server::start(
        1,
        &["--auth-token", "svc-secret", "--proxy-api-keys", "k1,k2"],
    );
    let w = FakeWorker::start("w1", &[]);
    let (code, _) = match ureq::post(&s.url("/v1/workers"))
        .set("authorization", "Bearer svc-secret")
        .send_json(json!({"id": "w1", "model": "m", "url": w.url()}))
    {
        Ok(r) => (r.status(), ()),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(code, 201);
    let body = json!({"model": "m", "prompt": [1], "max_tokens": 1}).to_string();
    let none = post(&s, "/v1/completions", &body, &[]);
    assert_eq!(none.status, 401);
    assert_eq!(none.json()["error"]["code"], "invalid_api_key");
    let wrong = post(
        &s,
        "/v1/completions",
        &body,
        &[("authorization", "Bearer k3")],
    );
    assert_eq!(wrong.status, 401);
    for key in ["svc-secret", "k1", "k2"] {
        let a = post(
            &s,
            "/v1/completions",
            &body,
            &[("authorization", &format!("Bearer {key}"))],
        );
        assert_eq!(a.status, 200, "{key}");
    }
    assert_eq!(get(&s, "/v1/models", None).0, 401);
    assert_eq!(get(&s, "/v1/models", Some("k1")).0, 200);
    assert_eq!(get(&s, "/health", None).0, 200);
    // The client's key is not passed to the worker.
    assert!(w.received().iter().all(|r| r["authorization"].is_null()));
}

#[test]
fn the_upstream_key_goes_with_every_call_to_a_worker_and_the_clients_key_with_none() {
    if !python_ok() {
        return;
    }
    let key_file = std::env::temp_dir().join(format!("kvr-upkey-test-{}", std::process::id()));
    std::fs::write(&key_file, "sk-upstream\n").unwrap();
    let s = Server::start(
        1,
        &[
            "--proxy-api-keys",
            "client-k",
            "--proxy-upstream-api-key-file",
            &key_file.display().to_string(),
            "--proxy-breaker-threshold",
            "1",
            "--proxy-breaker-open-ms",
            "200",
        ],
    );
    let _ = std::fs::remove_file(&key_file);
    let p = FakeWorker::start("p1", &[]);
    let d = FakeWorker::start("d1", &[]);
    register(&s, "p1", "m", "prefill", &p.url());
    register(&s, "d1", "m", "decode", &d.url());
    let body = json!({"model": "m", "prompt": [1, 2, 3], "max_tokens": 2}).to_string();
    let client = [("authorization", "Bearer client-k")];
    let a = post(&s, "/v1/completions", &body, &client);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("x-kvroute-prefill-fallback"), None);
    // Both legs of the P/D flow carry the workers' key, never the client's.
    for w in [&p, &d] {
        let got: Vec<Value> = w
            .received()
            .iter()
            .map(|r| r["authorization"].clone())
            .collect();
        assert_eq!(got, [json!("Bearer sk-upstream")], "{}", w.id);
    }
    // So does the breaker's half-open probe of GET /health.
    d.set_mode("fail");
    assert_eq!(post(&s, "/v1/completions", &body, &client).status, 502);
    assert_eq!(s.metric("kvroute_proxy_breaker_open{worker=\"d1\"}"), 1.0);
    d.set_mode("ok");
    wait_until("the probe closes the breaker", || {
        post(&s, "/v1/completions", &body, &client);
        s.metric("kvroute_proxy_breaker_open{worker=\"d1\"}") == 0.0
    });
    let probes = d.stats()["health_auth"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!probes.is_empty());
    assert!(
        probes.iter().all(|a| a == "Bearer sk-upstream"),
        "{probes:?}"
    );
}

#[test]
fn body_and_concurrency_limits_answer_413_and_429() {
    if !python_ok() {
        return;
    }
    let s = Server::start(
        1,
        &[
            "--proxy-max-body-bytes",
            "2048",
            "--proxy-max-concurrent",
            "1",
        ],
    );
    let w = FakeWorker::start("w1", &["--delay-ms", "200"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let big = json!({"model": "m", "prompt": "x".repeat(4096)}).to_string();
    let a = post(&s, "/v1/completions", &big, &[]);
    assert_eq!(a.status, 413);
    assert_eq!(a.json()["error"]["code"], "request_too_large");
    let proxy = s.proxy.clone();
    let slow = std::thread::spawn(move || {
        common::proxy::agent()
            .post(&format!("http://{proxy}/v1/completions"))
            .send_string(
                &json!({"model": "m", "prompt": [1], "stream": true, "max_tokens": 20}).to_string(),
            )
            .map(|r| r.into_string().unwrap_or_default())
            .map_err(|e| e.to_string())
    });
    wait_until("first request in flight", || {
        s.metric("kvroute_proxy_active ") == 1.0
    });
    let b = completion(&s, &json!({"model": "m", "prompt": [1], "max_tokens": 1}));
    assert_eq!(b.status, 429);
    assert_eq!(b.json()["error"]["type"], "rate_limit_exceeded");
    let done = slow.join().unwrap().unwrap();
    assert!(done.contains("[DONE]"));
    wait_until("admission released", || {
        s.metric("kvroute_proxy_active ") == 0.0
    });
    let c = completion(&s, &json!({"model": "m", "prompt": [1], "max_tokens": 1}));
    assert_eq!(c.status, 200);
}

#[test]
fn garbage_is_refused_with_400_and_the_service_keeps_serving() {
    if !python_ok() {
        return;
    }
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    for bad in [
        "{not json",
        "[1,2]",
        r#"{"model": 5}"#,
        r#"{"model":"m","stream":"yes"}"#,
        r#"{"model":"m","prompt":[1,-1]}"#,
        "\u{0}\u{1}\u{2}",
    ] {
        let a = post(&s, "/v1/completions", bad, &[]);
        assert_eq!(a.status, 400, "{bad}: {a:?}");
        assert!(a.json()["error"]["message"].is_string());
    }
    assert_eq!(post(&s, "/v1/nothing", "{}", &[]).status, 404);
    let ok = completion(&s, &json!({"model": "m", "prompt": [1], "max_tokens": 1}));
    assert_eq!(ok.status, 200);
    assert!(w.received().len() == 1, "garbage never reached the worker");
}

#[test]
fn chat_prompts_are_tokenized_with_the_models_template_and_keep_their_worker() {
    if !python_ok() {
        return;
    }
    let tt = TestTokenizer::new(1000);
    let s = Server::start(2, &["--block-size", "4", "--tokenizer", &tt.flag()]);
    let tok = tt.load();
    let ws: Vec<FakeWorker> = (0..3)
        .map(|i| FakeWorker::start(&format!("w{i}"), &[]))
        .collect();
    for w in &ws {
        register(&s, &w.id, "m", "aggregated", &w.url());
    }
    for round in 0..3u32 {
        let system: String = (0..40).map(|i| format!("t{} ", round * 100 + i)).collect();
        let first = json!({"model": "m", "max_tokens": 2, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": "t1 t2"}]});
        let a = post(&s, "/v1/chat/completions", &first.to_string(), &[]);
        assert_eq!(a.status, 200, "{a:?}");
        let w = a.header("x-kvroute-worker").unwrap().to_string();
        let ids = tok
            .prompt_tokens(kvroute::tokenize::Endpoint::Chat, "m", &first)
            .unwrap()
            .unwrap();
        let mut hashes = Vec::new();
        kvroute::hash::sequence_hashes_after(None, &ids, 4, &mut hashes);
        let before = s.cached(&w);
        s.store(&w, "device", &hashes);
        s.wait_until("blocks indexed", |s| {
            s.cached(&w) >= before + hashes.len() as u64
        });
        let mut second = first.clone();
        second["messages"].as_array_mut().unwrap().extend([
            json!({"role": "assistant", "content": "t0 t1"}),
            json!({"role": "user", "content": "t5 t6 t7"}),
        ]);
        let b = post(&s, "/v1/chat/completions", &second.to_string(), &[]);
        assert_eq!(b.status, 200);
        assert_eq!(
            b.header("x-kvroute-worker"),
            Some(w.as_str()),
            "round {round}"
        );
    }
    assert_eq!(s.metric("kvroute_proxy_untokenized_total"), 0.0);
    assert!(s.metric("kvroute_proxy_tokenize_seconds_count") >= 6.0);
}

#[test]
fn urls_from_the_binary_handshake_are_proxied_to_and_survive_a_restart() {
    if !python_ok() {
        return;
    }
    let state = std::env::temp_dir().join(format!("kvroute-proxy-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let state_flag = state.display().to_string();
    let w = FakeWorker::start("bin-w", &[]);
    {
        let s = Server::start(1, &["--state-dir", &state_flag]);
        // The event Hello carries the url (the spec's optional extension).
        let mut spec = kvroute::types::WorkerSpec::new("bin-w");
        spec.model = "m".into();
        spec.url = Some(w.url());
        let _events = kvroute::client::EventPublisher::connect(&s.events, spec, "").unwrap();
        // And the request API's Register.
        let mut rq = kvroute::client::RequestClient::connect(&s.api, "").unwrap();
        let mut spec2 = kvroute::types::WorkerSpec::new("reg-w");
        spec2.model = "m".into();
        spec2.url = Some("http://127.0.0.1:9".into());
        rq.register(spec2).unwrap();
        let ws = s.workers();
        let url_of = |id: &str| ws.iter().find(|x| x["id"] == id).unwrap()["url"].clone();
        assert_eq!(url_of("bin-w"), w.url());
        assert_eq!(url_of("reg-w"), "http://127.0.0.1:9");
        // reg-w's url refuses connections: requests there are re-routed to bin-w.
        for _ in 0..3 {
            let a = completion(
                &s,
                &json!({"model": "m", "prompt": [1, 2], "max_tokens": 1}),
            );
            assert_eq!(a.status, 200, "{a:?}");
            assert_eq!(a.header("x-kvroute-worker"), Some("bin-w"));
        }
    }
    // Restarted from the snapshot: the urls are still known.
    let s = Server::start(1, &["--state-dir", &state_flag]);
    let ws = s.workers();
    assert!(
        ws.iter()
            .any(|x| x["id"] == "reg-w" && x["url"] == "http://127.0.0.1:9"),
        "{ws:?}"
    );
    let _ = std::fs::remove_dir_all(&state);
}
