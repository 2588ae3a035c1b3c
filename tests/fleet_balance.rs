//! Large-fleet balance through the running service over HTTP:
//! `balance_routed_min_ties` gives a large near-tie set's request to the tied worker
//! with the fewest requests routed so far, so the worker that served a long
//! conversation gets no new conversations until the others have caught up, while the
//! conversation itself still follows its cached history. `--balance-routed-min-ties 0`
//! (turns only) shows the difference on the same sequence.
//!
//! `--cores 1`: the routed counts are per core (each core's decision scratch), and
//! which core an HTTP request lands on is not fixed, so exact expectations need one.

mod common;
use common::{hashes, Server};
use serde_json::json;
use std::sync::{Mutex, MutexGuard};

const WORKERS: usize = 8;

/// The tests of this file run one at a time: one of them sets an environment variable
/// for the router it spawns, which a concurrent spawn would inherit.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn name(i: usize) -> String {
    format!("w{i}")
}

fn start(extra: &[&str]) -> Server {
    // A long heartbeat timeout: HTTP-registered workers stay live for the whole test
    // however slow the machine.
    let mut flags = vec!["--heartbeat-timeout-ms", "600000"];
    flags.extend_from_slice(extra);
    let s = Server::start(1, &flags);
    for i in 0..WORKERS {
        s.register(json!({
            "id": name(i), "role": "aggregated", "model": "m", "capacity_blocks": 100000
        }));
    }
    s
}

/// Routes request `id` (kv, or pinned when `pin` is given) and finishes it, so it
/// leaves no load behind; returns the decode worker.
fn route_and_finish(s: &Server, id: &str, h: &[u64], pin: Option<&str>) -> String {
    let mut body = json!({"request_id": id, "model": "m", "block_hashes": h});
    if let Some(w) = pin {
        body["mode"] = json!("direct");
        body["pin"] = json!(w);
    }
    let (code, d) = s.post("/v1/route", body);
    assert_eq!(code, 200, "route {id}: {d}");
    let w = d["decode_worker"].as_str().unwrap_or_default().to_string();
    let (code, b) = s.post(&format!("/v1/requests/{id}/finish"), json!({}));
    assert_eq!(code, 200, "finish {id}: {b}");
    s.wait_until("the fleet to be idle", |s| {
        s.workers().iter().all(|x| x["active_requests"] == 0)
    });
    w
}

/// One long conversation (6 turns, each prompt extending the last and cached on its
/// worker by a KV event) and then 7 first turns of new conversations; returns the
/// conversation's worker and where the new ones went.
fn scenario(extra: &[&str]) -> (String, Vec<String>, String) {
    let s = start(extra);
    let conv = hashes(1, 64);
    let mut home = String::new();
    for turn in 1..=6usize {
        let h = &conv[..8 * turn];
        let w = route_and_finish(&s, &format!("c{turn}"), h, None);
        if turn > 1 {
            assert_eq!(
                w, home,
                "turn {turn} follows the conversation's cached history"
            );
        }
        home = w;
        s.store(&home, "device", h);
        s.wait_until("the turn's blocks in the index", |s| {
            s.cached(&home) == h.len() as u64
        });
    }
    let fresh: Vec<String> = (0..WORKERS - 1)
        .map(|i| route_and_finish(&s, &format!("n{i}"), &hashes(100 + i as u64, 8), None))
        .collect();
    // The conversation goes on where its history is, whatever the counts say.
    let last = route_and_finish(&s, "c7", &conv[..56], None);
    (home, fresh, last)
}

#[test]
fn new_conversations_avoid_the_worker_of_a_long_one() {
    let _one = serial();
    let (home, fresh, last) = scenario(&[]);
    // Six requests on `home`, none elsewhere: the 7 new conversations (all 8 workers
    // near-tied, at least 6) go to the 7 other workers, one each.
    assert!(!fresh.contains(&home), "{home} got a new one: {fresh:?}");
    let mut distinct = fresh.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), WORKERS - 1, "{fresh:?}");
    assert_eq!(last, home);
}

#[test]
fn turns_only_send_one_to_the_busy_worker() {
    // The same sequence with the count off: the 7 ties are taken in turn over all 8
    // workers, so one of them lands on the conversation's worker.
    let _one = serial();
    let (home, fresh, last) = scenario(&["--balance-routed-min-ties", "0"]);
    assert_eq!(
        fresh.iter().filter(|w| **w == home).count(),
        1,
        "{home}: {fresh:?}"
    );
    assert_eq!(last, home);
}

#[test]
fn pinned_requests_count_too_and_the_setting_reads_from_env_and_toml() {
    // Two requests pinned to each of w0..w3, then four kv requests: with the count
    // they go to w4..w7; the env variable and a TOML file set the same knob.
    let _one = serial();
    let dir = std::env::temp_dir().join(format!("kvroute-fleet-balance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("router.toml");
    std::fs::write(&toml, "[router]\nbalance_routed_min_ties = 4\n").unwrap();
    let cfg = toml.to_string_lossy().to_string();
    for extra in [vec![], vec!["--config", cfg.as_str()]] {
        let s = start(&extra);
        for i in 0..8 {
            let w = name(i / 2);
            let got = route_and_finish(&s, &format!("p{i}"), &hashes(200 + i as u64, 4), Some(&w));
            assert_eq!(got, w);
        }
        let got: Vec<String> = (0..4)
            .map(|i| route_and_finish(&s, &format!("k{i}"), &hashes(300 + i as u64, 4), None))
            .collect();
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, ["w4", "w5", "w6", "w7"], "{extra:?}: {got:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The env variable: 9 = more ties than workers, i.e. turns only again.
    let s = {
        std::env::set_var("KVROUTE_BALANCE_ROUTED_MIN_TIES", "9");
        let s = start(&[]);
        std::env::remove_var("KVROUTE_BALANCE_ROUTED_MIN_TIES");
        s
    };
    for i in 0..8 {
        route_and_finish(
            &s,
            &format!("p{i}"),
            &hashes(400 + i as u64, 4),
            Some(&name(i / 2)),
        );
    }
    let got: Vec<String> = (0..4)
        .map(|i| route_and_finish(&s, &format!("k{i}"), &hashes(500 + i as u64, 4), None))
        .collect();
    assert!(
        got.iter()
            .any(|w| ["w0", "w1", "w2", "w3"].contains(&w.as_str())),
        "turns alone reach the pinned workers: {got:?}"
    );
}
