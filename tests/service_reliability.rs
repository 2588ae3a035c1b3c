//! Reliability and security of the running service: authentication, warm restart from
//! `--state-dir`, connection limits, wrong-worker publishing, graceful shutdown.

mod common;
use common::{hashes, req, spec, Server};
use kvroute::client::{ClientError, EventPublisher, RequestClient};
use kvroute::codec::{ErrorCode, WorkerBound};
use kvroute::types::Tier;
use serde_json::json;
use std::time::Duration;

#[test]
fn token_is_required_everywhere_when_set() {
    let s = Server::start(2, &["--auth-token", "s3cret"]);
    // Event port: wrong and missing token refused with Unauthorized.
    for bad in ["", "wrong"] {
        match EventPublisher::connect(&s.events, spec("w"), bad) {
            Err(ClientError::Router { code, .. }) => {
                assert_eq!(code, ErrorCode::Unauthorized.as_u16())
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted token {bad:?}"),
        }
        match RequestClient::connect(&s.api, bad) {
            Err(ClientError::Router { code, .. }) => {
                assert_eq!(code, ErrorCode::Unauthorized.as_u16())
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted token {bad:?}"),
        }
    }
    // HTTP: 401 without the bearer token, /healthz stays open for probes.
    let (code, _) = s.get("/v1/workers");
    assert_eq!(code, 401);
    let (code, _) = s.get("/metrics");
    assert_eq!(code, 401);
    let r = ureq::get(&s.url("/v1/workers"))
        .set("authorization", "Bearer s3cret")
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    // The right token works on both binary ports and routing goes on.
    let mut w = EventPublisher::connect(&s.events, spec("w"), "s3cret").unwrap();
    w.stored(Tier::Device, None, &hashes(1, 4));
    w.flush().unwrap();
    let mut c = RequestClient::connect(&s.api, "s3cret").unwrap();
    let mut d = c.route(&req("a", &hashes(1, 4))).unwrap();
    for _ in 0..100 {
        if d.overlap.device == 4 {
            break;
        }
        c.finish("a").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        d = c.route(&req("a", &hashes(1, 4))).unwrap();
    }
    assert_eq!((d.decode_worker.as_str(), d.overlap.device), ("w", 4));
}

#[test]
fn non_loopback_without_token_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["serve", "--http-addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("non-loopback"));
}

#[test]
fn a_connection_cannot_publish_for_another_worker() {
    let s = Server::start(2, &[]);
    let mut a = EventPublisher::connect(&s.events, spec("a"), "").unwrap();
    let mut b = EventPublisher::connect(&s.events, spec("b"), "").unwrap();
    b.stored(Tier::Device, None, &hashes(2, 3));
    b.flush().unwrap();
    s.wait_until("b indexed", |s| s.cached("b") == 3);
    // A second Hello on a's connection (trying to speak as "b") is a protocol violation.
    let mut hello = bytes::BytesMut::new();
    kvroute::codec::EventMsg::Hello(kvroute::codec::EventHello {
        auth_token: String::new(),
        spec: spec("b"),
    })
    .encode(&mut hello);
    a.send_raw(&hello).unwrap();
    match a.poll(Duration::from_secs(5)) {
        Ok(Some(WorkerBound::Error { code, .. })) => {
            assert_eq!(code, ErrorCode::ProtocolViolation.as_u16())
        }
        other => panic!("expected an error, got {other:?}"),
    }
    // b's state is untouched and it keeps publishing.
    b.stored(Tier::Device, None, &hashes(3, 2));
    b.flush().unwrap();
    s.wait_until("b still indexed", |s| s.cached("b") == 5);
}

#[test]
fn connection_flood_past_the_limit_is_refused_and_service_goes_on() {
    let s = Server::start(1, &["--max-connections", "8"]);
    // Every slot busy: eight live workers (none silent for the heartbeat timeout), so
    // connections past the limit are refused. (Idle or pre-handshake occupants would be
    // displaced instead: tests/conn_hardening.rs.)
    let workers: Vec<EventPublisher> = (0..8)
        .map(|i| EventPublisher::connect(&s.events, spec(&format!("w{i}")), "").unwrap())
        .collect();
    let mut held = Vec::new();
    for _ in 0..30 {
        if let Ok(c) = std::net::TcpStream::connect(&s.events) {
            held.push(c);
        }
    }
    s.wait_until("refusals counted", |s| {
        s.metric("kvroute_protocol_errors_total{kind=\"connection_limit\"}") >= 1.0
    });
    drop(held);
    drop(workers);
    std::thread::sleep(Duration::from_millis(200));
    EventPublisher::connect(&s.events, spec("again"), "").unwrap();
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    c.register(spec("w")).unwrap();
    assert!(c.route(&req("f", &hashes(4, 2))).is_ok());
}

#[test]
fn restart_from_state_dir_keeps_the_index_and_registry() {
    let dir = std::env::temp_dir().join(format!("kvroute-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap().to_string();
    let h = hashes(9, 12);
    {
        let s = Server::start(2, &["--state-dir", &d]);
        let mut w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
        let mut other = EventPublisher::connect(&s.events, spec("o"), "").unwrap();
        w.stored(Tier::Device, None, &h[..10]);
        w.stored(Tier::Host, None, &h[10..]);
        other.stored(Tier::Device, None, &h[..2]);
        w.flush().unwrap();
        other.flush().unwrap();
        s.register(json!({"id": "static", "capacity_blocks": 1000}));
        s.wait_until("index", |s| s.cached("w") == 12 && s.cached("o") == 2);
        // Server dropped here: SIGTERM → shutdown snapshot.
    }
    assert!(dir.join("kvroute.snapshot").exists());
    let s = Server::start(2, &["--state-dir", &d]);
    let ids: Vec<String> = s
        .workers()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    // The per-worker counts are the cores' published figures, which follow the
    // restore by a loop turn (the index itself is checked by the route below).
    s.wait_until("restored counts", |s| {
        s.cached("w") == 12 && s.cached("o") == 2
    });
    // Routing uses the restored index right away, before any worker reconnects.
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    let dec = c.route(&req("r", &h)).unwrap();
    assert_eq!(
        (
            dec.decode_worker.as_str(),
            dec.overlap.device,
            dec.overlap.host
        ),
        ("w", 10, 2)
    );
    c.finish("r").unwrap();
    // Same epoch on reconnect: kept, sequence resumes; new epoch: cleared.
    let w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    assert_eq!(w.seq(), 2);
    let mut o2 = spec("o");
    o2.epoch = 7;
    let _o = EventPublisher::connect(&s.events, o2, "").unwrap();
    s.wait_until("o cleared", |s| s.cached("o") == 0);
    assert_eq!(s.cached("w"), 12);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (active requests, prefill tokens, decode blocks) per worker, from GET /v1/workers.
fn loads(s: &Server) -> Vec<(String, u64, f64, f64)> {
    let mut v: Vec<_> = s
        .workers()
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap_or("").to_string(),
                w["active_requests"].as_u64().unwrap_or(u64::MAX),
                w["prefill_tokens"].as_f64().unwrap_or(-1.0),
                w["decode_blocks"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn state_dir(name: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("kvroute-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap().to_string();
    (dir, d)
}

/// Routes `n` requests (ids `r0..`) over two static workers, `a` caching a prefix.
fn route_some(s: &Server, c: &mut RequestClient, n: usize, h: &[u64]) {
    for i in 0..n {
        let mut r = req(&format!("r{i}"), &h[..4 + i]);
        r.expected_output_tokens = Some(64);
        c.route(&r).unwrap();
    }
    // One in decode with progress, one in decode without: both phases are carried.
    c.first_token("r0").unwrap();
    c.progress("r0", 300).unwrap();
    c.first_token("r1").unwrap();
    s.wait_until("load published", |s| {
        loads(s).iter().map(|l| l.1).sum::<u64>() == n as u64
    });
}

fn two_static_workers(s: &Server, h: &[u64]) {
    s.register(json!({"id": "a", "capacity_blocks": 10000}));
    s.register(json!({"id": "b", "capacity_blocks": 10000}));
    s.store("a", "device", &h[..6]);
    s.wait_until("a indexed", |s| s.cached("a") == 6);
}

/// After the restart: the load is the same, every restored request takes its lifecycle
/// calls (and only once), the load returns to zero, routing still uses the index.
fn check_restored(s: &Server, n: usize, before: &[(String, u64, f64, f64)], h: &[u64]) {
    s.wait_until("restored load published", |s| loads(s) == before);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    match c.route(&req("r2", &h[..3])) {
        Err(ClientError::Router { code, .. }) => {
            assert_eq!(code, ErrorCode::DuplicateRequest.as_u16())
        }
        other => panic!("a restored id must still be active: {other:?}"),
    }
    for i in 0..n {
        let id = format!("r{i}");
        c.first_token(&id).unwrap();
        c.progress(&id, 10).unwrap();
        c.finish(&id).unwrap();
        match c.finish(&id) {
            Err(ClientError::Router { code, .. }) => {
                assert_eq!(code, ErrorCode::UnknownRequest.as_u16())
            }
            other => panic!("second finish of {id}: {other:?}"),
        }
    }
    s.wait_until("load back to zero", |s| {
        loads(s)
            .iter()
            .all(|l| l.1 == 0 && l.2 == 0.0 && l.3 == 0.0)
    });
    let d = c.route(&req("after", &h[..6])).unwrap();
    assert_eq!((d.decode_worker.as_str(), d.overlap.device), ("a", 6));
    c.finish("after").unwrap();
}

#[test]
fn in_flight_requests_survive_a_graceful_restart_with_other_cores() {
    let (dir, d) = state_dir("inflight");
    let h = hashes(11, 12);
    let n = 6;
    let before = {
        let s = Server::start(2, &["--state-dir", &d]);
        two_static_workers(&s, &h);
        let mut c = RequestClient::connect(&s.api, "").unwrap();
        route_some(&s, &mut c, n, &h);
        let before = loads(&s);
        assert!(
            before.iter().any(|l| l.2 > 0.0),
            "some prefill load: {before:?}"
        );
        before
        // SIGTERM → calls refused, shutdown snapshot with the in-flight requests.
    };
    // Another core count: every request goes to its new owner core.
    let s = Server::start(4, &["--state-dir", &d]);
    check_restored(&s, n, &before, &h);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn state_moves_between_the_sharded_and_replicated_layouts() {
    let (dir, d) = state_dir("layout");
    let h = hashes(13, 12);
    let n = 6;
    let before = {
        let s = Server::start(2, &["--state-dir", &d]);
        two_static_workers(&s, &h);
        let mut c = RequestClient::connect(&s.api, "").unwrap();
        route_some(&s, &mut c, n, &h);
        loads(&s)
    };
    // Sharded → replicated: every core's copy gets every entry, the figures are
    // counted once, a restored id is still a duplicate whichever core is asked.
    {
        let s = Server::start(2, &["--state-dir", &d, "--index-layout", "replicated"]);
        s.wait_until("a restored", |s| s.cached("a") == 6);
        check_restored(&s, n, &before, &h);
    }
    // Replicated → sharded: one copy was written, so nothing is restored twice.
    let s = Server::start(2, &["--state-dir", &d]);
    s.wait_until("a restored", |s| s.cached("a") == 6);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    let r = c.route(&req("again", &h[..6])).unwrap();
    assert_eq!((r.decode_worker.as_str(), r.overlap.device), ("a", 6));
    c.finish("again").unwrap();
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn in_flight_requests_survive_a_crash_up_to_the_last_periodic_snapshot() {
    let (dir, d) = state_dir("crash");
    let h = hashes(12, 12);
    let n = 4;
    let s = Server::start(2, &["--state-dir", &d, "--snapshot-interval-ms", "100"]);
    two_static_workers(&s, &h);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    route_some(&s, &mut c, n, &h);
    let before = loads(&s);
    // Let a periodic snapshot see them, then die without a shutdown snapshot.
    std::thread::sleep(Duration::from_millis(600));
    let mut child = s.into_child();
    child.kill().unwrap();
    child.wait().unwrap();
    let s = Server::start(2, &["--state-dir", &d]);
    check_restored(&s, n, &before, &h);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_exits_zero() {
    let s = Server::start(2, &[]);
    let mut child = s.into_child();
    kvroute::process::sigterm(&child);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}
