//! The endpoint picker of the real binary: `kvroute serve --epp-addr` in front of
//! `kvroute-sim fleet` workers (registered with their urls, publishing their KV
//! events), asked by a client that speaks ext_proc as Envoy does
//! (tests/py/extproc_client.py: Envoy's protos from `xds-protos` over grpcio).
//! The pick follows the cached prefix as `/v1/route` does, the subset hint is obeyed,
//! refusals have their shapes, load rises while a stream is open and falls back to 0
//! when it ends or is cut, and SIGTERM drains: no new stream, the open one finishes.

mod common;

use common::fleet::{post, Fleet, FAST};
use common::{free_port, Server};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/extproc_client.py");

fn have_python() -> bool {
    common::python_has("grpc, envoy.service.ext_proc.v3", "grpcio xds-protos")
}

/// The client running `scripts` against `addr` (one JSON line per script).
fn spawn_client(addr: &str, scripts: Value) -> Child {
    let mut child = Command::new("python3")
        .arg(CLIENT)
        .arg(addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(scripts.to_string().as_bytes()).unwrap();
    child
}

fn outputs(child: Child) -> Vec<Value> {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "client failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn client(addr: &str, scripts: Value) -> Vec<Value> {
    outputs(spawn_client(addr, scripts))
}

/// A completion of token ids, streamed, with a response of two output chunks.
fn completion(tokens: &[u32]) -> Value {
    let body = json!({"model": "sim-model", "prompt": tokens, "max_tokens": 2, "stream": true});
    json!({"mode": "full_duplex", "path": "/v1/completions", "body": body.to_string(),
           "chunk": 64, "response": {"status": 200, "content_type": "text/event-stream",
           "chunks": ["data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
                      "data: {\"choices\":[{\"text\":\"b\"}]}\n\n", "data: [DONE]\n\n"]}})
}

/// `host:port` of a worker's url.
fn endpoint(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// A router with an EPP port, and a fleet of `n` workers registered with it.
fn start(n: usize, extra: &[&str]) -> (Server, Fleet, String) {
    let epp = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--block-size", "16", "--epp-addr", &epp];
    args.extend_from_slice(extra);
    let s = Server::start(2, &args);
    let f = Fleet::start(&[
        "--workers",
        &n.to_string(),
        "--events",
        "binary",
        "--router-events",
        &s.events,
        "--register",
        &s.http,
        "--block-size",
        "16",
        "--capacity-blocks",
        "16",
        "--timing",
        FAST,
    ]);
    s.wait_until("the fleet's workers", |s| s.workers().len() == n);
    (s, f, epp)
}

fn active(s: &Server) -> f64 {
    s.metric("kvroute_active_requests ")
}

#[test]
fn picks_follow_the_cache_obey_the_subset_and_release_their_load() {
    if !have_python() {
        return;
    }
    let (s, f, epp) = start(3, &["--busy-threshold", "0.5"]);
    let eps: Vec<String> = f.workers.iter().map(|w| endpoint(&w.url)).collect();
    // Worker 2 computes a prompt: its blocks reach the router as KV events.
    let cached: Vec<u32> = (1000..1048).collect();
    let (c, b) = post(
        &f.url(2, "/v1/completions"),
        json!({"model": "sim-model", "prompt": cached, "max_tokens": 1}),
    );
    assert_eq!(c, 200, "{b}");
    s.wait_until("worker 2's blocks", |s| s.cached("sim-2") >= 3);
    let mut longer = cached.clone();
    longer.extend(5000..5010);
    let (c, d) = s.post(
        "/v1/route",
        json!({"request_id": "r1", "model": "sim-model", "tokens": longer}),
    );
    assert_eq!(
        (c, d["decode_worker"].as_str()),
        (200, Some("sim-2")),
        "{d}"
    );
    let _ = s.post("/v1/requests/r1/finish", json!({}));
    // A new prefix twice: the second follows the first (speculative blocks).
    let fresh: Vec<u32> = (7000..7048).collect();
    let mut to_1 = completion(&cached);
    to_1["subset"] = json!([eps[1]]);
    let mut nobody = completion(&cached);
    nobody["subset"] = json!(["10.9.9.9:80"]);
    let mut unknown_model = completion(&cached);
    unknown_model["body"] = json!(json!({"model": "nope", "prompt": [1, 2, 3]}).to_string());
    let outs = client(
        &epp,
        json!([
            completion(&longer),
            completion(&fresh),
            completion(&fresh),
            to_1,
            nobody,
            unknown_model,
            {"op": "garbage"},
            completion(&longer)
        ]),
    );
    for o in outs.iter().take(4).chain(outs.last()) {
        assert_eq!(
            o["destination_header"], o["destination_metadata"],
            "header and metadata agree: {o}"
        );
        assert_eq!(o["response_body_back_eos"], true, "{o}");
    }
    assert_eq!(
        outs[0]["destination_header"],
        eps[2].as_str(),
        "as /v1/route"
    );
    assert_eq!(outs[1]["destination_header"], outs[2]["destination_header"]);
    assert_eq!(outs[3]["destination_header"], eps[1].as_str(), "subset");
    // No known endpoint in the subset; a model no worker serves.
    for o in &outs[4..6] {
        assert_eq!(o["immediate"]["status"], 503, "{o}");
        let e = &o["immediate"]["body"]["error"];
        assert_eq!(e["code"], "no_upstream_worker", "{o}");
    }
    assert_eq!(outs[6]["grpc_error"]["code"], "INVALID_ARGUMENT");
    assert_eq!(
        outs[7]["destination_header"],
        eps[2].as_str(),
        "still serving"
    );
    s.wait_until("every request finished", |s| active(s) == 0.0);
    assert_eq!(s.metric("kvroute_epp_finished_total{kind=\"ok\"}"), 5.0);

    // A request held open (the upstream generating) is load until its stream is cut;
    // with its worker busy, a request only it may serve is a 429.
    let big: Vec<u32> = (9000..9160).collect();
    let mut held = completion(&big);
    held["hold"] = json!(3.0);
    held["cut"] = json!("after_pick");
    held["subset"] = json!([eps[0]]);
    let holder = spawn_client(&epp, json!([held]));
    s.wait_until("the held request's load", |s| active(s) == 1.0);
    let mut after = completion(&(1..20).collect::<Vec<u32>>());
    after["subset"] = json!([eps[0]]);
    let outs = client(&epp, json!([after]));
    assert_eq!(outs[0]["immediate"]["status"], 429, "{}", outs[0]);
    assert_eq!(
        outs[0]["immediate"]["body"]["error"]["code"],
        "workers_busy"
    );
    assert_eq!(active(&s), 1.0);
    let outs = outputs(holder);
    assert_eq!(outs[0]["destination_header"], eps[0].as_str());
    assert_eq!(outs[0]["cut"], true);
    s.wait_until("the cut request's release", |s| active(s) == 0.0);
    assert_eq!(s.metric("kvroute_epp_finished_total{kind=\"cut\"}"), 1.0);
    assert!(s.metric("kvroute_epp_picks_total{worker=\"sim-2\"}") >= 2.0);
}

#[test]
fn sigterm_drains_refusing_new_streams_and_finishing_open_ones() {
    if !have_python() {
        return;
    }
    let (mut s, _f, epp) = start(1, &["--proxy-drain-ms", "10000"]);
    let mut held = completion(&(1..40).collect::<Vec<u32>>());
    held["hold"] = json!(2.0);
    let holder = spawn_client(&epp, json!([held]));
    s.wait_until("the held stream", |s| active(s) == 1.0);
    s.sigterm();
    std::thread::sleep(Duration::from_millis(300));
    let outs = client(
        &epp,
        json!([completion(&[1, 2, 3]), {"op": "health", "service": "readiness"}]),
    );
    assert_eq!(outs[0]["grpc_error"]["code"], "UNAVAILABLE", "{}", outs[0]);
    assert_eq!(outs[1]["status"], "NOT_SERVING");
    let outs = outputs(holder);
    assert!(outs[0].get("grpc_error").is_none(), "{}", outs[0]);
    assert_eq!(outs[0]["response_body_back_eos"], true, "{}", outs[0]);
    let st = s.exited_within(Duration::from_secs(10)).expect("exited");
    assert!(st.success(), "{st:?}");
}
