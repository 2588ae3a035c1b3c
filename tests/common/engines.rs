//! The real vLLM 0.33.0 and SGLang 0.5.23 publishers (tests/py/engine_publishers.py,
//! their own `kv_events.py` loaded from the wheels `.ci/engine_sources` extracted)
//! against a running `kvroute serve --engine ...`, for the conformance suites
//! (tests/engine_conformance.rs, tests/engine_streams.rs).

#![allow(dead_code)]

use crate::common::Server;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Tokens per block in every conformance test (router and engines).
pub const BS: u32 = 4;

fn sources() -> PathBuf {
    match std::env::var_os("KVROUTE_ENGINE_SOURCES") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/kvroute/engines"),
    }
}

/// Whether the engines' sources and python modules are here. Without them the test
/// is skipped with a message, except under CI, where `.ci/run` provides them.
pub fn available() -> bool {
    let files = [
        "vllm-0.33.0/vllm/distributed/kv_events.py",
        "sglang-0.5.23/sglang/srt/disaggregation/kv_events.py",
    ];
    let have = files.iter().all(|f| sources().join(f).is_file());
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    if !have {
        assert!(
            !ci,
            "CI is set but the engine sources are missing: run .ci/engine_sources"
        );
        eprintln!("SKIPPED: engine sources missing (run .ci/engine_sources)");
        return false;
    }
    crate::common::python_has("zmq, msgspec, pydantic", "pyzmq msgspec pydantic")
}

/// The publisher process: engines by name.
pub struct Engines {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Ports an engine bound: PUB and, with one, its replay ROUTER.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub pub_port: u16,
    pub replay: Option<u16>,
}

impl Engines {
    pub fn new() -> Engines {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/engine_publishers.py");
        let mut child = Command::new("python3")
            .arg(script)
            .env("KVROUTE_ENGINE_SOURCES", sources())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn python3");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Engines {
            child,
            stdin,
            stdout,
        }
    }

    fn call(&mut self, c: Value) -> Value {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(line.trim()).unwrap_or(Value::Null);
        assert!(v.get("error").is_none() && !v.is_null(), "{c} -> {line}");
        v
    }

    /// Starts engine `name` (`vllm` or `sglang`) of data-parallel rank `rank`, on free
    /// ports or the given ones (a restart).
    pub fn start(
        &mut self,
        name: &str,
        engine: &str,
        rank: u32,
        replay: bool,
        at: Option<Ports>,
    ) -> Ports {
        let mut c = json!({"op": "start", "name": name, "engine": engine,
                           "dp_rank": rank, "replay": replay});
        if let Some(p) = at {
            c["port"] = json!(p.pub_port);
            c["replay_port"] = json!(p.replay);
        }
        let v = self.call(c);
        Ports {
            pub_port: v["pub"].as_u64().unwrap() as u16,
            replay: v["replay"].as_u64().map(|p| p as u16),
        }
    }

    /// Publishes one batch of the engine's own event classes.
    pub fn publish(&mut self, name: &str, events: Vec<Value>) {
        self.call(json!({"op": "publish", "name": name, "events": events}));
    }

    /// Publishes one batch that only reaches the replay buffer (a gap).
    pub fn publish_lost(&mut self, name: &str, events: Vec<Value>) {
        self.call(json!({"op": "publish", "name": name, "events": events, "lost": true}));
    }

    pub fn stop(&mut self, name: &str) {
        self.call(json!({"op": "stop", "name": name}));
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        kvroute::process::wait_or_kill(&mut self.child, Duration::from_secs(10));
    }
}

/// The `--engine` flag of worker `id` on `p`, with extra `key=value` pairs.
pub fn flag(id: &str, p: Ports, extra: &str) -> String {
    let mut f = format!(
        "worker_id={id},endpoint=tcp://127.0.0.1:{},model=m,capacity_blocks=1000,block_size={BS}",
        p.pub_port
    );
    if let Some(r) = p.replay {
        f.push_str(&format!(",replay_endpoint=tcp://127.0.0.1:{r}"));
    }
    if !extra.is_empty() {
        f.push(',');
        f.push_str(extra);
    }
    f
}

/// `kvroute_engine_stream_total` of `worker` and `kind`.
pub fn stream(s: &Server, worker: &str, kind: &str) -> f64 {
    s.metric(&format!(
        "kvroute_engine_stream_total{{worker=\"{worker}\",kind=\"{kind}\"}}"
    ))
}

/// Publishes empty batches until kvroute has received one from `name` (a PUB socket
/// drops what it sends before the subscription arrives). Bounded: 10 s.
pub fn sync(e: &mut Engines, s: &Server, name: &str, worker: &str) {
    let before = stream(s, worker, "batch");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        e.publish(name, vec![]);
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            if stream(s, worker, "batch") > before {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(Instant::now() < deadline, "{worker} never received a batch");
    }
}

/// Publishes `events` and waits until kvroute applied the batch (its batch counter).
pub fn send(e: &mut Engines, s: &Server, name: &str, worker: &str, events: Vec<Value>) {
    let before = stream(s, worker, "batch");
    e.publish(name, events);
    s.wait_until("the batch", |s| stream(s, worker, "batch") > before);
}

/// A prompt of `blocks` complete blocks, distinct per `seed`.
pub fn prompt(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BS).map(|i| seed * 10_000 + i).collect()
}

/// `BlockStored` of `hashes` (engine hashes) for `tokens`, with extra fields.
pub fn stored(hashes: &[i64], parent: Option<i64>, tokens: &[u32], extra: Value) -> Value {
    let mut e = json!({"type": "BlockStored", "block_hashes": hashes,
                       "parent_block_hash": parent, "token_ids": tokens,
                       "block_size": BS});
    if let (Some(o), Some(x)) = (e.as_object_mut(), extra.as_object()) {
        o.extend(x.clone());
    }
    e
}

/// `BlockRemoved` of `hashes`, with extra fields.
pub fn removed(hashes: &[i64], extra: Value) -> Value {
    let mut e = json!({"type": "BlockRemoved", "block_hashes": hashes});
    if let (Some(o), Some(x)) = (e.as_object_mut(), extra.as_object()) {
        o.extend(x.clone());
    }
    e
}

/// `/v1/route` by tokens with extra fields; the decision (the request is finished).
pub fn route(s: &Server, id: &str, tokens: &[u32], extra: Value) -> Value {
    let mut body = json!({"request_id": id, "model": "m", "tokens": tokens, "explain": true});
    if let (Some(o), Some(x)) = (body.as_object_mut(), extra.as_object()) {
        o.extend(x.clone());
    }
    let (code, d) = s.post("/v1/route", body);
    assert_eq!(code, 200, "route: {d}");
    let (code, b) = s.post(&format!("/v1/requests/{id}/finish"), json!({}));
    assert_eq!(code, 200, "{b}");
    d
}

/// The overlap of `worker` in a decision with `explain` (zeros if absent).
pub fn overlap(d: &Value, worker: &str) -> Value {
    d["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["worker"] == worker))
        .map(|c| c["overlap"].clone())
        .unwrap_or(json!({"device": 0, "host": 0, "disk": 0, "shared": 0}))
}

/// `(device, host, disk)` overlap of `worker` for `tokens` routed with `extra`.
pub fn tiers(s: &Server, id: &str, worker: &str, tokens: &[u32], extra: Value) -> (u64, u64, u64) {
    let o = overlap(&route(s, id, tokens, extra), worker);
    let n = |k: &str| o[k].as_u64().unwrap_or(0);
    (n("device"), n("host"), n("disk"))
}
