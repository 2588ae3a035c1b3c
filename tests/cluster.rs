//! Router replicas on NATS JetStream (`--cluster`), through the real binaries: a
//! `nats-server` with JetStream on a free loopback port (tests/common/cluster.rs) and
//! 2–3 `kvroute serve` replicas. Every wait is a generous poll; no speed is asserted.

mod common;

use common::cluster::{nats_available, NatsServer, RawNats};
use common::{hashes, Server};
use kvroute::client::EventPublisher;
use kvroute::types::Tier;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn worker(id: &str) -> Value {
    json!({"id": id, "role": "aggregated", "device": "gpu", "model": "m", "capacity_blocks": 100000})
}

fn replica(nats: &NatsServer, extra: &[&str]) -> Server {
    let url = nats.url();
    let mut flags = vec!["--cluster", &url, "--cluster-name", "t"];
    flags.extend_from_slice(extra);
    let s = Server::start(1, &flags);
    wait_ready(&s);
    s
}

fn poll(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn readyz(s: &Server) -> (u16, Value) {
    let (code, body) = s.get("/readyz");
    (code, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn wait_ready(s: &Server) {
    poll("/readyz 200", 60, || readyz(s).0 == 200);
}

/// The fleet as a replica reports it: (id, cached blocks), sorted.
fn fleet(s: &Server) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = s
        .workers()
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap_or("").to_string(),
                w["cached_blocks"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    v.sort();
    v
}

fn route(s: &Server, id: &str, h: &[u64]) -> Value {
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": id, "model": "m", "block_hashes": h}),
    );
    assert_eq!(code, 200, "route: {d}");
    d
}

#[test]
fn ingest_and_registry_on_one_replica_reach_the_others() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let a = replica(&nats, &[]);
    let b = replica(&nats, &[]);
    let (_, body) = readyz(&a);
    assert_eq!(body["cluster"]["state"], "ready", "{body}");
    // Registered on A: visible on B with the same spec.
    for w in ["w1", "w2", "w3"] {
        a.register(worker(w));
    }
    poll("B sees A's workers", 30, || b.workers().len() == 3);
    let spec_on = |s: &Server| {
        s.workers()
            .into_iter()
            .find(|w| w["id"] == "w2")
            .map(|w| (w["model"].clone(), w["capacity_blocks"].clone()))
    };
    assert_eq!(spec_on(&a), spec_on(&b));
    // JSON events on A are routable on B.
    let h = hashes(7, 12);
    a.store("w2", "device", &h);
    poll("B indexes A's JSON events", 30, || b.cached("w2") == 12);
    let d = route(&b, "r-json", &h);
    assert_eq!(d["decode_worker"], "w2", "{d}");
    let (code, _) = b.post("/v1/requests/r-json/finish", json!({}));
    assert_eq!(code, 200);
    // Binary events of a worker connected to B are routable on A.
    let mut spec = common::spec("wb");
    spec.model = "m".into();
    let mut p = EventPublisher::connect(&b.events, spec, "").expect("worker connects to B");
    let hb = hashes(9, 20);
    p.stored(Tier::Device, None, &hb);
    p.flush().expect("events sent");
    poll("A indexes B's binary events", 30, || a.cached("wb") == 20);
    let d = route(&a, "r-bin", &hb);
    assert_eq!(d["decode_worker"], "wb", "{d}");
    // A removal on A leaves B too.
    let (code, _) = a.delete("/v1/workers/w3");
    assert_eq!(code, 200);
    poll("B drops w3", 30, || {
        !b.workers().iter().any(|w| w["id"] == "w3")
    });
    poll("indexes equal", 30, || fleet(&a) == fleet(&b));
    assert!(a.metric("kvroute_cluster_records_total{outcome=\"applied\"}") >= 1.0);
    assert!(b.metric("kvroute_cluster_records_total{outcome=\"published\"}") >= 1.0);
    drop(p);
}

#[test]
fn killed_replica_restarts_and_catches_up_before_ready() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let state = tempfile::tempdir().expect("temp dir");
    let dir = state.path().to_str().expect("utf-8 path").to_string();
    let a = replica(&nats, &[]);
    let b_flags = ["--state-dir", &dir, "--snapshot-interval-ms", "300"];
    let b = replica(&nats, &b_flags);
    for w in ["w1", "w2"] {
        a.register(worker(w));
    }
    a.store("w1", "device", &hashes(1, 30));
    poll("B indexes w1", 30, || b.cached("w1") == 30);
    // In-flight requests: two routed by A, one by B.
    pinned(&a, "k1", "w1");
    pinned(&a, "k2", "w2");
    pinned(&b, "k3", "w1");
    poll("B counts A's load", 30, || load_of(&b, "w1").0 == 2);
    // Let B snapshot what it has, then SIGKILL it.
    poll("B snapshots", 30, || dir_has_seq(&dir));
    let mut child = b.into_child();
    child.kill().expect("SIGKILL B");
    let _ = child.wait();
    // A goes on alone, unaffected.
    a.store("w2", "device", &hashes(2, 40));
    a.store("w1", "device", &hashes(3, 5));
    a.register(worker("w3"));
    a.store("w3", "device", &hashes(4, 8));
    poll("A indexes", 30, || {
        a.cached("w3") == 8 && a.cached("w2") == 40
    });
    // Load changes while B is away: one request ends, one starts.
    let (code, _) = a.post("/v1/requests/k1/finish", json!({}));
    assert_eq!(code, 200);
    pinned(&a, "k4", "w3");
    assert_eq!(route(&a, "ra", &hashes(2, 40))["decode_worker"], "w2");
    // B comes back from its snapshot and replays the rest of the log; once /readyz
    // says ready, its index equals A's at once (no further waiting).
    let b = Server::start(
        1,
        &[
            "--cluster",
            &nats.url(),
            "--cluster-name",
            "t",
            "--state-dir",
            &dir,
        ],
    );
    wait_ready(&b);
    assert_eq!(fleet(&b), fleet(&a), "B ready before it caught up");
    for w in ["w1", "w2", "w3"] {
        assert_eq!(load_of(&b, w), load_of(&a, w), "B's load of {w} once ready");
    }
    assert_eq!(
        load_of(&a, "w1").0,
        1,
        "k3 (routed by the killed B) lives on in A"
    );
    // B's restored copy of k1, which ended while B was away, was released.
    let (code, _) = b.post("/v1/requests/k1/finish", json!({}));
    assert_eq!(code, 404);
    // A third replica with no state at all replays the whole log.
    let c = replica(&nats, &[]);
    assert_eq!(fleet(&c), fleet(&a), "C ready before it caught up");
    for w in ["w1", "w2", "w3"] {
        assert_eq!(load_of(&c, w), load_of(&a, w), "C's load of {w} once ready");
    }
    assert_eq!(route(&c, "rc", &hashes(4, 8))["decode_worker"], "w3");
}

