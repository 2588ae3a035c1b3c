//! Route-time prefix affinity through the real binaries:
//! - `kvroute serve` over HTTP: when the KV index cannot tell two workers apart (no
//!   events, idle workers: an exact tie, which `balance_slack` takes in turn), a
//!   conversation's next turn still goes to the worker of its previous turn; with
//!   `affinity_max_entries = 0` (flag, env or TOML) the turn moves to the other worker.
//! - `kvroute-sim ab --offline --sglang-baseline` on the committed trace slice under
//!   cache pressure: kv with affinity has a hit rate at least the SGLang gateway
//!   model's and above kv without affinity.
//!
//! `--cores 1`: the affinity map is per core and which core an HTTP request lands on
//! is not fixed, so exact expectations need one. `--speculative-ttl-ms 0`: speculative
//! indexing would otherwise also keep the turn (it credits the routed blocks for 2 s).

mod common;
use common::{hashes, Server};
use serde_json::json;
use std::sync::{Mutex, MutexGuard};

/// One test at a time: one sets an environment variable for the router it spawns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn start(extra: &[&str]) -> Server {
    let mut flags = vec![
        "--heartbeat-timeout-ms",
        "600000",
        "--speculative-ttl-ms",
        "0",
    ];
    flags.extend_from_slice(extra);
    let s = Server::start(1, &flags);
    for id in ["w0", "w1"] {
        s.register(json!({
            "id": id, "role": "aggregated", "model": "m", "capacity_blocks": 100000
        }));
    }
    s
}

/// Routes request `id` and finishes it (no load left behind); the decode worker.
fn route_and_finish(s: &Server, id: &str, h: &[u64]) -> String {
    let body = json!({"request_id": id, "model": "m", "block_hashes": h});
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

/// Four two-turn conversations (turn 2 extends turn 1's 8 blocks to 12); how many
/// second turns went to their first turn's worker.
fn turns_kept(s: &Server) -> usize {
    (0..4u64)
        .filter(|&c| {
            let conv = hashes(1000 + c, 12);
            let first = route_and_finish(s, &format!("c{c}t1"), &conv[..8]);
            let second = route_and_finish(s, &format!("c{c}t2"), &conv);
            first == second
        })
        .count()
}

#[test]
fn a_conversation_keeps_its_worker_when_the_index_sees_a_tie() {
    let _one = serial();
    let s = start(&[]);
    assert_eq!(turns_kept(&s), 4, "every second turn follows its first");
}

#[test]
fn without_affinity_the_tie_moves_the_turn_and_the_knob_reads_everywhere() {
    let _one = serial();
    // Flag.
    let s = start(&["--affinity-max-entries", "0"]);
    assert_eq!(turns_kept(&s), 0, "ties in turn: every second turn moves");
    drop(s);
    // TOML.
    let dir = std::env::temp_dir().join(format!("kvroute-hit-affinity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toml = dir.join("router.toml");
    std::fs::write(&toml, "[router]\naffinity_max_entries = 0\n").unwrap();
    let s = start(&["--config", &toml.to_string_lossy()]);
    assert_eq!(turns_kept(&s), 0, "TOML");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
    // Env.
    let s = {
        std::env::set_var("KVROUTE_AFFINITY_MAX_ENTRIES", "0");
        let s = start(&[]);
        std::env::remove_var("KVROUTE_AFFINITY_MAX_ENTRIES");
        s
    };
    assert_eq!(turns_kept(&s), 0, "env");
    drop(s);
    // A slack of 0 still breaks exact ties with the affinity worker.
    let s = start(&["--affinity-slack", "0"]);
    assert_eq!(turns_kept(&s), 4, "--affinity-slack 0");
}

#[test]
fn a_bad_affinity_slack_is_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["serve", "--affinity-slack", "10.5", "--cores", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("affinity_slack"), "{err}");
}

#[test]
fn offline_kv_with_affinity_beats_the_gateway_model_under_cache_pressure() {
    let (stdout, v) = common::sim::run_json(
        "hit-affinity",
        "ab",
        &[
            "ab",
            "--offline",
            "--trace",
            common::sim::SLICE,
            "--workers",
            "4",
            "--capacity-blocks",
            "4096",
            "--speed",
            "20",
            "--kv-variant",
            "affinity_max_entries=0",
            "--sglang-baseline",
        ],
    );
    let reports = v["reports"].as_array().unwrap();
    let hit = |label: &str| {
        reports
            .iter()
            .find(|r| r["label"] == label)
            .and_then(|r| r["hit_rate"].as_f64())
            .unwrap_or_else(|| panic!("no row {label}:\n{stdout}"))
    };
    let (kv, off, gw) = (
        hit("kv"),
        hit("kv[affinity_max_entries=0]"),
        hit("sglang-cache-aware"),
    );
    assert!(kv > off, "affinity helps: {kv} vs {off}\n{stdout}");
    assert!(kv >= gw, "kv {kv} vs the gateway model {gw}\n{stdout}");
    assert!(gw > 0.0, "{stdout}");
    for r in reports {
        assert_eq!(r["errors"], 0, "{r}");
    }
}
