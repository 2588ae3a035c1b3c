//! `answer_spin_us` through the running service: with `--cores 2`, a core that awaits
//! another core's answer either parks (0) or keeps polling for it (a large bound).
//! Whatever the setting, every decision and lifecycle call is answered and the
//! outcomes are identical (the spin changes when a core looks at its inbox, never what
//! it does with a message). No timing is asserted.

mod common;
use common::{hashes, req, spec, Server};
use kvroute::client::{Answer, EventPublisher, RequestClient};
use kvroute::codec::{ErrorCode, LifecycleOp};
use kvroute::types::Tier;
use serde_json::json;

/// What the scenario observed: each decision's worker and cached overlap, then the
/// outcome of every lifecycle and duplicate call, then the pipelined round's workers.
type Outcome = Vec<String>;

fn scenario(spin_us: &str) -> Outcome {
    let s = Server::start(2, &["--answer-spin-us", spin_us]);
    // Three workers with different prefixes of one prompt: hashes spread over both
    // shards, so every decision needs the other core's answer.
    let mut pubs: Vec<EventPublisher> = ["a", "b", "c"]
        .iter()
        .map(|w| EventPublisher::connect(&s.events, spec(w), "").unwrap())
        .collect();
    let h = hashes(7, 32);
    for (p, n) in pubs.iter_mut().zip([8usize, 24, 16]) {
        p.stored(Tier::Device, None, &h[..n]);
        p.flush().unwrap();
    }
    s.wait_until("index", |s| {
        s.cached("a") == 8 && s.cached("b") == 24 && s.cached("c") == 16
    });
    let mut out = Outcome::new();
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    // Sequential decisions (each one round trip to the other core), finished at once
    // so that the loads, hence the outcomes, do not depend on the order of cores.
    for i in 0..20 {
        let id = format!("seq{i}");
        let d = c.route(&req(&id, &h[..8 + i % 24])).unwrap();
        out.push(format!("{id} {} {}", d.decode_worker, d.overlap.device));
        c.finish(&id).unwrap();
    }
    // A duplicate id is refused (the other core's id check travels with the query).
    c.route(&req("dup", &h)).unwrap();
    let e = c.route(&req("dup", &h)).unwrap_err();
    out.push(format!("dup {:?}", e.code()));
    // Lifecycle calls from another connection, which may live on the other core: the
    // call then waits for the other core's answer (`lifecycle_elsewhere`).
    let mut other = RequestClient::connect(&s.api, "").unwrap();
    for _ in 0..4 {
        let r = other.first_token("dup").map(|_| "ok").map_err(|e| e.code());
        out.push(format!("first_token {r:?}"));
    }
    out.push(format!("finish {:?}", other.finish("dup").is_ok()));
    let gone = other.finish("dup").unwrap_err().code();
    assert_eq!(gone, Some(ErrorCode::UnknownRequest));
    out.push(format!("finish again {gone:?}"));
    // Pipelined: many queries outstanding at once on both connections.
    let mut corrs = Vec::new();
    for i in 0..100 {
        let conn = if i % 2 == 0 { &mut c } else { &mut other };
        corrs.push((
            i,
            conn.send_route(&req(&format!("p{i}"), &h[..i % 32 + 1]))
                .unwrap(),
        ));
    }
    c.flush().unwrap();
    other.flush().unwrap();
    let mut routed = 0;
    for (i, want) in corrs {
        let conn = if i % 2 == 0 { &mut c } else { &mut other };
        match conn.recv().unwrap() {
            Answer::Decision(corr, d) => {
                assert_eq!(corr, want);
                assert!(["a", "b", "c"].contains(&d.decode_worker.as_str()), "{d:?}");
                routed += 1;
            }
            other => panic!("p{i}: {other:?}"),
        }
    }
    out.push(format!("pipelined {routed}"));
    for i in 0..100 {
        let conn = if i % 3 == 0 { &mut c } else { &mut other };
        conn.send_lifecycle(LifecycleOp::Finish, &format!("p{i}"), 0)
            .unwrap();
    }
    c.flush().unwrap();
    other.flush().unwrap();
    let mut acked = 0;
    for i in 0..100 {
        let conn = if i % 3 == 0 { &mut c } else { &mut other };
        match conn.recv().unwrap() {
            Answer::Ack(_) => acked += 1,
            other => panic!("finish p{i}: {other:?}"),
        }
    }
    out.push(format!("finished {acked}"));
    // Everything finished: no load left on any worker (nothing was lost or doubled).
    s.wait_until("loads drained", |s| {
        s.workers()
            .iter()
            .all(|w| w["active_requests"].as_u64().unwrap_or(0) == 0)
    });
    // The same over HTTP (a new connection per call, so either core).
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": "http1", "block_hashes": &h[..24]}),
    );
    assert_eq!(code, 200, "{d}");
    out.push(format!(
        "http {} {}",
        d["decode_worker"], d["overlap"]["device"]
    ));
    let (code, _) = s.post("/v1/requests/http1/finish", json!({}));
    out.push(format!("http finish {code}"));
    out
}

#[test]
fn decisions_are_answered_and_identical_with_and_without_the_spin() {
    let parked = scenario("0");
    // A bound far beyond any round trip: the cores keep polling for every answer.
    let spun = scenario("1000000");
    assert_eq!(parked.len(), 20 + 1 + 4 + 2 + 1 + 1 + 2);
    assert!(parked.iter().any(|l| l == "pipelined 100"), "{parked:?}");
    assert!(parked.iter().any(|l| l == "finished 100"), "{parked:?}");
    assert_eq!(parked, spun);
}

/// `kvroute print-config` shows the effective settings: the default, the TOML key,
/// the environment variable over the file, and the flag over both.
#[test]
fn the_setting_is_read_from_default_toml_env_and_flag() {
    let dir = std::env::temp_dir().join(format!("kvroute-answer-spin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("c.toml");
    std::fs::write(&toml, "answer_spin_us = 77\n").unwrap();
    let shown = |env: Option<&str>, args: &[&str]| -> String {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"));
        cmd.arg("print-config")
            .args(args)
            .env_remove("KVROUTE_ANSWER_SPIN_US");
        if let Some(v) = env {
            cmd.env("KVROUTE_ANSWER_SPIN_US", v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("answer_spin_us"))
            .unwrap_or_default()
            .to_string()
    };
    let file = toml.to_str().unwrap();
    let default = format!(
        "answer_spin_us = {}",
        kvroute::settings::DEFAULT_ANSWER_SPIN_US
    );
    assert_eq!(shown(None, &[]), default);
    assert_eq!(shown(None, &["--config", file]), "answer_spin_us = 77");
    assert_eq!(
        shown(Some("33"), &["--config", file]),
        "answer_spin_us = 33"
    );
    assert_eq!(
        shown(Some("33"), &["--config", file, "--answer-spin-us", "0"]),
        "answer_spin_us = 0"
    );
    // Above the 1 s cap: refused at start, with the reason.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["print-config", "--answer-spin-us", "1000001"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("answer_spin_us must be at most"));
    let _ = std::fs::remove_dir_all(&dir);
}
