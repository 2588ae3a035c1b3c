//! Identity and ownership hardening, against the real
//! `kvroute serve` binary over loopback:
//! - one process per port (no split brain between two routers);
//! - registration stays linear (4,096 workers with maximum-size specs);
//! - per-worker credentials, conflicting registrations refused, liveness never
//!   switched off by a registration;
//! - the per-worker limit and the global index budget enforced exactly.

mod common;
use common::ident::{call, max_spec, refused, spec_json, store_and_settle, wait_exit, Stop};
use common::{hashes, req, spec, Server};
use kvroute::client::{EventPublisher, RequestClient};
use kvroute::codec::ErrorCode;
use kvroute::types::Tier;
use std::process::{Command, Stdio};
use std::time::Duration;

// ---------------------------------------------------------------------- split brain

#[test]
fn second_instance_on_the_same_ports_exits_and_the_first_keeps_serving() {
    let s = Server::start(2, &[]);
    s.register(serde_json::json!({"id": "w1", "capacity_blocks": 100}));
    // Same three ports; only the events port would be enough, all three must be refused.
    for (taken, port) in [
        ("events", s.events.clone()),
        ("api", s.api.clone()),
        ("http", s.http.clone()),
    ] {
        let free = |a: &str| {
            if a == port {
                a.to_string()
            } else {
                "127.0.0.1:0".into()
            }
        };
        let mut second = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args([
                "serve",
                "--proxy-addr",
                "off",
                "--cores",
                "2",
                "--events-addr",
                &free(&s.events),
                "--api-addr",
                &free(&s.api),
                "--http-addr",
                &free(&s.http),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn second kvroute");
        let st = wait_exit(&mut second, Duration::from_secs(20));
        let mut err = String::new();
        use std::io::Read;
        second
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            !st.success(),
            "second instance ({taken} port taken) started"
        );
        assert!(
            err.contains(&port),
            "message should name the port {port}: {err:?}"
        );
    }
    // Every new connection still reaches the first router (the only one holding it).
    for _ in 0..32 {
        let (code, body) = s.get("/v1/workers");
        assert_eq!(code, 200);
        assert!(body.contains("\"w1\""), "{body}");
    }
}

#[test]
fn port_zero_gives_one_port_shared_by_every_core() {
    let child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args([
            "serve",
            "--proxy-addr",
            "off",
            "--cores",
            "2",
            "--events-addr",
            "127.0.0.1:0",
            "--api-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kvroute");
    let mut child = Stop(child);
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "... http 127.0.0.1:PORT (JSON ..."
    let http = line
        .split("http ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_default()
        .to_string();
    assert!(!http.ends_with(":0") && http.contains(':'), "{line}");
    for _ in 0..16 {
        let r = ureq::get(&format!("http://{http}/healthz")).call();
        assert!(r.is_ok(), "{r:?}");
    }
}

// ------------------------------------------------------- registration is linear

#[test]
fn registering_4096_maximum_size_workers_works() {
    let s = Server::start(2, &[]);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    for i in 0..4096 {
        c.register(max_spec(i))
            .unwrap_or_else(|e| panic!("worker {i}: {e}"));
    }
    // The limit (default 4,096) holds exactly.
    assert_eq!(
        c.register(max_spec(4096)).unwrap_err().code(),
        Some(ErrorCode::Overloaded)
    );
    // ~40 MB of JSON: past ureq's into_string limit, read it whole.
    let mut body = String::new();
    use std::io::Read;
    ureq::get(&s.url("/v1/workers"))
        .call()
        .unwrap()
        .into_reader()
        .read_to_string(&mut body)
        .unwrap();
    let ws: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(ws.len(), 4096);
    assert_eq!(ws[4095]["id"], max_spec(4095).id);
    assert_eq!(s.metric("kvroute_workers "), 4096.0);
    // Routing still sees the fleet (its model, tolerating its taints).
    let mut r = req("r", &hashes(1, 4));
    r.model = Some(max_spec(0).model);
    r.tolerations = Some(max_spec(0).taints);
    let d = c.route(&r).unwrap();
    assert!(d.decode_worker.starts_with('w'));
}

// --------------------------------------- conflicting registrations and liveness

#[test]
fn reregistering_a_connected_worker_is_refused_and_it_still_goes_down() {
    // No speculative indexing: the routes to "static" while "w" is down would
    // otherwise credit it with the prompt's blocks for 2 s, and with the prefix
    // affinity it would then keep the prompt after "w" is back (both hold it).
    let s = Server::start(
        2,
        &["--heartbeat-timeout-ms", "600", "--speculative-ttl-ms", "0"],
    );
    let mut w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    let h = hashes(3, 6);
    w.stored(Tier::Device, None, &h);
    w.flush().unwrap();
    s.wait_until("index", |s| s.cached("w") == 6);
    s.register(serde_json::json!({"id": "static", "capacity_blocks": 1000}));

    // Another spec over HTTP (capacity, epoch) and over the binary Register: refused.
    let mut other = spec("w");
    other.capacity_blocks = 5;
    let mut kicked = spec("w");
    kicked.epoch = 99;
    for sp in [&other, &kicked] {
        let (code, body) = s.post("/v1/workers", spec_json(sp));
        assert_eq!(code, 409, "{body}");
        assert_eq!(body["code"], "conflict");
    }
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    for sp in [&other, &kicked] {
        assert_eq!(
            c.register(sp.clone()).unwrap_err().code(),
            Some(ErrorCode::Conflict)
        );
    }
    // Nothing changed: same blocks, same capacity.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.cached("w"), 6);
    // The same spec again is accepted (idempotent) from both doors...
    let (code, body) = s.post("/v1/workers", spec_json(&spec("w")));
    assert_eq!(code, 200, "{body}");
    c.register(spec("w")).unwrap();
    // ...but does not switch heartbeat tracking off: once the connection is gone and
    // the heartbeat window has passed, the worker is down and gets no routes.
    drop(w);
    s.wait_until("w down", |s| {
        s.workers()
            .iter()
            .any(|x| x["id"] == "w" && x["state"] == "down")
    });
    for i in 0..4 {
        let d = c.route(&req(&format!("r{i}"), &h)).unwrap();
        assert_eq!(d.decode_worker, "static");
    }
    // Still refused while down: an event-protocol worker's spec is its own.
    assert_eq!(s.post("/v1/workers", spec_json(&kicked)).0, 409);
    // It comes back by itself (same epoch: blocks kept).
    let w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    assert_eq!(w.seq(), 1);
    s.wait_until("w live", |s| {
        s.workers()
            .iter()
            .any(|x| x["id"] == "w" && x["state"] == "live")
    });
    assert_eq!(c.route(&req("back", &h)).unwrap().decode_worker, "w");
}

#[test]
fn a_second_hello_with_a_new_epoch_cannot_kick_a_connected_worker() {
    let s = Server::start(2, &[]);
    let mut w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    let h = hashes(4, 5);
    w.stored(Tier::Device, None, &h);
    w.flush().unwrap();
    s.wait_until("index", |s| s.cached("w") == 5);
    let mut restarted = spec("w");
    restarted.epoch = 2;
    match EventPublisher::connect(&s.events, restarted, "") {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}"),
        Ok(_) => panic!("second connection accepted"),
    }
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(s.cached("w"), 5, "the refused Hello cleared the blocks");
    // The first connection is undisturbed.
    w.stored(Tier::Device, Some(h[4]), &hashes(5, 3));
    w.flush().unwrap();
    s.wait_until("more blocks", |s| s.cached("w") == 8);
}

#[test]
fn an_admin_worker_is_not_taken_over_by_a_hello_with_another_spec() {
    let s = Server::start(1, &[]);
    s.register(spec_json(&spec("a")));
    let mut other = spec("a");
    other.capacity_blocks = 3;
    match EventPublisher::connect(&s.events, other, "") {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::Conflict), "{e}"),
        Ok(_) => panic!("Hello took over an admin-registered worker"),
    }
    // Same spec: the worker connects and speaks for itself from now on.
    let _w = EventPublisher::connect(&s.events, spec("a"), "").unwrap();
    let mut cap = spec("a");
    cap.capacity_blocks = 4;
    assert_eq!(s.post("/v1/workers", spec_json(&cap)).0, 409);
}

