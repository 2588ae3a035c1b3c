//! The proxy's per-chunk path after its CPU work, end to end
//! through the real binary and the fake OpenAI worker (tests/py/fake_openai_worker.py):
//! the idle timeout is one re-armed timer per request (not one per chunk), and the
//! lifecycle calls run in place (not a task per chunk) — so a slow but steady stream
//! must not time out even when it lasts longer than the timeout, a stalled one must,
//! and both must release their load.

mod common;

use common::proxy::{events, post, register, router_active, wait_until, FakeWorker};
use common::Server;
use serde_json::{json, Value};

fn python_ok() -> bool {
    common::python_has("json", "python3")
}

#[test]
fn a_steady_stream_longer_than_the_idle_timeout_is_not_cut() {
    if !python_ok() {
        return;
    }
    // 7 tokens 500 ms apart: 3 s in all, each gap well inside the 2 s timeout.
    let s = Server::start(1, &["--proxy-request-timeout-ms", "2000"]);
    let w = FakeWorker::start("w1", &["--delay-ms", "500"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let a = post(
        &s,
        "/v1/completions",
        &json!({"model": "m", "prompt": [1, 2, 3], "stream": true, "max_tokens": 7}).to_string(),
        &[],
    );
    assert_eq!(a.status, 200, "{a:?}");
    let ev = events(&a.body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{}", a.body);
    let tokens = ev
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .inspect(|v| assert!(v.get("error").is_none(), "{}", a.body))
        .filter(|v| {
            v["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert_eq!(tokens, 7, "{}", a.body);
    wait_until("load released", || {
        router_active(&s) == 0.0 && s.workers()[0]["active_requests"] == 0
    });
    assert_eq!(
        s.metric("kvroute_proxy_requests_total{model=\"m\",worker=\"w1\",outcome=\"ok\"}"),
        1.0
    );
    assert_eq!(
        s.metric("kvroute_proxy_upstream_errors_total{kind=\"timeout\"}"),
        0.0
    );
}

#[test]
fn a_stream_that_stalls_past_the_idle_timeout_ends_with_an_error_event() {
    if !python_ok() {
        return;
    }
    // The first token at once, the next after 4 s: the 1 s idle timeout ends it.
    let s = Server::start(1, &["--proxy-request-timeout-ms", "1000"]);
    let w = FakeWorker::start("w1", &["--delay-ms", "4000"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let a = post(
        &s,
        "/v1/completions",
        &json!({"model": "m", "prompt": [1, 2, 3], "stream": true, "max_tokens": 3}).to_string(),
        &[],
    );
    assert_eq!(a.status, 200, "{a:?}");
    let ev = events(&a.body);
    assert_eq!(ev.len(), 2, "{}", a.body);
    let last: Value = serde_json::from_str(&ev[1]).unwrap_or(Value::Null);
    let msg = last["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("sent nothing for 1000 ms"), "{}", a.body);
    wait_until("load released", || {
        router_active(&s) == 0.0 && s.workers()[0]["active_requests"] == 0
    });
    assert_eq!(
        s.metric("kvroute_proxy_upstream_errors_total{kind=\"timeout\"}"),
        1.0
    );
}
