//! End-to-end ZMQ ingest of the positional encoding (`array_like` events, vLLM before
//! 2026), which today's engines no longer publish: Python publishers re-declaring
//! vLLM's older `KVEventBatch` (pyzmq + msgspec, `tests/py/vllm_publisher.py`) feed a
//! real `kvroute serve --engine ...`, and routing over HTTP must follow the published
//! cache state — int hashes, chained events, removals, LoRA salting, and a replay
//! after an injected gap. The map encoding of vLLM 0.33 and SGLang 0.5.23 is checked
//! with their own publishers (tests/engine_conformance.rs, tests/engine_streams.rs).
//!
//! Skipped (with a message) when `python3 -c "import zmq, msgspec"` fails, except under
//! `CI=true`, where that is a failure; CI installs them with `pip install pyzmq msgspec`.

mod common;
use common::Server;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const BS: u32 = 4;

fn python_ok() -> bool {
    common::python_has("zmq, msgspec", "pyzmq msgspec")
}

struct Publisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Publisher {
    /// One engine per entry of `replay` (with a replay socket where true), each bound
    /// to a port the OS picks; returns the publisher and (pub port, replay port?) per
    /// engine, as the script reports them.
    fn start(
        encoding: &str,
        hashes: &str,
        replay: &[bool],
    ) -> (Publisher, Vec<(u16, Option<u16>)>) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/vllm_publisher.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script).arg(encoding).arg(hashes);
        for &r in replay {
            cmd.arg(if r { "0:0" } else { "0" });
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn python3");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut p = Publisher {
            child,
            stdin,
            stdout,
        };
        let ready = p.line();
        let ports = ready
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("publisher did not start: {ready:?}"))
            .split(' ')
            .map(|e| {
                let (pub_port, replay) = e.split_once(':').expect("pub:replay");
                (
                    pub_port.parse().expect("pub port"),
                    (!replay.is_empty()).then(|| replay.parse().expect("replay port")),
                )
            })
            .collect();
        (p, ports)
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.stdout.read_line(&mut s).unwrap();
        s.trim().to_owned()
    }

    fn cmd(&mut self, c: Value) {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        assert_eq!(self.line(), "ok", "publisher command {c}");
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        kvroute::process::wait_or_kill(&mut self.child, std::time::Duration::from_secs(5));
    }
}

/// A prompt of `blocks` complete blocks, distinct per `seed`.
fn prompt(seed: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * BS).map(|i| seed * 10_000 + i).collect()
}

fn store(p: &mut Publisher, engine: usize, names: &[&str], parent: Option<&str>, tokens: &[u32]) {
    p.cmd(
        json!({"op": "store", "engine": engine, "blocks": names, "parent": parent,
                  "tokens": tokens, "block_size": BS, "medium": "GPU"}),
    );
}

fn route(s: &Server, id: &str, tokens: &[u32]) -> Value {
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": id, "model": "m", "tokens": tokens, "explain": true}),
    );
    assert_eq!(code, 200, "route: {d}");
    let (code, b) = s.post(&format!("/v1/requests/{id}/finish"), json!({}));
    assert_eq!(code, 200, "{b}");
    d
}

