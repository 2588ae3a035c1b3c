//! The OpenAI proxy of `kvroute serve` when upstreams fail, end to end (split from
//! tests/proxy.rs): a killed worker, a 5xx before the first byte, a worker dying
//! mid-stream, a client that goes away, an open circuit breaker and its probe, a worker
//! that never answers. Real binary, fake OpenAI workers (tests/py/fake_openai_worker.py)
//! registered with their `url`, clients over loopback.

mod common;

use common::proxy::{
    events, open_stream, post, register, router_active, wait_until, Answer, FakeWorker,
};
use common::Server;
use serde_json::{json, Value};

fn python_ok() -> bool {
    common::python_has("json", "python3")
}

fn completion(s: &Server, body: &Value) -> Answer {
    post(s, "/v1/completions", &body.to_string(), &[])
}

#[test]
fn a_killed_worker_is_retried_elsewhere_and_nothing_is_lost() {
    if !python_ok() {
        return;
    }
    let s = Server::start(
        1,
        &["--mode", "round-robin", "--proxy-breaker-threshold", "1"],
    );
    let mut ws: Vec<FakeWorker> = (0..3)
        .map(|i| FakeWorker::start(&format!("w{i}"), &[]))
        .collect();
    for w in &ws {
        register(&s, &w.id, "m", "aggregated", &w.url());
    }
    let body = json!({"model": "m", "prompt": [1, 2, 3], "stream": true, "max_tokens": 3});
    for i in 0..30 {
        if i == 10 {
            ws[1].kill();
        }
        let a = completion(&s, &body);
        assert_eq!(a.status, 200, "request {i}: {a:?}");
        assert_eq!(events(&a.body).last().map(String::as_str), Some("[DONE]"));
        if i >= 10 {
            assert_ne!(a.header("x-kvroute-worker"), Some("w1"));
        }
    }
    assert!(s.metric("kvroute_proxy_retries_total") >= 1.0);
    assert!(s.metric("kvroute_proxy_upstream_errors_total{kind=\"connect\"}") >= 1.0);
    assert_eq!(s.metric("kvroute_proxy_breaker_open{worker=\"w1\"}"), 1.0);
    wait_until("load released", || router_active(&s) == 0.0);
}

#[test]
fn a_5xx_before_the_first_byte_is_retried_and_says_so() {
    if !python_ok() {
        return;
    }
    let s = Server::start(1, &["--mode", "round-robin"]);
    let bad = FakeWorker::start("bad", &["--mode", "fail"]);
    let good = FakeWorker::start("good", &[]);
    register(&s, "bad", "m", "aggregated", &bad.url());
    register(&s, "good", "m", "aggregated", &good.url());
    let mut retried = 0;
    for _ in 0..4 {
        let a = completion(&s, &json!({"model": "m", "prompt": [1], "max_tokens": 2}));
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.header("x-kvroute-worker"), Some("good"));
        if a.header("x-kvroute-retries") == Some("1") {
            retried += 1;
        }
    }
    assert!(retried >= 1);
    assert!(s.metric("kvroute_proxy_upstream_errors_total{kind=\"status_5xx\"}") >= 1.0);
    // With every worker failing, the client gets a 502 in OpenAI's shape.
    good.set_mode("fail");
    let a = completion(&s, &json!({"model": "m", "prompt": [1], "max_tokens": 2}));
    assert!(a.status == 502 || a.status == 503, "{a:?}");
    assert!(a.json()["error"]["message"].is_string());
    wait_until("load released", || router_active(&s) == 0.0);
}

