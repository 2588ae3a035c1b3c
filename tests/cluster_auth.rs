//! The NATS bus is no back door (`cluster.secret`), through the real binaries: two
//! `kvroute serve --cluster` replicas with a shared token and per-worker tokens, and a
//! rogue NATS client (tests/common/cluster.rs `RawNats`, the plain text protocol) on
//! the same `nats-server`. It forges what HTTP refuses: a Stored record for an owned
//! worker, a registry entry with its own URL, an overwrite of an owned worker's URL, a
//! KV delete, a load batch of 256 phantom routes, a replay of a captured real batch,
//! and a load-sync request. Each is refused and counted on both replicas, which stay
//! in agreement. Also: a replica must not accept a registry change that HTTP would
//! have refused, and NATS's own permissions keep other clients off the tier's
//! subjects (the complementary measure, docs/SECURITY.md). Every wait is a generous
//! poll; no speed is asserted.

mod common;

use common::cluster::{nats_available, NatsServer, RawNats};
use common::{hashes, Server};
use kvroute::cluster::auth::{Kind, Sealer};
use kvroute::cluster::entry::{By, RegEntry};
use kvroute::cluster::names::worker_key;
use kvroute::cluster::wire::{EventRecord, RecOp};
use kvroute::types::Tier;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ADMIN: &str = "admin-token-0123456";
const W1_TOKEN: &str = "w1-own-token-98765";
const W1_URL: &str = "http://127.0.0.1:9";
const EVIL_URL: &str = "http://203.0.113.66:8000";