fn overlap_on(d: &Value, worker: &str) -> u64 {
    d["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["worker"] == worker)
        .and_then(|c| c["overlap"]["device"].as_u64())
        .unwrap_or(0)
}

fn engine_flag(id: &str, port: u16, replay: Option<u16>) -> String {
    let mut f = format!(
        "worker_id={id},endpoint=tcp://127.0.0.1:{port},model=m,capacity_blocks=1000,block_size={BS}"
    );
    if let Some(r) = replay {
        f.push_str(&format!(",replay_endpoint=tcp://127.0.0.1:{r}"));
    }
    f
}

fn stream_metric(s: &Server, worker: &str, kind: &str) -> f64 {
    s.metric(&format!(
        "kvroute_engine_stream_total{{worker=\"{worker}\",kind=\"{kind}\"}}"
    ))
}

fn start_fleet(encoding: &str, hashes: &str, replay: bool) -> (Publisher, Server) {
    let (p, ports) = Publisher::start(encoding, hashes, &[replay, replay]);
    let e0 = engine_flag("w0", ports[0].0, ports[0].1);
    let e1 = engine_flag("w1", ports[1].0, ports[1].1);
    let s = Server::start(2, &["--block-size", "4", "--engine", &e0, "--engine", &e1]);
    let mut p = p;
    for e in 0..2 {
        p.cmd(json!({"op": "wait_sub", "engine": e}));
    }
    (p, s)
}

/// Both workers get a prompt; routing follows; a chained continuation and a removal
/// are reflected. Returns the running pair for scenario-specific checks.
fn common_scenario(p: &mut Publisher, s: &Server) {
    let a = prompt(1, 4);
    let b = prompt(2, 3);
    store(p, 0, &["a0", "a1"], None, &a[..8]);
    store(p, 0, &["a2", "a3"], Some("a1"), &a[8..]);
    store(p, 1, &["b0", "b1", "b2"], None, &b);
    s.wait_until("stored blocks", |s| {
        s.cached("w0") == 4 && s.cached("w1") == 3
    });
    let d = route(s, "ra", &a);
    assert_eq!(d["decode_worker"], "w0", "{d}");
    assert_eq!(
        overlap_on(&d, "w0"),
        4,
        "chained event continues the hash chain: {d}"
    );
    let d = route(s, "rb", &b);
    assert_eq!(d["decode_worker"], "w1", "{d}");
    assert_eq!(overlap_on(&d, "w1"), 3);
    // Removing w0's last two blocks leaves a 2-block prefix.
    p.cmd(json!({"op": "remove", "engine": 0, "blocks": ["a2", "a3"], "medium": "GPU"}));
    s.wait_until("removal", |s| s.cached("w0") == 2);
    assert_eq!(overlap_on(&route(s, "ra2", &a), "w0"), 2);
    // A LoRA prompt never matches the same tokens without the adapter.
    let l = prompt(3, 2);
    p.cmd(
        json!({"op": "store", "engine": 1, "blocks": ["l0", "l1"], "parent": null,
                  "tokens": l, "block_size": BS, "medium": "GPU", "lora_name": "sql"}),
    );
    s.wait_until("lora blocks", |s| s.cached("w1") == 5);
    assert_eq!(overlap_on(&route(s, "rl", &l), "w1"), 0);
    let salted = kvroute::engines::salted_sequence_hashes(&l, BS as usize, Some("sql"));
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": "rl2", "model": "m", "block_hashes": salted, "explain": true}),
    );
    assert_eq!(code, 200);
    assert_eq!(d["decode_worker"], "w1", "{d}");
    assert_eq!(overlap_on(&d, "w1"), 2);
}

#[test]
fn positional_int_hashes_with_replay_after_gap() {
    if !python_ok() {
        return;
    }
    let (mut p, s) = start_fleet("positional", "int", true);
    common_scenario(&mut p, &s);
    // Inject a gap: one batch is only in the replay buffer, the next is published.
    let c = prompt(4, 2);
    let d2 = prompt(5, 2);
    p.cmd(
        json!({"op": "store", "engine": 0, "blocks": ["c0", "c1"], "parent": null,
                  "tokens": c, "block_size": BS, "medium": "GPU", "lost": true}),
    );
    store(&mut p, 0, &["d0", "d1"], None, &d2);
    s.wait_until("replayed blocks", |s| s.cached("w0") == 6);
    assert_eq!(stream_metric(&s, "w0", "gap"), 1.0);
    assert_eq!(stream_metric(&s, "w0", "replay"), 1.0);
    assert_eq!(stream_metric(&s, "w0", "clear"), 0.0);
    assert_eq!(stream_metric(&s, "w0", "replay_failure"), 0.0);
    let d = route(&s, "rc", &c);
    assert_eq!(
        d["decode_worker"], "w0",
        "the lost batch came back by replay: {d}"
    );
    assert_eq!(overlap_on(&d, "w0"), 2);
    // AllBlocksCleared empties the worker.
    p.cmd(json!({"op": "clear", "engine": 0}));
    s.wait_until("cleared", |s| s.cached("w0") == 0);
    // a0-a1, a2-a3, remove, c (replayed), d, clear.
    assert_eq!(stream_metric(&s, "w0", "batch"), 6.0);
    // The replay serves c and d; the live d that revealed the gap is then a duplicate.
    assert_eq!(stream_metric(&s, "w0", "replayed_batch"), 2.0);
    assert_eq!(stream_metric(&s, "w0", "duplicate"), 1.0);
}