fn pinned(s: &Server, id: &str, w: &str) {
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": id, "model": "m", "block_hashes": hashes(900, 8), "mode": "direct", "pin": w}),
    );
    assert_eq!(code, 200, "{d}");
}

fn dir_has_seq(dir: &str) -> bool {
    std::fs::read_to_string(std::path::Path::new(dir).join("cluster.seq"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

#[test]
fn nats_restart_mid_run_degrades_then_reconciles() {
    if !nats_available() {
        return;
    }
    let mut nats = NatsServer::start();
    let mut a = replica(&nats, &[]);
    let mut b = replica(&nats, &[]);
    a.register(worker("w1"));
    a.register(worker("w2"));
    a.store("w1", "device", &hashes(1, 10));
    poll("B indexes w1", 30, || b.cached("w1") == 10);
    nats.kill();
    poll("A reports degraded", 60, || {
        readyz(&a).1["cluster"]["state"] == "degraded"
    });
    // While NATS is down: A keeps routing and ingesting locally.
    let (code, body) = readyz(&a);
    assert_eq!(code, 200, "degraded is still ready: {body}");
    a.store("w2", "device", &hashes(2, 16));
    a.wait_until("A indexes locally", |s| s.cached("w2") == 16);
    assert_eq!(route(&a, "down", &hashes(2, 16))["decode_worker"], "w2");
    a.register(worker("w3"));
    std::thread::sleep(Duration::from_millis(500));
    nats.restart();
    // The buffered records and registration reach B; nobody crashed.
    poll("B reconciles", 90, || fleet(&b) == fleet(&a));
    assert!(a.alive() && b.alive());
    poll("A ready again", 60, || {
        readyz(&a).1["cluster"]["state"] == "ready"
    });
    assert_eq!(route(&b, "up", &hashes(2, 16))["decode_worker"], "w2");
}

/// A worker's active requests and decode blocks as a replica sees them.
fn load_of(s: &Server, id: &str) -> (u64, f64) {
    s.workers()
        .into_iter()
        .find(|w| w["id"] == id)
        .map(|w| {
            (
                w["active_requests"].as_u64().unwrap_or(0),
                w["decode_blocks"].as_f64().unwrap_or(0.0),
            )
        })
        .unwrap_or((0, 0.0))
}

#[test]
fn load_is_shared_and_lifecycle_works_on_any_replica() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let a = replica(&nats, &[]);
    let b = replica(&nats, &[]);
    a.register(worker("w1"));
    a.register(worker("w2"));
    poll("B sees the fleet", 30, || b.workers().len() == 2);
    // A routes three requests to w1 (pinned); B's view counts them.
    for i in 0..3 {
        let (code, d) = a.post(
            "/v1/route",
            json!({"request_id": format!("a{i}"), "model": "m", "block_hashes": hashes(100 + i, 16), "mode": "direct", "pin": "w1"}),
        );
        assert_eq!(code, 200, "{d}");
    }
    poll("B counts A's requests", 30, || load_of(&b, "w1").0 == 3);
    assert_eq!(load_of(&b, "w1"), load_of(&a, "w1"));
    // So B, with no cache anywhere, sends a new request to the idle worker.
    let d = route(&b, "b0", &hashes(500, 16));
    assert_eq!(d["decode_worker"], "w2", "{d}");
    poll("A counts B's request", 30, || load_of(&a, "w2").0 == 1);
    // Lifecycle calls on B for A's requests work, and release the load everywhere.
    for i in 0..3 {
        let id = format!("a{i}");
        let (code, body) = b.post(&format!("/v1/requests/{id}/first_token"), json!({}));
        assert_eq!(code, 200, "{body}");
        let (code, body) = b.post(&format!("/v1/requests/{id}/finish"), json!({}));
        assert_eq!(code, 200, "{body}");
    }
    // And A finishes B's request.
    let (code, body) = a.post("/v1/requests/b0/finish", json!({}));
    assert_eq!(code, 200, "{body}");
    for s in [&a, &b] {
        poll("load released", 30, || {
            load_of(s, "w1") == (0, 0.0) && load_of(s, "w2") == (0, 0.0)
        });
    }
    // A finished request is gone everywhere: a second finish is unknown on both.
    for s in [&a, &b] {
        let (code, _) = s.post("/v1/requests/a0/finish", json!({}));
        assert_eq!(code, 404);
    }
}

/// Publishes raw payloads on NATS subjects over the plain text protocol.
fn nats_pub(nats: &NatsServer, msgs: &[(&str, &[u8])]) {
    let mut c = RawNats::connect(nats.port, None).expect("nats");
    for (subj, payload) in msgs {
        c.publish(subj, None, payload);
    }
    assert_eq!(c.flush(), Vec::<String>::new());
}

#[test]
fn garbage_on_the_shared_subjects_changes_nothing() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let mut a = replica(&nats, &[]);
    a.register(worker("w1"));
    a.store("w1", "device", &hashes(1, 4));
    let huge_count = {
        // A record claiming 2^32-1 hashes with none behind them.
        let mut r = vec![1u8, 1, b'x', 2, b'w', b'1'];
        r.extend_from_slice(&1u64.to_le_bytes());
        r.extend_from_slice(&1u32.to_le_bytes());
        r.extend_from_slice(&[0, 0]);
        r.extend_from_slice(&u32::MAX.to_le_bytes());
        r
    };
    nats_pub(
        &nats,
        &[
            ("kvroute.t.events.w1", b"not a record"),
            ("kvroute.t.events.w1", &huge_count),
            ("kvroute.t.events.w1", &[]),
            ("kvroute.t.load", b"{\"origin\":\"x\",\"ops\":[{\"op\":\"finish\"}]}"),
            ("kvroute.t.load", b"\xff\xfe"),
            (
                "kvroute.t.load",
                b"{\"origin\":\"x\",\"ops\":[{\"op\":\"route\",\"id\":\"z\",\"decode\":\"nobody\",\"input_tokens\":1,\"cached_tokens\":0,\"prompt_blocks\":1,\"hashes\":[1]}]}",
            ),
            ("$KV.kvroute_t_workers.w.7a", b"{\"id\": 5}"),
        ],
    );
    // None of it carries the tier's tag: refused before it is even parsed.
    let refused = |kind: &str| {
        a.metric(&format!(
            "kvroute_cluster_refused_total{{kind=\"{kind}\",reason=\"missing_tag\"}}"
        ))
    };
    poll("A refused the bad records", 30, || refused("record") >= 3.0);
    poll("A refused the bad load batches", 30, || {
        refused("load") >= 3.0
    });
    poll("A refused the bad registry entry", 30, || {
        refused("registry") >= 1.0
    });
    assert!(a.alive());
    assert_eq!(fleet(&a), vec![("w1".to_string(), 4)]);
    // A replica starting now replays the same log and ends in the same state.
    let b = replica(&nats, &[]);
    assert_eq!(fleet(&b), fleet(&a));
    assert_eq!(route(&b, "g", &hashes(1, 4))["decode_worker"], "w1");
}

/// The vLLM publisher of tests/py (pyzmq + msgspec), one engine: commands on stdin.
struct Engine {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    port: u16,
}

impl Engine {
    fn start() -> Engine {
        use std::process::{Command, Stdio};
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/vllm_publisher.py");
        let mut child = Command::new("python3")
            .args([script, "positional", "int", "0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn python3");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut e = Engine {
            child,
            stdin,
            stdout,
            port: 0,
        };
        let ready = e.line();
        let port = ready
            .strip_prefix("ready ")
            .and_then(|r| r.split(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("publisher did not start: {ready:?}"));
        e.port = port;
        e
    }

    fn line(&mut self) -> String {
        use std::io::BufRead;
        let mut s = String::new();
        self.stdout.read_line(&mut s).expect("publisher output");
        s.trim().to_owned()
    }

    fn cmd(&mut self, c: Value) {
        use std::io::Write;
        writeln!(self.stdin, "{c}").expect("publisher stdin");
        self.stdin.flush().expect("publisher stdin");
        assert_eq!(self.line(), "ok", "publisher command {c}");
    }

    fn store(&mut self, names: &[&str], tokens: &[u32]) {
        self.cmd(
            json!({"op": "store", "engine": 0, "blocks": names, "parent": null,
            "tokens": tokens, "block_size": 4, "medium": "GPU"}),
        );
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        use std::io::Write;
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        kvroute::process::wait_or_kill(&mut self.child, Duration::from_secs(5));
    }
}

fn published(s: &Server) -> f64 {
    s.metric("kvroute_cluster_records_total{outcome=\"published\"}")
}

#[test]
fn one_replica_ingests_each_engine_and_a_standby_takes_over() {
    if !nats_available() || !common::python_has("zmq, msgspec", "pyzmq msgspec") {
        return;
    }
    let nats = NatsServer::start();
    let mut engine = Engine::start();
    let flag = format!(
        "worker_id=e0,endpoint=tcp://127.0.0.1:{},model=m,capacity_blocks=1000,block_size=4",
        engine.port
    );
    let extra = ["--block-size", "4", "--engine", flag.as_str()];
    let a = replica(&nats, &extra);
    let b = replica(&nats, &extra);
    engine.cmd(json!({"op": "wait_sub", "engine": 0}));
    let holds = |s: &Server| s.metric("kvroute_cluster_engine_leases") == 1.0;
    poll("one replica holds the lease", 30, || holds(&a) || holds(&b));
    // Both replicas subscribe; give the standby's subscription time to land.
    std::thread::sleep(Duration::from_millis(500));
    let (holder, standby) = if holds(&a) { (a, b) } else { (b, a) };
    assert!(!holds(&standby));
    let toks: Vec<u32> = (0..16).collect();
    engine.store(&["a0", "a1", "a2", "a3"], &toks);
    poll("both index the engine", 30, || {
        holder.cached("e0") == 4 && standby.cached("e0") == 4
    });
    // Only the holder put the engine's batches into the log (its publish count rises
    // when the acknowledgement arrives, which may be after the standby applied it).
    poll("the holder publishes", 30, || published(&holder) >= 1.0);
    assert_eq!(
        published(&standby),
        0.0,
        "the standby published engine batches"
    );
    // The holder dies; the standby takes the lease over once it expired, and ingests.
    let mut child = holder.into_child();
    child.kill().expect("SIGKILL the holder");
    let _ = child.wait();
    poll("the standby takes over", 60, || holds(&standby));
    let more: Vec<u32> = (100..108).collect();
    engine.store(&["b0", "b1"], &more);
    poll("the standby ingests", 30, || standby.cached("e0") == 6);
    // Published after it ingested (the publisher acknowledges asynchronously).
    poll("the standby publishes", 30, || published(&standby) >= 1.0);
}
