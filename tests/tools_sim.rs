//! The bundled load tool `kvroute-sim` end to end: a slice of the Mooncake trace
//! through the REAL service (fleet simulator on the event protocol + load generator on
//! the request protocol, in real time), and the offline A/B path. Checks the figures
//! are sane: every request finished, no errors, kv hits on the workers.

mod common;

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

use common::sim::SLICE;

fn tmp(name: &str) -> PathBuf {
    common::sim::tmp("tools", name)
}

fn sim(args: &[&str]) -> (String, Value) {
    common::sim::run_json("tools", args[0], args)
}

fn check_sane(r: &Value, n: u64) {
    assert_eq!(r["requests"], n, "{r}");
    assert_eq!(r["finished"], n, "{r}");
    assert_eq!(r["errors"], 0, "{}", r["error_samples"]);
    assert!(r["ttft_us"]["p50"].as_f64().unwrap() > 0.0);
}

#[test]
fn realtime_run_through_the_real_service() {
    let s = common::Server::start(1, &[]);
    let (stdout, v) = sim(&[
        "run",
        "--trace",
        SLICE,
        "--limit",
        "150",
        "--workers",
        "4",
        "--speed",
        "2",
        "--time-scale",
        "40",
        "--router-api",
        &s.api,
        "--router-events",
        &s.events,
        "--no-progress",
    ]);
    let r = &v["reports"][0];
    check_sane(r, 150);
    assert!(
        r["hit_rate"].as_f64().unwrap() > 0.01,
        "kv hit rate {}",
        r["hit_rate"]
    );
    assert!(r["events"].as_u64().unwrap() > 0);
    assert!(r["decision_us"]["count"].as_u64().unwrap() == 150);
    assert!(stdout.contains("real time x40"), "{stdout}");
    // The simulated workers registered by their handshakes and are live.
    let workers = s.workers();
    assert_eq!(workers.len(), 4, "{workers:?}");
    // Their cache events came over the binary event protocol.
    assert!(s.metric("kvroute_events_total{kind=\"stored\"}") > 0.0);
}

#[test]
fn restart_mid_run_keeps_hits_and_loses_only_decisions_made_while_down() {
    let (stdout, log, v) = common::sim::run_json_logged(
        "tools",
        "restart",
        &[
            "run",
            "--trace",
            SLICE,
            "--limit",
            "200",
            "--workers",
            "4",
            "--time-scale",
            "5",
            "--spawn-router",
            env!("CARGO_BIN_EXE_kvroute"),
            "--restart-at-secs",
            "30",
            "--window-secs",
            "25",
            "--no-progress",
        ],
    );
    // Model time runs x5: 60 s of trace in 12 s of wall time, the restart at 6 s, so a
    // restart slowed by a loaded machine still leaves ~6 s of requests after it.
    let r = &v["reports"][0];
    let st = &v["pacing"][0]["restart"];
    assert!(st["at_us"].as_u64().is_some(), "{st}\n{log}");
    assert!(st["back_at_us"].as_u64().is_some(), "{st}\n{log}");
    // The only errors are the route calls made while the router was down; every
    // lifecycle call held meanwhile was accepted by the restarted router (it restored
    // the in-flight requests), and every routed request finished.
    let lost = st["lost_routes"].as_u64().unwrap();
    assert_eq!(
        r["errors"].as_u64().unwrap(),
        lost,
        "{}",
        r["error_samples"]
    );
    assert_eq!(st["replay_failures"], 0, "{st}");
    assert_eq!(r["finished"].as_u64().unwrap() + lost, 200, "{r}");
    // About 100 requests arrive after 30 s: some were routed by the restarted router
    // (the downtime, shutdown plus start, is well under the 6 s of wall time left).
    assert!(lost < 100, "{st}\n{log}");
    assert!(stdout.contains("restart at 30.0 s"), "{stdout}");
    assert!(r["hit_rate"].as_f64().unwrap() > 0.01, "{r}");
}

#[test]
fn offline_ab_compares_modes_on_the_slice() {
    let svg = tmp("ab.svg");
    let (stdout, v) = sim(&[
        "ab",
        "--offline",
        "--trace",
        SLICE,
        "--limit",
        "400",
        "--workers",
        "4",
        "--kv-variant",
        "overlap_score_credit=0.5",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let reps = v["reports"].as_array().unwrap();
    let names: Vec<&str> = reps.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "kv",
            "round-robin",
            "random",
            "least-loaded",
            "kv[overlap_score_credit=0.5]"
        ]
    );
    for r in reps {
        check_sane(r, 400);
    }
    let hit = |i: usize| reps[i]["hit_rate"].as_f64().unwrap();
    assert!(
        hit(0) > hit(1) && hit(0) > hit(2),
        "kv {} rr {} random {}",
        hit(0),
        hit(1),
        hit(2)
    );
    assert!(v["bound"]["ratio"].as_f64().unwrap() >= hit(0));
    assert!(stdout.contains("least-loaded"));
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg") || chart.contains("<svg"));
    let _ = std::fs::remove_file(&svg);
}

/// `--max-output-tokens` caps every answer as the live replay does, and
/// `--sglang-knobs` reaches the gateway model's row (an unknown knob is an error).
#[test]
fn offline_ab_models_the_live_benchmark() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "ab",
            "--offline",
            "--trace",
            SLICE,
            "--limit",
            "200",
            "--workers",
            "2",
            "--sglang-baseline",
        ];
        args.extend_from_slice(extra);
        sim(&args).1
    };
    let tokens = |v: &Value, i: usize| {
        let r = &v["reports"][i];
        r["output_tok_per_s"].as_f64().unwrap() * r["duration_us"].as_f64().unwrap() / 1e6
    };
    let full = run(&[]);
    let capped = run(&["--max-output-tokens", "2"]);
    for i in 0..2 {
        // 200 requests of at most 2 tokens each, against the trace's own lengths.
        assert!(tokens(&capped, i) <= 400.5, "{}", capped["reports"][i]);
        assert!(tokens(&full, i) > 1000.0, "{}", full["reports"][i]);
    }
    let labels = |v: &Value| {
        v["reports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["label"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let knobbed = run(&[
        "--sglang-knobs",
        "balance_abs_threshold=0,balance_rel_threshold=0",
    ]);
    assert_eq!(
        labels(&knobbed).last().map(String::as_str),
        Some("sglang-cache-aware")
    );
    // Imbalance 0 on every decision: the model is plain least-loaded, so its counts
    // differ from its default form's on this slice.
    let jobs =
        |v: &Value| v["reports"].as_array().unwrap().last().unwrap()["jobs_per_worker"].clone();
    assert_ne!(jobs(&knobbed), jobs(&full));
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "ab",
            "--offline",
            "--trace",
            SLICE,
            "--limit",
            "10",
            "--sglang-baseline",
        ])
        .args(["--sglang-knobs", "bogus=1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"unknown --sglang-knobs key "bogus""#),
        "{err}"
    );
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(["offline", "--trace", "/nonexistent.jsonl"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kvroute-sim:") && !err.contains("panicked"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args([
            "offline",
            "--trace",
            SLICE,
            "--knobs",
            "overlap_score_credit=9",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