// ----------------------------------------------------------- per-worker tokens

#[test]
fn worker_tokens_bind_each_worker_to_its_own_token() {
    let dir = std::env::temp_dir().join(format!("kvroute-ident-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("worker-tokens");
    std::fs::write(&file, "# id token\nw1 tok-one\nw2 tok-two\n").unwrap();
    let s = Server::start(
        2,
        &[
            "--auth-token",
            "admin",
            "--worker-tokens-file",
            file.to_str().unwrap(),
        ],
    );
    // Event port: only w1's own token opens w1's connection.
    for bad in ["admin", "tok-two", ""] {
        match EventPublisher::connect(&s.events, spec("w1"), bad) {
            Err(e) => assert_eq!(e.code(), Some(ErrorCode::Unauthorized), "{bad}: {e}"),
            Ok(_) => panic!("w1 connected with {bad:?}"),
        }
    }
    let mut w1 = EventPublisher::connect(&s.events, spec("w1"), "tok-one").unwrap();
    let h = hashes(6, 4);
    w1.stored(Tier::Device, None, &h);
    w1.flush().unwrap();
    let cached = |s: &Server| -> u64 {
        let r = ureq::get(&s.url("/v1/workers"))
            .set("Authorization", "Bearer admin")
            .call()
            .unwrap();
        let v: Vec<serde_json::Value> = r.into_json().unwrap();
        v.iter()
            .find(|w| w["id"] == "w1")
            .and_then(|w| w["cached_blocks"].as_u64())
            .unwrap_or(0)
    };
    s.wait_until("index", |s| cached(s) == 4);

    // HTTP: neither the shared token nor another worker's token can clear, kick or
    // remove w1.
    let events = s.url("/v1/workers/w1/events");
    let clear = serde_json::json!({"events": [{"type": "cleared"}]});
    let mut kick = spec("w1");
    kick.epoch = 5;
    for bad in ["admin", "tok-two", "nope"] {
        assert_eq!(
            call("POST", &events, bad, Some(clear.clone())),
            401,
            "{bad}"
        );
        assert_eq!(
            call("POST", &s.url("/v1/workers"), bad, Some(spec_json(&kick))),
            401,
            "{bad}"
        );
        assert_eq!(call("DELETE", &s.url("/v1/workers/w1"), bad, None), 401);
    }
    // Binary API: the shared token cannot register w1; a worker token can do nothing
    // but its own registration.
    let mut admin = RequestClient::connect(&s.api, "admin").unwrap();
    assert_eq!(
        admin.register(kick.clone()).unwrap_err().code(),
        Some(ErrorCode::Unauthorized)
    );
    assert_eq!(
        admin.deregister("w1").unwrap_err().code(),
        Some(ErrorCode::Unauthorized)
    );
    let mut two = RequestClient::connect(&s.api, "tok-two").unwrap();
    assert_eq!(
        two.register(kick.clone()).unwrap_err().code(),
        Some(ErrorCode::Unauthorized)
    );
    assert_eq!(
        two.route(&req("r2", &h)).unwrap_err().code(),
        Some(ErrorCode::Unauthorized)
    );
    two.register(spec("w2")).unwrap();
    assert!(RequestClient::connect(&s.api, "nope").is_err());
    // w1's blocks survived every attempt.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(cached(&s), 4);
    // Worker tokens grant no reads or routing; the shared token still routes.
    assert_eq!(call("GET", &s.url("/v1/workers"), "tok-one", None), 401);
    assert_eq!(
        call(
            "POST",
            &s.url("/v1/route"),
            "tok-one",
            Some(serde_json::json!({"request_id": "x", "block_hashes": [1]}))
        ),
        401
    );
    assert_eq!(admin.route(&req("r1", &h)).unwrap().decode_worker, "w1");
    // Unlisted workers keep using the shared token, and only it.
    let free = spec_json(&spec("free"));
    assert_eq!(
        call("POST", &s.url("/v1/workers"), "tok-one", Some(free.clone())),
        401
    );
    assert_eq!(
        call("POST", &s.url("/v1/workers"), "admin", Some(free)),
        201
    );
    // w1's own token clears it.
    assert_eq!(call("POST", &events, "tok-one", Some(clear)), 200);
    s.wait_until("cleared", |s| cached(s) == 0);
    assert_eq!(
        call("DELETE", &s.url("/v1/workers/w1"), "tok-one", None),
        200
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------- exact limits, global budget

#[test]
fn max_blocks_per_worker_is_exact_over_all_cores() {
    let s = Server::start(2, &["--max-blocks-per-worker", "100"]);
    s.register(serde_json::json!({"id": "w", "capacity_blocks": 10_000}));
    s.register(serde_json::json!({"id": "small", "capacity_blocks": 30}));
    let h = hashes(11, 150);
    store_and_settle(&s, "w", &h);
    assert_eq!(s.cached("w"), 100);
    assert_eq!(refused(&s, "worker_limit"), 50.0);
    // At the limit: more is refused, a removal makes exactly that much room.
    store_and_settle(&s, "w", &hashes(12, 10));
    assert_eq!(s.cached("w"), 100);
    let (code, _) = s.post(
        "/v1/workers/w/events",
        serde_json::json!({"events": [{"type": "removed", "tier": "device", "block_hashes": &h[..100]}]}),
    );
    assert_eq!(code, 200);
    s.wait_until("removed", |s| s.cached("w") < 100);
    let left = s.cached("w");
    store_and_settle(&s, "w", &hashes(13, 200));
    assert_eq!(s.cached("w"), 100, "{left} left after the removal");
    // A declared capacity below the limit is the worker's exact cap.
    store_and_settle(&s, "small", &hashes(14, 64));
    assert_eq!(s.cached("small"), 30);
    assert_eq!(refused(&s, "index_budget"), 0.0);
}

#[test]
fn the_global_index_budget_is_exact_and_counted() {
    let s = Server::start(2, &["--max-index-entries", "250"]);
    for w in ["a", "b", "c"] {
        s.register(serde_json::json!({"id": w, "capacity_blocks": 10_000}));
    }
    store_and_settle(&s, "a", &hashes(21, 100));
    store_and_settle(&s, "b", &hashes(22, 100));
    store_and_settle(&s, "c", &hashes(23, 100));
    assert_eq!(
        (s.cached("a"), s.cached("b"), s.cached("c")),
        (100, 100, 50)
    );
    assert_eq!(refused(&s, "index_budget"), 50.0);
    assert_eq!(refused(&s, "worker_limit"), 0.0);
    assert_eq!(s.metric("kvroute_index_budget_used "), 250.0);
    // A clear gives the entries back to everyone.
    let (code, _) = s.post(
        "/v1/workers/a/events",
        serde_json::json!({"events": [{"type": "cleared"}]}),
    );
    assert_eq!(code, 200);
    s.wait_until("cleared", |s| s.cached("a") == 0);
    store_and_settle(&s, "c", &hashes(24, 120));
    assert_eq!(s.cached("c"), 150);
    // Removing a worker gives its entries back too.
    assert_eq!(s.delete("/v1/workers/b").0, 200);
    s.wait_until("budget freed", |s| {
        s.metric("kvroute_index_budget_used ") == 150.0
    });
}

#[test]
fn a_zmq_engine_worker_is_not_respecified_over_http() {
    // Nobody publishes on this endpoint: the subscriber just keeps trying.
    let s = Server::start(
        1,
        &[
            "--engine",
            "worker_id=e1,endpoint=tcp://127.0.0.1:9,model=m",
        ],
    );
    s.wait_until("engine registered", |s| {
        s.workers().iter().any(|w| w["id"] == "e1")
    });
    let (code, body) = s.post(
        "/v1/workers",
        serde_json::json!({"id": "e1", "model": "m", "capacity_blocks": 5, "epoch": 3}),
    );
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["code"], "conflict");
}

#[test]
fn after_a_restart_an_event_worker_still_owns_its_spec() {
    let dir = std::env::temp_dir().join(format!("kvroute-ident-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap().to_string();
    {
        let s = Server::start(1, &["--state-dir", &d]);
        let _w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
        s.register(serde_json::json!({"id": "static", "capacity_blocks": 1000}));
        s.wait_until("registered", |s| s.workers().len() == 2);
    }
    let s = Server::start(1, &["--state-dir", &d, "--heartbeat-timeout-ms", "400"]);
    let mut kicked = spec("w");
    kicked.epoch = 9;
    assert_eq!(s.post("/v1/workers", spec_json(&kicked)).0, 409);
    // Restored admin workers are taken over by the first registration.
    let (code, body) = s.post(
        "/v1/workers",
        serde_json::json!({"id": "static", "capacity_blocks": 7}),
    );
    assert_eq!(code, 200, "{body}");
    // Still heartbeat-tracked: not reconnected, it leaves routing.
    s.wait_until("w down", |s| {
        s.workers()
            .iter()
            .any(|x| x["id"] == "w" && x["state"] == "down")
    });
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_worker_token_setups_stop_the_start() {
    let dir = std::env::temp_dir().join(format!("kvroute-ident-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good");
    let dup = dir.join("dup");
    std::fs::write(&good, "w1 t1\n").unwrap();
    std::fs::write(&dup, "w1 t1\nw1 t2\n").unwrap();
    for (args, want) in [
        (
            vec!["--worker-tokens-file", good.to_str().unwrap()],
            "auth_token",
        ),
        (
            vec![
                "--auth-token",
                "a",
                "--worker-tokens-file",
                dup.to_str().unwrap(),
            ],
            "listed twice",
        ),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(["serve", "--cores", "1", "--events-addr", "127.0.0.1:0"])
            .args(["--proxy-addr", "off"])
            .args(["--api-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let st = wait_exit(&mut child, Duration::from_secs(20));
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!st.success() && err.contains(want), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