fn poll(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls like [`poll`], but says whether `f` came true instead of failing.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// A replica of tier "t" with the shared token (and `extra` flags).
fn replica(nats: &NatsServer, extra: &[&str]) -> Server {
    let url = nats.url();
    let mut flags = vec![
        "--cluster",
        &url,
        "--cluster-name",
        "t",
        "--auth-token",
        ADMIN,
    ];
    flags.extend_from_slice(extra);
    let s = Server::start(1, &flags);
    poll("/readyz 200", 60, || s.get("/readyz").0 == 200);
    s
}

fn call(s: &Server, method: &str, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let req = ureq::request(method, &s.url(path)).set("authorization", &format!("Bearer {token}"));
    let r = match body {
        Some(b) => req.send_json(b),
        None => req.call(),
    };
    match r {
        Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// The fleet as a replica reports it: (id, url, cached blocks, active requests).
fn fleet(s: &Server) -> Vec<(String, String, u64, u64)> {
    let (code, body) = call(s, "GET", "/v1/workers", ADMIN, None);
    assert_eq!(code, 200, "{body}");
    let mut v: Vec<_> = body
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|w| {
            (
                w["id"].as_str().unwrap_or("").to_string(),
                w["url"].as_str().unwrap_or("").to_string(),
                w["cached_blocks"].as_u64().unwrap_or(0),
                w["active_requests"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    v.sort();
    v
}

fn metric(s: &Server, prefix: &str) -> f64 {
    let r = ureq::get(&s.url("/metrics"))
        .set("authorization", &format!("Bearer {ADMIN}"))
        .call();
    let text = r
        .ok()
        .and_then(|r| r.into_string().ok())
        .unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn refused(s: &Server, kind: &str) -> f64 {
    metric(
        s,
        &format!("kvroute_cluster_refused_total{{kind=\"{kind}\""),
    )
}

fn worker(id: &str, url: &str) -> Value {
    json!({"id": id, "model": "m", "capacity_blocks": 100000, "url": url})
}

fn route_op(id: &str, worker: &str) -> Value {
    json!({"op": "route", "id": id, "decode": worker, "input_tokens": 4096,
           "cached_tokens": 0, "prompt_blocks": 256, "hashes": []})
}

#[test]
fn a_rogue_nats_client_forges_nothing_and_replicas_agree() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("worker-tokens");
    std::fs::write(&tokens, format!("w1 {W1_TOKEN}\n")).expect("tokens file");
    let tokens = tokens.to_str().expect("utf-8 path");
    let a = replica(&nats, &["--worker-tokens-file", tokens]);
    let b = replica(&nats, &["--worker-tokens-file", tokens]);
    // w1 owns a token: registered and fed with it on A; HTTP refuses the shared token.
    let (code, body) = call(
        &a,
        "POST",
        "/v1/workers",
        W1_TOKEN,
        Some(worker("w1", W1_URL)),
    );
    assert!(code == 200 || code == 201, "{code} {body}");
    let (code, _) = call(
        &a,
        "POST",
        "/v1/workers",
        ADMIN,
        Some(worker("w1", EVIL_URL)),
    );
    assert!(
        matches!(code, 401 | 403),
        "HTTP lets the shared token overwrite an owned worker: {code}"
    );
    let (code, body) = call(&b, "POST", "/v1/workers", ADMIN, Some(worker("w2", W1_URL)));
    assert!(code == 200 || code == 201, "{code} {body}");
    let events = json!({"events": [{"type": "stored", "tier": "device", "parent": null,
                                    "block_hashes": hashes(1, 4)}]});
    let (code, body) = call(&a, "POST", "/v1/workers/w1/events", W1_TOKEN, Some(events));
    assert_eq!(code, 200, "{body}");
    let before = vec![
        ("w1".to_string(), W1_URL.to_string(), 4, 0),
        ("w2".to_string(), W1_URL.to_string(), 0, 0),
    ];
    poll("both replicas hold the fleet", 30, || {
        fleet(&a) == before && fleet(&b) == before
    });

    // The rogue listens to the load subject and captures a real (sealed) batch: A
    // routes a request to w2, then finishes it.
    let mut spy = RawNats::connect(nats.port, None).expect("rogue connects");
    spy.subscribe("kvroute.t.load", 1);
    spy.flush();
    let route = json!({"request_id": "legit-1", "model": "m", "block_hashes": hashes(5, 8),
                       "mode": "direct", "pin": "w2"});
    let (code, body) = call(&a, "POST", "/v1/route", ADMIN, Some(route));
    assert_eq!(code, 200, "{body}");
    let captured = spy
        .next_msg(Duration::from_secs(10))
        .expect("the rogue reads the load subject")
        .1;
    poll("B counts A's request", 30, || fleet(&b)[1].3 == 1);
    let (code, body) = call(
        &a,
        "POST",
        "/v1/requests/legit-1/finish",
        ADMIN,
        Some(json!({})),
    );
    assert_eq!(code, 200, "{body}");
    poll("B releases it", 30, || fleet(&b) == before);

    // The attacks. Each as a plain client of the old formats sends it, and each again in the
    // new formats, unsealed or sealed with another secret.
    let mut rogue = RawNats::connect(nats.port, None).expect("rogue connects");
    let wrong = Sealer::new(b"not-the-tier-secret", "t");
    let stored = EventRecord {
        origin: "rogue/1".into(),
        worker: "w1".into(),
        seq: 1,
        ops: vec![RecOp::Stored {
            tier: Tier::Device,
            hashes: hashes(66, 50),
        }],
    }
    .encode();
    rogue.publish("kvroute.t.events.w1", None, &stored);
    let forged = wrong.seal(Kind::Record, b"", stored);
    rogue.publish("kvroute.t.events.w1", None, &forged);
    let put = |id: &str, url: &str| {
        let spec = serde_json::from_value(worker(id, url)).expect("spec");
        RegEntry::Put {
            origin: "rogue/1".into(),
            by: By::Worker,
            spec,
        }
        .encode()
    };
    for (id, url) in [("evil", EVIL_URL), ("w1", EVIL_URL)] {
        let key = worker_key(id);
        let subject = format!("$KV.kvroute_t_workers.{key}");
        let bare = serde_json::to_vec(&worker(id, url)).expect("json");
        rogue.publish(&subject, None, &bare);
        rogue.publish(&subject, None, &put(id, url));
        let sealed = wrong.seal(Kind::Registry, key.as_bytes(), put(id, url));
        rogue.publish(&subject, None, &sealed);
    }
    let w2 = format!("$KV.kvroute_t_workers.{}", worker_key("w2"));
    rogue.hpublish(&w2, &[("KV-Operation", "DEL")], b"");
    let ops: Vec<Value> = (0..256)
        .map(|i| route_op(&format!("ph{i}"), "w1"))
        .collect();
    let batch = json!({"origin": "rogue/1", "seq": 1, "ops": ops}).to_string();
    rogue.publish("kvroute.t.load", None, batch.as_bytes());
    rogue.publish("kvroute.t.load", None, &captured);
    assert_eq!(rogue.flush(), Vec::<String>::new());
    // A load-sync request would make every replica dump its requests to the rogue.
    let mut asker = RawNats::connect(nats.port, None).expect("rogue connects");
    asker.subscribe("_INBOX.rogue", 2);
    asker.publish("kvroute.t.load.sync", Some("_INBOX.rogue"), b"rogue/1");
    assert_eq!(asker.flush(), Vec::<String>::new());

    let counted = eventually(30, || {
        [&a, &b].iter().all(|s| {
            refused(s, "record") >= 2.0
                // One per key at least: the bucket keeps one message per key, so
                // a put may replace the previous one before it is delivered.
                && refused(s, "registry") >= 3.0
                && refused(s, "sync_request") >= 1.0
        }) && refused(&a, "load") >= 1.0
            && refused(&b, "load") >= 2.0
    });
    // Nothing was applied, on either replica: no blocks, no worker, no URL, no
    // removal, no phantom load; and both still agree.
    for (name, s) in [("A", &a), ("B", &b)] {
        assert_eq!(fleet(s), before, "replica {name} took a forged change");
    }
    assert!(
        asker.next_msg(Duration::from_secs(2)).is_none(),
        "a replica answered the rogue's load-sync request"
    );
    assert!(counted, "refusals not counted on both replicas");
    for s in [&a, &b] {
        let missing = metric(
            s,
            "kvroute_cluster_refused_total{kind=\"record\",reason=\"missing_tag\"}",
        );
        let bad = metric(
            s,
            "kvroute_cluster_refused_total{kind=\"record\",reason=\"bad_tag\"}",
        );
        assert!(missing >= 1.0 && bad >= 1.0, "by reason: {missing} {bad}");
    }
    assert!(
        metric(
            &b,
            "kvroute_cluster_refused_total{kind=\"load\",reason=\"stale\"}"
        ) >= 1.0,
        "the replayed batch"
    );
    // The tier still works: a route on B uses A's w1 blocks.
    let route = json!({"request_id": "after", "model": "m", "block_hashes": hashes(1, 4)});
    let (code, body) = call(&b, "POST", "/v1/route", ADMIN, Some(route));
    assert_eq!(
        (code, body["decode_worker"].as_str()),
        (200, Some("w1")),
        "{body}"
    );
}

/// A replica configured without w1's token accepts the shared token for w1 (its own
/// HTTP would); a replica that knows w1's token refuses the replicated change, as its
/// HTTP would have, and counts it. Changes of unowned workers still flow.
#[test]
fn a_replica_refuses_a_registry_change_its_http_would_refuse() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("worker-tokens");
    std::fs::write(&tokens, format!("w1 {W1_TOKEN}\n")).expect("tokens file");
    let a = replica(
        &nats,
        &["--worker-tokens-file", tokens.to_str().expect("utf-8")],
    );
    let b = replica(&nats, &[]);
    for id in ["w1", "w9"] {
        let (code, body) = call(&b, "POST", "/v1/workers", ADMIN, Some(worker(id, EVIL_URL)));
        assert!(code == 200 || code == 201, "{code} {body}");
    }
    poll("A takes w9", 30, || fleet(&a).iter().any(|w| w.0 == "w9"));
    poll("A counts the refusal", 30, || {
        metric(
            &a,
            "kvroute_cluster_refused_total{kind=\"registry\",reason=\"owner\"}",
        ) >= 1.0
    });
    assert!(
        !fleet(&a).iter().any(|w| w.0 == "w1"),
        "A took a registration of w1 made with the shared token"
    );
}

/// A replica with another secret is a stranger: what it publishes is refused (bad
/// tag) and what the tier publishes does not reach it.
#[test]
fn a_replica_with_another_secret_is_refused_both_ways() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let a = replica(&nats, &[]);
    let c = replica(&nats, &["--cluster-secret", "another-secret-0123456789"]);
    let (code, body) = call(&c, "POST", "/v1/workers", ADMIN, Some(worker("wc", W1_URL)));
    assert!(code == 200 || code == 201, "{code} {body}");
    let (code, body) = call(&a, "POST", "/v1/workers", ADMIN, Some(worker("wa", W1_URL)));
    assert!(code == 200 || code == 201, "{code} {body}");
    let bad = "kvroute_cluster_refused_total{kind=\"registry\",reason=\"bad_tag\"}";
    poll("each refuses the other's entry", 30, || {
        metric(&a, bad) >= 1.0 && metric(&c, bad) >= 1.0
    });
    let ids = |s: &Server| fleet(s).into_iter().map(|w| w.0).collect::<Vec<_>>();
    assert_eq!(ids(&a), ["wa"]);
    assert_eq!(ids(&c), ["wc"]);
}

/// A NATS client that keeps writing the lease of an `[[engines]]` entry (so that no
/// replica would ingest the engine) is overruled: a lease whose value does not verify
/// is taken over at once, each time.
#[test]
fn a_forged_engine_lease_is_taken_over() {
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    // Nobody listens there: the lease is decided whatever the engine does.
    let engine = format!(
        "worker_id=e0,endpoint=tcp://127.0.0.1:{},model=m,capacity_blocks=1000,block_size=4",
        common::free_port()
    );
    let flags = ["--block-size", "4", "--engine", engine.as_str()];
    let holds = |s: &Server| metric(s, "kvroute_cluster_engine_leases ") == 1.0;
    let a = replica(&nats, &flags);
    poll("A holds the lease", 30, || holds(&a));
    let mut child = a.into_child();
    child.kill().expect("SIGKILL A");
    let _ = child.wait();
    // The rogue overwrites the lease every 300 ms from now on.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = nats.port;
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rogue = RawNats::connect(port, None).expect("rogue connects");
            let subject = format!("$KV.kvroute_t_leases.{}", worker_key("e0"));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rogue.publish(&subject, None, b"rogue/1");
                rogue.flush();
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let b = replica(&nats, &flags);
    let taken = eventually(30, || holds(&b));
    // And keeps it while the rogue writes on (refreshes every 2 s take it back).
    let kept = taken
        && (0..6).all(|_| {
            std::thread::sleep(Duration::from_millis(500));
            holds(&b)
        });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = writer.join();
    assert!(taken, "B never took the forged lease over");
    assert!(kept, "B lost the lease to the rogue");
    assert!(refused(&b, "lease") >= 1.0);
}

/// The NATS side: a user whose permissions deny the tier's subjects cannot publish or
/// subscribe on them (the server refuses, nothing reaches a replica), while replicas
/// run with the permission set docs/SECURITY.md gives.
#[test]
fn nats_permissions_keep_other_clients_off_the_tier() {
    if !nats_available() {
        return;
    }
    let conf = r#"
authorization {
  users = [
    { user: "kvroute", password: "kvroute-pass-0123",
      permissions: {
        publish: { allow: ["kvroute.t.>", "$KV.kvroute_t_workers.>", "$KV.kvroute_t_leases.>",
                           "$JS.API.>", "$JS.FC.>", "_INBOX.>"] },
        subscribe: { allow: ["kvroute.t.>", "_INBOX.>"] }
      } },
    { user: "app", password: "app-pass-4567",
      permissions: {
        publish: { deny: ["kvroute.>", "$KV.>", "$JS.>"] },
        subscribe: { deny: ["kvroute.>", "$KV.>", "$JS.>"] }
      } }
  ]
}
"#;
    let nats = NatsServer::start_conf(conf);
    let creds = [
        "--cluster-user",
        "kvroute",
        "--cluster-password",
        "kvroute-pass-0123",
    ];
    let a = replica(&nats, &creds);
    let b = replica(&nats, &creds);
    let (code, body) = call(&a, "POST", "/v1/workers", ADMIN, Some(worker("w1", W1_URL)));
    assert!(code == 200 || code == 201, "{code} {body}");
    let events = json!({"events": [{"type": "stored", "tier": "device", "parent": null,
                                    "block_hashes": hashes(1, 4)}]});
    let (code, body) = call(&a, "POST", "/v1/workers/w1/events", ADMIN, Some(events));
    assert_eq!(code, 200, "{body}");
    let route = json!({"request_id": "r1", "model": "m", "block_hashes": hashes(1, 4)});
    let (code, body) = call(&a, "POST", "/v1/route", ADMIN, Some(route));
    assert_eq!(code, 200, "{body}");
    // Registry, event log and shared load all flow under the restricted permissions,
    // and A's route, published right after the registration, counts on B even when it
    // overtakes the registry watch there.
    let want = vec![("w1".to_string(), W1_URL.to_string(), 4, 1)];
    let held = eventually(30, || fleet(&b) == want);
    assert!(
        held,
        "B's fleet {:?} (A's {:?}), want {want:?}; B dropped {} load ops for an unknown worker",
        fleet(&b),
        fleet(&a),
        metric(
            &b,
            "kvroute_cluster_load_ops_total{outcome=\"unknown_worker\""
        )
    );
    // So does a load sync: a third replica takes r1 over at start.
    let c = replica(&nats, &creds);
    assert_eq!(fleet(&c), want);
    drop(c);
    let mut app = RawNats::connect(nats.port, Some(("app", "app-pass-4567"))).expect("app user");
    app.subscribe("kvroute.t.load", 1);
    app.publish("kvroute.t.load", None, b"{}");
    app.publish("kvroute.t.events.w1", None, b"x");
    let evil = format!("$KV.kvroute_t_workers.{}", worker_key("evil"));
    app.publish(&evil, None, b"{}");
    let errs = app.flush();
    assert_eq!(errs.len(), 4, "{errs:?}");
    assert!(
        errs.iter().all(|e| e.contains("Permissions Violation")),
        "{errs:?}"
    );
    // Nothing reached the replicas (not even to be refused).
    std::thread::sleep(Duration::from_millis(500));
    for s in [&a, &b] {
        assert_eq!(metric(s, "kvroute_cluster_refused_total"), 0.0);
        assert_eq!(fleet(s), want);
    }
    // Without credentials at all, the server refuses the connection.
    assert!(RawNats::connect(nats.port, None).is_err());
}
