//! Knob tuning and readable output, end to end through the `kvroute-sim` binary:
//! `tune` finds and prints settings the real `kvroute` accepts, `--mode` lists its
//! values, the example fleets load, the Azure-format CSV drives a synthetic load, and
//! the A/B SVG and per-device-class imbalance come out readable.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::sim::SLICE;

fn tmp(name: &str) -> PathBuf {
    common::sim::tmp("tune", name)
}

/// Runs kvroute-sim with `--json`, asserting success; stdout and the JSON.
fn sim(name: &str, args: &[&str]) -> (String, Value) {
    common::sim::run_json("tune", name, args)
}

fn sim_raw(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .args(args)
        .output()
        .unwrap()
}

fn score(v: &Value) -> f64 {
    v["score"].as_f64().unwrap()
}

#[test]
fn tune_recommends_settings_kvroute_accepts_and_beats_the_defaults() {
    let out = tmp("tuned.toml");
    let (stdout, v) = sim(
        "tune",
        &[
            "tune",
            "--trace",
            SLICE,
            "--limit",
            "300",
            "--workers",
            "4",
            "--budget",
            "10",
            "--threads",
            "2",
            "--no-progress",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(stdout.contains("recommended vs defaults"), "{stdout}");
    assert!(stdout.contains("[router]"), "{stdout}");
    let hist = v["history"].as_array().unwrap();
    assert!(!hist.is_empty() && hist.len() <= 10, "{}", hist.len());
    assert!(score(&v["recommended"]) <= score(&v["defaults"]), "{v}");
    let rec = &v["recommended"]["report"];
    assert_eq!(rec["finished"], 300, "{rec}");
    assert_eq!(rec["errors"], 0, "{rec}");

    // The TOML is a settings file the router takes: print-config shows its values.
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text, v["toml"].as_str().unwrap());
    let cfg = Command::new(env!("CARGO_BIN_EXE_kvroute"))
        .args(["print-config", "--config", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        cfg.status.success(),
        "{}",
        String::from_utf8_lossy(&cfg.stderr)
    );
    let effective: toml::Table = toml::from_str(&String::from_utf8_lossy(&cfg.stdout)).unwrap();
    let tuned: toml::Table = toml::from_str(&text).unwrap();
    let router = effective["router"].as_table().unwrap();
    for (k, val) in tuned["router"].as_table().unwrap() {
        assert_eq!(&router[k], val, "{k}");
    }
    // And `kvroute serve --config` starts with it.
    let s = common::Server::start(1, &["--config", out.to_str().unwrap()]);
    drop(s);
    let _ = std::fs::remove_file(&out);

    // Deterministic for the seed, whatever the thread count.
    let (_, again) = sim(
        "tune1",
        &[
            "tune",
            "--trace",
            SLICE,
            "--limit",
            "300",
            "--workers",
            "4",
            "--budget",
            "10",
            "--threads",
            "1",
            "--no-progress",
        ],
    );
    assert_eq!(again["history"], v["history"]);
    assert_eq!(again["toml"], v["toml"]);
}

#[test]
fn tune_finds_the_documented_tuned_set_when_it_is_in_reach() {
    // The documented tuned set is a point of this 2x2 grid, so a budget of 4 must end
    // at least as good as it under the same objective.
    let (_, v) = sim(
        "tune-grid",
        &[
            "tune",
            "--trace",
            SLICE,
            "--limit",
            "300",
            "--workers",
            "4",
            "--space",
            "prefill_load_scale=1|8",
            "--space",
            "track_prefill_tokens=true|false",
            "--space-only",
            "--budget",
            "4",
            "--compare",
            "prefill_load_scale=8,track_prefill_tokens=false",
            "--no-progress",
        ],
    );
    assert_eq!(v["history"].as_array().unwrap().len(), 4);
    let cmp = &v["compare"][0];
    assert!(score(&v["recommended"]) <= score(cmp), "{v}");
}

#[test]
fn tune_rejects_bad_input_without_panicking() {
    let cases: [&[&str]; 5] = [
        &["--budget", "0"],
        &["--space", "nope=1|2"],
        &["--space", "overlap_score_credit=0.5|7"],
        &["--space", "garbage"],
        &["--compare", "nope=1"],
    ];
    for extra in cases {
        let mut args = vec!["tune", "--trace", SLICE, "--limit", "20", "--no-progress"];
        args.extend_from_slice(extra);
        let out = sim_raw(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(
            err.contains("kvroute-sim:") && !err.contains("panicked"),
            "{extra:?}: {err}"
        );
    }
}

#[test]
fn offline_mode_lists_its_valid_values() {
    let out = sim_raw(&["offline", "--trace", SLICE, "--mode", "fastest"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for m in [
        "kv",
        "random",
        "round-robin",
        "least-loaded",
        "device-aware-weighted",
    ] {
        assert!(err.contains(m), "{m} missing from: {err}");
    }
    let help = String::from_utf8_lossy(&sim_raw(&["offline", "--help"]).stdout).to_string();
    assert!(
        help.contains("possible values") && help.contains("least-loaded"),
        "{help}"
    );
}

/// Example fleets shipped under `examples/`: each loads and simulates, and
/// docs/OPERATIONS.md shows each one verbatim.
#[test]
fn example_fleets_load_and_match_the_docs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/OPERATIONS.md")).unwrap();
    for (file, mixed) in [("fleet-mixed.toml", true), ("fleet-disagg.toml", false)] {
        let path = root.join("examples").join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            doc.contains(text.trim()),
            "docs/OPERATIONS.md lacks examples/{file}"
        );
        let (stdout, v) = sim(
            file,
            &[
                "ab",
                "--offline",
                "--trace",
                SLICE,
                "--limit",
                "150",
                "--fleet",
                path.to_str().unwrap(),
            ],
        );
        for r in v["reports"].as_array().unwrap() {
            assert_eq!(r["finished"], 150, "{file}: {r}");
            assert_eq!(r["errors"], 0, "{file}: {}", r["error_samples"]);
        }
        let names: Vec<&str> = v["reports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["label"].as_str().unwrap())
            .collect();
        assert_eq!(names.contains(&"device-aware-weighted"), mixed, "{names:?}");
        if mixed {
            // Imbalance per device class: in the table and in the JSON.
            assert!(stdout.contains("per device class"), "{stdout}");
            let by = v["reports"][0]["imbalance_by_device"].as_array().unwrap();
            let classes: Vec<&str> = by.iter().map(|d| d["device"].as_str().unwrap()).collect();
            assert_eq!(classes, ["gpu", "cpu"], "{by:?}");
            assert!(by.iter().all(|d| d["imbalance"].as_f64().unwrap() >= 1.0));
        }
    }
}

#[test]
fn synthetic_load_from_an_azure_csv() {
    let csv = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/azure_sample.csv");
    let (stdout, v) = sim(
        "azure",
        &[
            "offline",
            "--synthetic",
            "--synth-csv",
            csv,
            "--workers",
            "4",
        ],
    );
    let r = &v["reports"][0];
    assert_eq!(r["requests"], 60, "{r}");
    assert_eq!(r["finished"], 60, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    // Input lengths come from ContextTokens (the sample's sum).
    assert_eq!(r["input_tokens"], 147_314, "{r}");
    // Shared prefixes from the synthetic groups give hits.
    assert!(r["hit_rate"].as_f64().unwrap() > 0.05, "{r}");
    assert!(stdout.contains("60 requests"), "{stdout}");
    // A malformed CSV is an error naming the line.
    let bad = tmp("bad.csv");
    std::fs::write(
        &bad,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,x\n",
    )
    .unwrap();
    let out = sim_raw(&[
        "offline",
        "--synthetic",
        "--synth-csv",
        bad.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("line 2") && !err.contains("panicked"),
        "{err}"
    );
    let _ = std::fs::remove_file(&bad);
}

#[test]
fn ab_svg_has_log_axis_values_bound_and_fitting_legend() {
    let svg = tmp("ab.svg");
    let long = "overlap_score_credit=0.5,prefill_load_scale=8,track_prefill_tokens=false";
    sim(
        "ab-svg",
        &[
            "ab",
            "--offline",
            "--trace",
            SLICE,
            "--limit",
            "200",
            "--workers",
            "4",
            "--kv-variant",
            long,
            "--svg",
            svg.to_str().unwrap(),
        ],
    );
    let chart = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(chart.contains("log scale"), "TTFT axis is logarithmic");
    assert!(chart.contains(r#"class="bound""#), "bound line drawn");
    assert!(chart.contains(r#"class="value""#), "values printed on bars");
    // Every legend text stays inside the drawing's width.
    let width: f64 = attr(&chart, "<svg", "width").unwrap();
    for (x, len) in legend_texts(&chart) {
        // 7 px per character at 12 px sans-serif is generous.
        assert!(
            x + 7.0 * len as f64 <= width,
            "legend at {x} with {len} chars"
        );
    }
    assert!(
        chart.contains("kv[overlap_score_credit=0.5,"),
        "long label kept"
    );
}

/// The value of attribute `name` on the first element starting with `tag`.
fn attr(svg: &str, tag: &str, name: &str) -> Option<f64> {
    let el = &svg[svg.find(tag)?..];
    let el = &el[..el.find('>')?];
    let k = format!(" {name}=\"");
    let v = &el[el.find(&k)? + k.len()..];
    v[..v.find('"')?].parse().ok()
}

/// (x, characters) of every `<text class="legend" ...>` line.
fn legend_texts(svg: &str) -> Vec<(f64, usize)> {
    let mut out = Vec::new();
    for part in svg.split("<text class=\"legend\"").skip(1) {
        let x = attr(&format!("<t{part}"), "<t", "x").unwrap();
        let body = &part[part.find('>').unwrap() + 1..part.find("</text>").unwrap()];
        out.push((x, body.chars().count()));
    }
    assert!(!out.is_empty(), "legend texts present");
    out
}
