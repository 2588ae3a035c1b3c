//! The tracer (`kvroute::trace`) against a real OTLP receiver the test starts (the
//! Python `opentelemetry-proto` messages behind a grpcio server, or behind an HTTP
//! server): a request span continues the client's `traceparent`, its `tokenize`,
//! `route` and `upstream` children hang under it with the decision's attributes, and
//! the headers for the worker name the upstream span in the same trace — over gRPC
//! and over HTTP. Sampling follows the client's flag and the ratio; a collector that
//! hangs makes spans drop and be counted, never makes a caller wait.
//!
//! The span API is driven here directly, as the proxy's pipeline drives it, and
//! through the real `kvroute serve` proxy: a chat completion sent with a client's
//! `traceparent` is one trace of four spans, and the worker receives a `traceparent`
//! naming the proxy's `upstream` span.

mod common;

use kvroute::trace::config::{OtlpProtocol, TraceSettings};
use kvroute::trace::{RouteAttrs, Tracing};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

struct Collector {
    child: Child,
    port: u16,
    spans: Receiver<Value>,
}

impl Collector {
    fn start(mode: &str) -> Collector {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/otlp_receiver.py");
        let mut child = Command::new("python3")
            .args([script, mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = channel();
        let (ptx, prx) = channel();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                if let Some(p) = l.strip_prefix("port ") {
                    let _ = ptx.send(p.parse::<u16>().unwrap());
                } else if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        let port = prx
            .recv_timeout(Duration::from_secs(30))
            .expect("receiver port");
        Collector {
            child,
            port,
            spans: rx,
        }
    }

    /// The next `n` spans (within 30 s).
    fn take(&self, n: usize) -> Vec<Value> {
        let end = Instant::now() + Duration::from_secs(30);
        (0..n)
            .map(|i| {
                self.spans
                    .recv_timeout(end.saturating_duration_since(Instant::now()))
                    .unwrap_or_else(|_| panic!("only {i} of {n} spans arrived"))
            })
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn settings(protocol: OtlpProtocol, port: u16) -> TraceSettings {
    TraceSettings {
        otlp_endpoint: Some(format!("http://127.0.0.1:{port}")),
        otlp_protocol: protocol,
        service_name: "kvroute-test".into(),
        ..TraceSettings::default()
    }
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn one_request(t: &Tracing) -> Vec<(String, String)> {
    let tp = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let req = t.request("POST /v1/messages", |h| match h {
        "traceparent" => Some(tp.as_str()),
        "tracestate" => Some("vendor=1"),
        _ => None,
    });
    assert!(req.recording());
    assert_eq!(req.trace_id().as_deref(), Some(CLIENT_TRACE));
    req.set("gen_ai.request.model", "m");
    drop(req.tokenize());
    let route = req.route();
    route.decision(&RouteAttrs {
        worker: "w1",
        prefill_worker: None,
        overlap_blocks: 7,
        prompt_blocks: 9,
        cost: 2.5,
        mode: "kv",
        queue_wait_us: 12,
    });
    route.end();
    let up = req.upstream("w1", 0);
    let headers = up.propagation();
    up.first_token(1500);
    up.finish(4, "ok");
    req.end(200, "ok");
    headers
}

fn check_trace(spans: &[Value], headers: &[(String, String)]) {
    let by = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:?}"))
    };
    let root = by("POST /v1/messages");
    assert!(
        spans.iter().all(|s| s["trace_id"] == CLIENT_TRACE),
        "{spans:?}"
    );
    assert!(spans.iter().all(|s| s["service"] == "kvroute-test"));
    assert_eq!(root["parent_span_id"], CLIENT_SPAN);
    for child in ["tokenize", "route", "upstream"] {
        assert_eq!(by(child)["parent_span_id"], root["span_id"], "{child}");
    }
    let a = &by("route")["attributes"];
    assert_eq!(
        (
            a["kvroute.worker"].as_str(),
            a["kvroute.overlap_blocks"].as_i64()
        ),
        (Some("w1"), Some(7))
    );
    assert_eq!(
        (a["kvroute.cost"].as_f64(), a["kvroute.mode"].as_str()),
        (Some(2.5), Some("kv"))
    );
    assert_eq!(a["kvroute.queue_wait_us"], 12);
    let u = by("upstream");
    assert_eq!(u["attributes"]["kvroute.ttft_us"], 1500);
    assert_eq!(u["attributes"]["gen_ai.usage.output_tokens"], 4);
    assert_eq!(root["attributes"]["http.response.status_code"], 200);
    // The worker is told the upstream span is its parent, in the client's trace.
    let tp = headers
        .iter()
        .find(|(k, _)| k == "traceparent")
        .map(|(_, v)| v.as_str());
    let want = format!("00-{CLIENT_TRACE}-{}-01", u["span_id"].as_str().unwrap());
    assert_eq!(tp, Some(want.as_str()));
    let ts = headers
        .iter()
        .find(|(k, _)| k == "tracestate")
        .map(|(_, v)| v.as_str());
    assert_eq!(ts, Some("vendor=1"));
}

#[test]
fn spans_reach_a_grpc_collector_as_one_trace_under_the_client() {
    let c = Collector::start("grpc");
    let t = Tracing::start(&settings(OtlpProtocol::Grpc, c.port)).unwrap();
    let headers = one_request(&t);
    t.flush().unwrap();
    check_trace(&c.take(4), &headers);
    t.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(t.counts().exported, 4);
    assert_eq!(t.counts().dropped, 0);
}

#[test]
fn spans_reach_an_http_collector_as_one_trace_under_the_client() {
    let c = Collector::start("http");
    let t = Tracing::start(&settings(OtlpProtocol::Http, c.port)).unwrap();
    let headers = one_request(&t);
    // No flush: the batch leaves on its own within the batch delay.
    check_trace(&c.take(4), &headers);
    t.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn sampling_follows_the_client_flag_and_the_ratio() {
    let c = Collector::start("grpc");
    let mut s = settings(OtlpProtocol::Grpc, c.port);
    s.sample_ratio = 0.0;
    let t = Tracing::start(&s).unwrap();
    let unsampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-00");
    let r = t.request("x", |h| (h == "traceparent").then_some(unsampled.as_str()));
    assert!(!r.recording());
    let up = r.upstream("w", 0);
    // Still propagated, with the client's decision (not sampled).
    let tp = up.propagation();
    assert!(
        tp.iter()
            .any(|(k, v)| k == "traceparent" && v.ends_with("-00")),
        "{tp:?}"
    );
    drop(up);
    drop(r);
    assert!(
        !t.request("y", |_| None).recording(),
        "ratio 0 samples no new trace"
    );
    let sampled = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let r = t.request("z", |h| (h == "traceparent").then_some(sampled.as_str()));
    assert!(r.recording(), "a sampled parent is followed");
    r.end(200, "ok");
    t.flush().unwrap();
    let got = c.take(1);
    assert_eq!(got[0]["name"], "z");
    t.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(t.counts().exported, 1);
    let off = Tracing::start(&TraceSettings::default()).unwrap();
    assert!(!off.enabled() && !off.request("x", |_| None).recording());
}

#[test]
fn a_hung_collector_drops_and_counts_spans_and_never_blocks_a_caller() {
    let c = Collector::start("stall");
    let mut s = settings(OtlpProtocol::Grpc, c.port);
    s.queue_spans = 4;
    s.export_timeout_ms = 1000;
    let t = Tracing::start(&s).unwrap();
    let n = 2000u64;
    for i in 0..n {
        t.request("r", |_| None)
            .end(200, if i % 2 == 0 { "ok" } else { "error" });
    }
    // The queue holds 4 and the exporter one batch: the rest dropped at once.
    assert!(t.counts().dropped >= n - 4 - 512, "{:?}", t.counts());
    t.shutdown(Duration::from_secs(30)).unwrap();
    let k = t.counts();
    assert_eq!((k.exported, k.dropped), (0, n), "{k:?}");
    assert!(k.failed_exports >= 1);
}

#[test]
fn the_exporter_counters_are_prometheus_metrics() {
    let c = Collector::start("grpc");
    let t = Tracing::start(&settings(OtlpProtocol::Grpc, c.port)).unwrap();
    t.request("r", |_| None).end(200, "ok");
    t.flush().unwrap();
    c.take(1);
    let mut reg = prometheus_client::registry::Registry::with_prefix("kvroute");
    t.register(&mut reg);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
    assert!(
        out.contains("kvroute_trace_spans_exported_total 1"),
        "{out}"
    );
    assert!(out.contains("kvroute_trace_spans_dropped_total 0"), "{out}");
    assert!(
        out.contains("kvroute_trace_exports_failed_total 0"),
        "{out}"
    );
    t.shutdown(Duration::from_secs(10)).unwrap();
}

/// `kvroute print-config` shows `[trace]`: the defaults (off), the TOML keys, the
/// environment over the file, the flags over both; a bad value is refused at start.
#[test]
fn trace_settings_come_from_default_toml_env_and_flags() {
    let dir = std::env::temp_dir().join(format!("kvroute-trace-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("c.toml");
    std::fs::write(
        &toml,
        "[trace]\notlp_endpoint = \"http://127.0.0.1:4317\"\nsample_ratio = 0.5\nqueue_spans = 100\n",
    )
    .unwrap();
    let file = toml.to_str().unwrap();
    let shown = |env: &[(&str, &str)], args: &[&str]| -> toml::Value {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvroute"));
        cmd.arg("print-config").args(args);
        for k in [
            "KVROUTE_OTLP_ENDPOINT",
            "KVROUTE_OTLP_PROTOCOL",
            "KVROUTE_TRACE_SAMPLE_RATIO",
            "KVROUTE_TRACE_SERVICE_NAME",
            "KVROUTE_TRACE_QUEUE_SPANS",
            "KVROUTE_TRACE_EXPORT_TIMEOUT_MS",
        ] {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().copied());
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: toml::Value = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
        v["trace"].clone()
    };
    let d = shown(&[], &[]);
    assert!(d.get("otlp_endpoint").is_none(), "{d}");
    assert_eq!(
        (d["otlp_protocol"].as_str(), d["sample_ratio"].as_float()),
        (Some("grpc"), Some(1.0))
    );
    assert_eq!(
        (d["service_name"].as_str(), d["queue_spans"].as_integer()),
        (Some("kvroute"), Some(8192))
    );
    assert_eq!(d["export_timeout_ms"].as_integer(), Some(10_000));
    let f = shown(&[], &["--config", file]);
    assert_eq!(
        (f["otlp_endpoint"].as_str(), f["sample_ratio"].as_float()),
        (Some("http://127.0.0.1:4317"), Some(0.5))
    );
    let e = shown(
        &[
            ("KVROUTE_TRACE_SAMPLE_RATIO", "0.25"),
            ("KVROUTE_OTLP_PROTOCOL", "http"),
        ],
        &["--config", file],
    );
    assert_eq!(
        (e["sample_ratio"].as_float(), e["otlp_protocol"].as_str()),
        (Some(0.25), Some("http"))
    );
    let a = shown(
        &[("KVROUTE_TRACE_SAMPLE_RATIO", "0.25")],
        &[
            "--config",
            file,
            "--trace-sample-ratio",
            "0.75",
            "--otlp-endpoint",
            "http://c:4318",
            "--trace-service-name",
            "edge",
            "--trace-queue-spans",
            "7",
            "--trace-export-timeout-ms",
            "500",
        ],
    );
    assert_eq!(
        (a["sample_ratio"].as_float(), a["otlp_endpoint"].as_str()),
        (Some(0.75), Some("http://c:4318"))
    );
    assert_eq!(
        (
            a["service_name"].as_str(),
            a["queue_spans"].as_integer(),
            a["export_timeout_ms"].as_integer()
        ),
        (Some("edge"), Some(7), Some(500))
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["print-config", "--trace-sample-ratio", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sample_ratio must be in [0, 1]"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_proxied_request_is_one_trace_and_its_worker_joins_it() {
    use common::proxy::{post, register, FakeWorker};
    let c = Collector::start("grpc");
    let w = FakeWorker::start("w1", &[]);
    let endpoint = format!("http://127.0.0.1:{}", c.port);
    let s = common::Server::start(
        1,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--trace-service-name",
            "kvroute-test",
        ],
    );
    register(&s, "w1", "m", "aggregated", &w.url());
    let tp = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let body = r#"{"model":"m","prompt":[1,2,3,4,5,6,7,8],"max_tokens":2}"#;
    let headers = [("traceparent", tp.as_str()), ("tracestate", "vendor=1")];
    let a = post(&s, "/v1/completions", body, &headers);
    assert_eq!(a.status, 200, "{a:?}");
    let spans = c.take(4);
    let by = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} span in {spans:?}"))
    };
    let root = by("POST /v1/completions");
    assert!(
        spans.iter().all(|s| s["trace_id"] == CLIENT_TRACE),
        "{spans:?}"
    );
    assert_eq!(root["parent_span_id"], CLIENT_SPAN);
    for child in ["tokenize", "route", "upstream"] {
        assert_eq!(by(child)["parent_span_id"], root["span_id"], "{child}");
    }
    let r = &by("route")["attributes"];
    assert_eq!(
        (r["kvroute.worker"].as_str(), r["kvroute.mode"].as_str()),
        (Some("w1"), Some("kv"))
    );
    assert_eq!(r["kvroute.prompt_blocks"].as_i64(), Some(0), "{r}");
    let u = &by("upstream")["attributes"];
    assert_eq!(
        (u["kvroute.worker"].as_str(), u["kvroute.outcome"].as_str()),
        (Some("w1"), Some("ok")),
        "{u}"
    );
    assert_eq!(root["attributes"]["http.response.status_code"], 200);
    assert_eq!(root["attributes"]["gen_ai.request.model"], "m");
    let got = w.received();
    let want = format!(
        "00-{CLIENT_TRACE}-{}-01",
        by("upstream")["span_id"].as_str().unwrap()
    );
    assert_eq!(
        got[0]["traceparent"].as_str(),
        Some(want.as_str()),
        "{got:?}"
    );
    assert_eq!(got[0]["tracestate"], "vendor=1");
}

#[test]
fn a_queued_requests_route_span_says_how_long_it_waited() {
    use common::fleet::{post, Fleet};
    // One worker that runs one request at a time, 20 ms per decode step.
    let slow = "prefill_base_us=1000,prefill_us_per_token=1,prefill_attention_us=0,decode_step_base_us=20000,decode_us_per_seq=0";
    let fleet = Fleet::start(&[
        "--workers",
        "1",
        "--block-size",
        "4",
        "--max-active",
        "1",
        "--timing",
        slow,
    ]);
    let engine = fleet.workers[0].engine.clone().expect("engine flag");
    let c = Collector::start("grpc");
    let endpoint = format!("http://127.0.0.1:{}", c.port);
    let s = common::Server::start(
        1,
        &[
            "--block-size",
            "4",
            "--engine",
            &engine,
            "--otlp-endpoint",
            &endpoint,
        ],
    );
    let url = format!("http://{}/v1/completions", s.proxy);
    let body = |tag: u32, n: u32| serde_json::json!({"model": "sim-model", "prompt": [1, 2, 3, tag], "max_tokens": n});
    // The first holds the worker ~400 ms; the second is refused by it and queues.
    let u = url.clone();
    let first = std::thread::spawn(move || post(&u, body(1, 20)).0);
    s.wait_until("the first request runs", |s| {
        s.metric("kvroute_proxy_active") >= 1.0
    });
    let u = url.clone();
    let second = std::thread::spawn(move || post(&u, body(2, 1)).0);
    s.wait_until("the second request queued", |s| {
        s.metric("kvroute_proxy_queued_total") >= 1.0
    });
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(second.join().unwrap(), 200);
    // Spans of both requests (the second has a route span per attempt).
    let end = Instant::now() + Duration::from_secs(30);
    let mut waited = Vec::new();
    while waited.iter().all(|w: &i64| *w == 0) && Instant::now() < end {
        let Ok(sp) = c
            .spans
            .recv_timeout(end.saturating_duration_since(Instant::now()))
        else {
            break;
        };
        if sp["name"] == "route" {
            waited.push(
                sp["attributes"]["kvroute.queue_wait_us"]
                    .as_i64()
                    .unwrap_or(-1),
            );
        }
    }
    assert!(
        waited.iter().any(|w| *w > 0) && waited.iter().all(|w| *w >= 0),
        "route spans' kvroute.queue_wait_us: {waited:?}"
    );
}
