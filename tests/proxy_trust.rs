//! What the proxy lets a client say to an engine: members that engines trust as
//! engine-to-engine or router data (`kv_transfer_params`, SGLang's `bootstrap_*`,
//! data-parallel ranks, ...; src/proxy/strip.rs) never reach a worker, on an aggregated
//! fleet, on both legs of a disaggregated one, and on its decode-only fallback; the
//! decode leg's `kv_transfer_params` are the prefill worker's. Real binary, fake OpenAI
//! workers (tests/py/fake_openai_worker.py).

mod common;

use common::proxy::{events, post, register, router_active, wait_until, FakeWorker};
use common::Server;
use serde_json::{json, Value};

/// A hostile body: an attacker's NIXL peer and every other trusted member.
fn hostile(stream: bool) -> Value {
    json!({
        "model": "m", "prompt": [1, 2, 3], "stream": stream, "max_tokens": 3,
        "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "203.0.113.66",
                               "remote_port": 5600, "remote_engine_id": "attacker",
                               "remote_block_ids": [1, 2, 3]},
        "ec_transfer_params": {"remote_host": "203.0.113.66"},
        "disaggregated_params": {"request_type": "generation_only", "ctx_request_id": 1},
        "bootstrap_host": "203.0.113.66", "bootstrap_port": 8998, "bootstrap_room": 42,
        "routed_dp_rank": 3, "data_parallel_rank": 3, "disagg_prefill_dp_rank": 1,
        "custom_logit_processor": "gASVAAAA",
        "vllm_xargs": {"kv_transfer_params": "x", "keep": 1},
        "cache_salt": "mine", "top_k": 5,
    })
}

const TRUSTED: [&str; 10] = [
    "kv_transfer_params",
    "ec_transfer_params",
    "disaggregated_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
    "custom_logit_processor",
];

/// The body carries none of the trusted members from the client, and keeps the rest.
fn clean(body: &Value) {
    for k in TRUSTED.iter().filter(|k| **k != "kv_transfer_params") {
        assert!(body.get(*k).is_none(), "{k} reached the worker: {body}");
    }
    assert!(
        body["vllm_xargs"].get("kv_transfer_params").is_none(),
        "{body}"
    );
    assert_eq!(body["vllm_xargs"]["keep"], 1);
    assert_eq!(body["cache_salt"], "mine");
    assert_eq!(body["top_k"], 5);
    if let Some(kv) = body.get("kv_transfer_params") {
        assert_ne!(kv["remote_host"], "203.0.113.66", "{body}");
        assert_ne!(kv["remote_engine_id"], "attacker", "{body}");
    }
}

#[test]
fn a_clients_engine_members_never_reach_an_aggregated_worker() {
    if !common::python_has("json", "python3") {
        return;
    }
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &[]);
    register(&s, "w1", "m", "aggregated", &w.url());
    for stream in [true, false] {
        let a = post(&s, "/v1/completions", &hostile(stream).to_string(), &[]);
        assert_eq!(a.status, 200, "{a:?}");
    }
    let mut chat = hostile(true);
    chat.as_object_mut().unwrap().remove("prompt");
    chat["messages"] = json!([{"role": "user", "content": "hi"}]);
    let c = post(&s, "/v1/chat/completions", &chat.to_string(), &[]);
    assert_eq!(c.status, 200, "{c:?}");
    let got = w.received();
    assert_eq!(got.len(), 3);
    for r in &got {
        clean(&r["body"]);
        assert!(r["body"].get("kv_transfer_params").is_none());
    }
    for k in TRUSTED {
        let m = format!("kvroute_proxy_stripped_fields_total{{field=\"{k}\"}}");
        assert_eq!(s.metric(&m), 3.0, "{m}");
    }
    assert_eq!(
        s.metric("kvroute_proxy_stripped_fields_total{field=\"vllm_xargs.kv_transfer_params\"}"),
        3.0
    );
    // A body with nothing to strip still goes out byte for byte.
    let plain = r#"{"model":"m",  "prompt":[1,2], "max_tokens":2}"#;
    assert_eq!(post(&s, "/v1/completions", plain, &[]).status, 200);
    assert_eq!(w.received()[3]["raw"], plain);
    // A stripped body keeps the rest of its bytes as sent: numbers, spacing, order.
    let mixed = r#"{"model":"m",  "prompt":[1,2], "temperature": 1.50, "kv_transfer_params":{"remote_host":"203.0.113.66"},"max_tokens":2 }"#;
    assert_eq!(post(&s, "/v1/completions", mixed, &[]).status, 200);
    assert_eq!(
        w.received()[4]["raw"],
        r#"{"model":"m",  "prompt":[1,2], "temperature": 1.50,"max_tokens":2 }"#
    );
    wait_until("load released", || router_active(&s) == 0.0);
}

#[test]
fn disaggregated_legs_carry_only_the_proxys_and_the_prefill_workers_params() {
    if !common::python_has("json", "python3") {
        return;
    }
    let s = Server::start(1, &[]);
    let p = FakeWorker::start("p1", &[]);
    let d = FakeWorker::start("d1", &[]);
    register(&s, "p1", "m", "prefill", &p.url());
    register(&s, "d1", "m", "decode", &d.url());
    let a = post(&s, "/v1/completions", &hostile(true).to_string(), &[]);
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.header("x-kvroute-prefill-fallback"), None);
    assert_eq!(events(&a.body).last().map(String::as_str), Some("[DONE]"));
    let pr = p.received();
    clean(&pr[0]["body"]);
    let kv = &pr[0]["body"]["kv_transfer_params"];
    assert_eq!(kv["do_remote_decode"], true);
    assert!(kv["remote_host"].is_null() && kv["remote_engine_id"].is_null());
    let dr = d.received();
    clean(&dr[0]["body"]);
    let kv = &dr[0]["body"]["kv_transfer_params"];
    assert_eq!(kv["remote_engine_id"], "p1");
    assert_eq!(kv["remote_host"], "127.0.0.1");
    // The prefill leg fails: the decode-only request carries no kv_transfer_params.
    p.set_mode("fail");
    let b = post(&s, "/v1/completions", &hostile(true).to_string(), &[]);
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(b.header("x-kvroute-prefill-fallback"), Some("1"));
    let dr = d.received();
    assert_eq!(dr.len(), 2);
    clean(&dr[1]["body"]);
    assert!(
        dr[1]["body"].get("kv_transfer_params").is_none(),
        "{}",
        dr[1]["body"]
    );
    wait_until("load released", || router_active(&s) == 0.0);
}