#[test]
fn an_upstream_dying_mid_stream_ends_with_an_error_event_and_releases_load() {
    if !python_ok() {
        return;
    }
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &["--mode", "die_mid", "--delay-ms", "20"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let a = completion(
        &s,
        &json!({"model": "m", "prompt": [1, 2], "stream": true, "max_tokens": 10}),
    );
    assert_eq!(a.status, 200);
    let ev = events(&a.body);
    assert_eq!(ev.len(), 3, "{}", a.body);
    let last: Value = serde_json::from_str(&ev[2]).unwrap();
    assert!(last["error"]["message"].is_string(), "{}", a.body);
    wait_until("load released", || {
        router_active(&s) == 0.0 && s.workers()[0]["active_requests"] == 0
    });
    assert_eq!(
        s.metric("kvroute_proxy_upstream_errors_total{kind=\"mid_stream\"}"),
        1.0
    );
}

#[test]
fn a_client_that_disconnects_aborts_the_upstream_and_releases_load() {
    if !python_ok() {
        return;
    }
    let s = Server::start(1, &[]);
    let w = FakeWorker::start("w1", &["--delay-ms", "100"]);
    register(&s, "w1", "m", "aggregated", &w.url());
    let body =
        json!({"model": "m", "prompt": [1, 2], "stream": true, "max_tokens": 200}).to_string();
    let (c, _) = open_stream(&s, &body, 2);
    wait_until("routed and active", || router_active(&s) == 1.0);
    drop(c);
    wait_until("upstream aborted", || w.stats()["aborted"] == 1);
    wait_until("load released", || router_active(&s) == 0.0);
    assert_eq!(w.stats()["completed"], 0);
    assert_eq!(
        s.metric(
            "kvroute_proxy_requests_total{model=\"m\",worker=\"w1\",outcome=\"client_disconnect\"}"
        ),
        1.0
    );
}

#[test]
fn an_open_breaker_probes_health_and_lets_the_worker_back() {
    if !python_ok() {
        return;
    }
    let s = Server::start(
        1,
        &[
            "--mode",
            "round-robin",
            "--proxy-breaker-threshold",
            "1",
            "--proxy-breaker-open-ms",
            "300",
        ],
    );
    let flaky = FakeWorker::start("flaky", &["--mode", "fail"]);
    let good = FakeWorker::start("good", &[]);
    register(&s, "flaky", "m", "aggregated", &flaky.url());
    register(&s, "good", "m", "aggregated", &good.url());
    let body = json!({"model": "m", "prompt": [1], "max_tokens": 1});
    for _ in 0..3 {
        assert_eq!(completion(&s, &body).status, 200);
    }
    assert_eq!(
        s.metric("kvroute_proxy_breaker_open{worker=\"flaky\"}"),
        1.0
    );
    // While open (and while /health fails), flaky gets nothing.
    let seen = flaky.received().len();
    for _ in 0..4 {
        assert_eq!(
            completion(&s, &body).header("x-kvroute-worker"),
            Some("good")
        );
    }
    flaky.set_mode("ok");
    wait_until("the probe closes the breaker", || {
        completion(&s, &body);
        s.metric("kvroute_proxy_breaker_open{worker=\"flaky\"}") == 0.0
    });
    wait_until("flaky serves again", || {
        completion(&s, &body).header("x-kvroute-worker") == Some("flaky")
    });
    assert!(flaky.received().len() > seen);
}

#[test]
fn a_worker_that_never_answers_times_out_and_is_retried() {
    if !python_ok() {
        return;
    }
    let s = Server::start(
        1,
        &["--mode", "round-robin", "--proxy-request-timeout-ms", "500"],
    );
    let hang = FakeWorker::start("hang", &["--mode", "hang"]);
    let good = FakeWorker::start("good", &[]);
    register(&s, "hang", "m", "aggregated", &hang.url());
    register(&s, "good", "m", "aggregated", &good.url());
    for _ in 0..3 {
        let a = completion(
            &s,
            &json!({"model": "m", "prompt": [1], "stream": true, "max_tokens": 2}),
        );
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.header("x-kvroute-worker"), Some("good"));
    }
    assert!(s.metric("kvroute_proxy_upstream_errors_total{kind=\"timeout\"}") >= 1.0);
    wait_until("load released", || router_active(&s) == 0.0);
}
