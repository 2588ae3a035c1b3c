//! The endpoint picker's ext_proc server, driven by a client that speaks the protocol
//! as a gateway does (tests/py/extproc_client.py: Envoy's protos from `xds-protos`
//! over grpcio), over the fake picker: body modes, the pick's header and metadata,
//! the subset hint, lifecycle and load release, bad input, health.

mod common;

use kvroute::epp::config::EppSettings;
use kvroute::epp::fake::FakePicker;
use kvroute::epp::metrics::EppMetrics;
use kvroute::epp::pick::{Life, Outcome};
use kvroute::epp::server::{self, EppServer};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/extproc_client.py");
const EPS: [(&str, &str); 3] = [
    ("w1", "127.0.0.1:18001"),
    ("w2", "127.0.0.1:18002"),
    ("w3", "127.0.0.1:18003"),
];

fn have_python() -> bool {
    common::python_has("grpc, envoy.service.ext_proc.v3", "grpcio xds-protos")
}

fn start(settings: EppSettings, picker: Arc<FakePicker>) -> (EppServer, Arc<EppMetrics>) {
    let metrics = Arc::new(EppMetrics::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = server::start(&settings, listener, picker, metrics.clone()).unwrap();
    (s, metrics)
}

/// Runs the scripts through the client; one JSON answer per script.
fn client(srv: &EppServer, scripts: Value) -> Vec<Value> {
    let mut child = Command::new("python3")
        .arg(CLIENT)
        .arg(srv.local_addr().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(scripts.to_string().as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "client failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn chat_body(prompt: &str) -> String {
    json!({"model": "m", "stream": true, "max_tokens": 16,
           "messages": [{"role": "user", "content": prompt}]})
    .to_string()
}

fn sse(texts: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = texts
        .iter()
        .map(|t| {
            format!(
                "data: {}\n\n",
                json!({"choices": [{"delta": {"content": t}}]})
            )
        })
        .collect();
    v.push("data: [DONE]\n\n".into());
    v
}

fn request(mode: &str, body: &str) -> Value {
    json!({"mode": mode, "body": body, "chunk": 7,
           "response": {"status": 200, "content_type": "text/event-stream",
                        "chunks": sse(&["a", "b", "c"]), "served": "127.0.0.1:18001"}})
}

fn endpoints() -> Vec<String> {
    EPS.iter().map(|(_, e)| e.to_string()).collect()
}

/// The lifecycle signals of one request id, in order.
fn life_of(p: &FakePicker, id: &str) -> Vec<Life> {
    p.log()
        .into_iter()
        .filter(|(i, _)| i == id)
        .map(|(_, l)| l)
        .collect()
}

#[test]
fn every_body_mode_routes_with_header_and_metadata_agreeing() {
    if !have_python() {
        return;
    }
    let picker = Arc::new(FakePicker::new(&EPS, 100));
    let (srv, metrics) = start(EppSettings::default(), picker.clone());
    let body = chat_body("hello there");
    let outs = client(
        &srv,
        json!([
            request("full_duplex", &body),
            request("buffered", &body),
            request("streamed", &body)
        ]),
    );
    for (o, mode) in outs.iter().zip(["full_duplex", "buffered", "streamed"]) {
        assert!(o.get("grpc_error").is_none(), "{mode}: {o}");
        let h = o["destination_header"].as_str().expect("header");
        assert_eq!(
            o["destination_metadata"], h,
            "{mode}: header and metadata differ"
        );
        assert!(endpoints().contains(&h.to_string()), "{mode}: {h}");
        assert_eq!(o["clear_route_cache"], true);
        assert_eq!(
            o["set_headers"]["x-kvroute-worker"]
                .as_str()
                .map(|w| w.len()),
            Some(2)
        );
    }
    // Full duplex hands the request and response bodies back whole.
    assert_eq!(outs[0]["request_body_back"], body);
    assert_eq!(
        outs[0]["response_body_back"],
        sse(&["a", "b", "c"]).concat()
    );
    // Each request: admitted (with the served endpoint), first token, progress, finish.
    let reqs = picker.requests();
    assert_eq!(reqs.len(), 3);
    let creq = reqs[0].request.as_ref().unwrap();
    assert_eq!((creq.model.as_str(), creq.max_tokens), ("m", Some(16)));
    for i in 1..=3 {
        let life = life_of(&picker, &format!("epp-fake-{i}"));
        assert_eq!(
            life,
            vec![
                Life::Admitted {
                    status: 200,
                    served: Some("127.0.0.1:18001".into())
                },
                Life::FirstToken,
                Life::Progress(1),
                Life::Progress(2),
                Life::Progress(3),
                Life::Finish(Outcome::Ok),
            ],
            "request {i}"
        );
    }
    assert_eq!(picker.total_load(), 0);
    assert_eq!(metrics.streams.get(), 0);
}

#[test]
fn the_same_prefix_lands_on_the_same_endpoint_and_the_subset_is_obeyed() {
    if !have_python() {
        return;
    }
    let picker = Arc::new(FakePicker::new(&EPS, 100));
    let (srv, metrics) = start(EppSettings::default(), picker.clone());
    let long = "the same long shared system prompt ".repeat(40);
    let mut scripts: Vec<Value> = (0..2)
        .map(|_| request("full_duplex", &chat_body(&long)))
        .collect();
    for (i, subset) in [
        json!(["127.0.0.1:18003"]),
        json!("127.0.0.1:18002, 10.9.9.9:1"),
        json!(["10.9.9.9:1"]),
        json!([]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = request("full_duplex", &chat_body(&format!("{i} {long}")));
        r["subset"] = subset;
        scripts.push(r);
    }
    let outs = client(&srv, Value::Array(scripts));
    assert_eq!(outs[0]["destination_header"], outs[1]["destination_header"]);
    assert_eq!(outs[2]["destination_header"], "127.0.0.1:18003");
    assert_eq!(outs[2]["destination_metadata"], "127.0.0.1:18003");
    assert_eq!(outs[3]["destination_header"], "127.0.0.1:18002");
    for o in &outs[4..] {
        assert_eq!(o["immediate"]["status"], 503, "{o}");
        assert_eq!(
            o["immediate"]["body"]["error"]["code"],
            "no_upstream_worker"
        );
        assert!(o.get("destination_header").is_none());
    }
    // 10.9.9.9:1 twice: ignored and counted.
    assert_eq!(metrics.subset_unknown.get(), 2);
    assert_eq!(picker.total_load(), 0);
}

#[test]
fn load_is_released_when_the_stream_ends_or_is_cut() {
    if !have_python() {
        return;
    }
    let picker = Arc::new(FakePicker::new(&EPS, 100));
    let (srv, _m) = start(EppSettings::default(), picker.clone());
    let mut cut_pick = request("full_duplex", &chat_body("a"));
    cut_pick["cut"] = json!("after_pick");
    let mut cut_resp = request("buffered", &chat_body("b"));
    cut_resp["cut"] = json!("after_response_headers");
    let mut trailers = request("full_duplex", &chat_body("c"));
    trailers["trailers"] = json!(true);
    trailers["response"]["trailers"] = json!(true);
    let outs = client(&srv, json!([cut_pick, cut_resp, trailers]));
    assert!(
        outs.iter().all(|o| o.get("grpc_error").is_none()),
        "{outs:?}"
    );
    assert_eq!(
        outs[2]["kinds"].as_array().unwrap().last().unwrap(),
        "response_trailers"
    );
    // The server notices a cut asynchronously: wait (bounded) for the release.
    let t0 = std::time::Instant::now();
    while picker.total_load() > 0 && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(picker.total_load(), 0);
    let last = |id: &str| life_of(&picker, id).last().cloned();
    assert_eq!(last("epp-fake-1"), Some(Life::Finish(Outcome::Cut)));
    assert_eq!(last("epp-fake-2"), Some(Life::Finish(Outcome::Cut)));
    assert_eq!(last("epp-fake-3"), Some(Life::Finish(Outcome::Ok)));
    for id in ["epp-fake-1", "epp-fake-2", "epp-fake-3"] {
        let finishes = life_of(&picker, id)
            .iter()
            .filter(|l| matches!(l, Life::Finish(_)))
            .count();
        assert_eq!(finishes, 1, "{id}");
    }
}

#[test]
fn bad_input_gets_a_clear_error_and_the_server_keeps_serving() {
    if !have_python() {
        return;
    }
    let picker = Arc::new(FakePicker::new(&EPS, 100));
    let settings = EppSettings {
        max_body_bytes: 4096,
        ..EppSettings::default()
    };
    let (srv, metrics) = start(settings, picker.clone());
    let huge = chat_body(&"x".repeat(5000));
    let outs = client(
        &srv,
        json!([
            {"op": "garbage"},
            {"mode": "full_duplex", "body": huge, "chunk": 1000},
            {"mode": "buffered", "body": huge},
            {"mode": "full_duplex", "body": "{}", "headers": {"content-type": "text/plain"}},
            {"mode": "none", "body": null},
            {"mode": "full_duplex", "body": "{\"model\": "},
            {"mode": "none", "body": chat_body("hi")},
            {"mode": "full_duplex", "body": "{\"prompt\": [1, -2]}", "path": "/v1/completions"},
            request("full_duplex", &chat_body("still serving")),
            {"op": "health", "service": ""},
            {"op": "health", "service": "liveness"},
            {"op": "health", "service": "readiness"},
            {"op": "health", "service": "envoy.service.ext_proc.v3.ExternalProcessor"},
        ]),
    );
    assert_eq!(
        outs[0]["grpc_error"]["code"], "INVALID_ARGUMENT",
        "{}",
        outs[0]
    );
    let status = |o: &Value| o["immediate"]["status"].as_i64();
    let code = |o: &Value| o["immediate"]["body"]["error"]["code"].clone();
    assert_eq!(
        (status(&outs[1]), code(&outs[1])),
        (Some(413), json!("request_too_large"))
    );
    assert_eq!(status(&outs[2]), Some(413));
    assert_eq!(
        (status(&outs[3]), code(&outs[3])),
        (Some(415), json!("unsupported_media_type"))
    );
    assert_eq!(status(&outs[4]), Some(400), "no body: {}", outs[4]);
    assert_eq!(status(&outs[5]), Some(400), "bad JSON: {}", outs[5]);
    assert_eq!(status(&outs[6]), Some(500), "body mode NONE: {}", outs[6]);
    assert_eq!(
        (status(&outs[7]), code(&outs[7])),
        (Some(400), json!("invalid_prompt"))
    );
    let ok = &outs[8];
    assert!(ok["destination_header"].is_string(), "{ok}");
    for h in &outs[9..] {
        assert_eq!(h["status"], "SERVING", "{h}");
    }
    for kind in [
        "undecodable",
        "too_large",
        "bad_content_type",
        "missing_body",
        "bad_request",
    ] {
        let n = metrics
            .errors
            .get_or_create(&kvroute::epp::metrics::KindLabel { kind })
            .get();
        assert!(n > 0, "{kind} not counted");
    }
    assert_eq!(picker.total_load(), 0);
}
