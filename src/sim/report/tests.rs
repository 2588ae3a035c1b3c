//! Tests of percentiles, the recorder's figures, the table and the chart.

use super::*;

#[test]
fn nearest_rank_percentiles() {
    let samples: Vec<u64> = (1..=100).rev().collect();
    let p = Percentiles::of_u64(&samples);
    assert_eq!(
        (p.p50, p.p90, p.p99, p.max, p.count),
        (50.0, 90.0, 99.0, 100.0, 100)
    );
    let p = Percentiles::of(&[7.0, 3.0, 5.0]);
    // ceil(0.5·3) = 2nd smallest; ceil(0.9·3) = ceil(0.99·3) = 3rd.
    assert_eq!((p.p50, p.p90, p.p99), (5.0, 7.0, 7.0));
    assert_eq!(Percentiles::of(&[4.0]).p99, 4.0);
    assert_eq!(Percentiles::of(&[]), Percentiles::default());
}

fn workers() -> Vec<(String, Role)> {
    vec![
        ("a".into(), Role::Aggregated),
        ("b".into(), Role::Aggregated),
        ("p".into(), Role::Prefill),
        ("d".into(), Role::Decode),
    ]
}

#[test]
fn recorder_computes_every_figure() {
    let mut r = Recorder::new();
    r.arrived("x", 1_000_000, 1000, 10);
    r.arrived("y", 2_000_000, 3000, 30);
    r.arrived("z", 2_500_000, 500, 5);
    r.job("a");
    r.job("a");
    r.job("a");
    r.job("b");
    r.first_token("x", 1_100_000, 500);
    r.first_token("x", 1_200_000, 900); // repeat ignored
    r.first_token("y", 2_400_000, 9999); // capped at input
    r.first_token("nope", 0, 1);
    r.finished("x", 1_500_000);
    r.finished("y", 3_000_000);
    r.finished("y", 3_500_000); // repeat ignored
    r.event();
    r.event();
    r.error("boom".into());
    let rep = r.finish("", Mode::RoundRobin, 9, &workers());
    assert_eq!(rep.label, "round-robin");
    assert_eq!((rep.requests, rep.finished, rep.errors), (3, 2, 1));
    assert_eq!(rep.error_samples, vec!["boom".to_string()]);
    assert_eq!((rep.input_tokens, rep.hit_tokens), (4000, 3500));
    assert!((rep.hit_rate - 0.875).abs() < 1e-12);
    assert_eq!((rep.ttft_us.p50, rep.ttft_us.p99), (100_000.0, 400_000.0));
    assert_eq!(rep.e2e_us.p99, 1_000_000.0);
    assert_eq!(rep.duration_us, 2_000_000);
    assert!((rep.throughput_rps - 1.0).abs() < 1e-12);
    assert!((rep.output_tok_per_s - 20.0).abs() < 1e-12);
    assert!((rep.events_per_s - 1.0).abs() < 1e-12);
    // Aggregated pool: 3 and 1 jobs, mean 2 → 1.5; prefill/decode pools idle.
    assert!((rep.imbalance - 1.5).abs() < 1e-12);
    assert_eq!(rep.decision_us, None);
    // Per-request hit samples (not serialized) give windowed hit rates.
    assert_eq!(rep.hit_samples.len(), 2);
    let (rate, n) = super::hit_rate_between(&rep.hit_samples, 1_500_000, 2_500_000);
    assert_eq!((rate, n), (1.0, 1), "only y, capped at its input");
    assert_eq!(super::hit_rate_between(&rep.hit_samples, 0, 1), (0.0, 0));
    let json = serde_json::to_string(&rep).unwrap();
    let back: Report = serde_json::from_str(&json).unwrap();
    assert_eq!(
        back,
        Report {
            hit_samples: Vec::new(),
            ..rep.clone()
        }
    );
    assert!(json.contains("\"mode\":\"round-robin\""));
}

#[test]
fn imbalance_takes_the_worst_pool() {
    let c = |w: &str, role, jobs| WorkerCount {
        worker: w.into(),
        role,
        jobs,
    };
    let even = [c("a", Role::Aggregated, 5), c("b", Role::Aggregated, 5)];
    assert_eq!(imbalance(&even), 1.0);
    let disagg = [
        c("p1", Role::Prefill, 4),
        c("p2", Role::Prefill, 4),
        c("d1", Role::Decode, 6),
        c("d2", Role::Decode, 1),
        c("d3", Role::Decode, 2),
    ];
    assert!((imbalance(&disagg) - 2.0).abs() < 1e-12);
    assert_eq!(imbalance(&[]), 0.0);
}

fn sample(label: &str, mode: Mode, ttft_ms: f64, hit: f64) -> Report {
    Report {
        label: label.into(),
        mode,
        requests: 10,
        finished: 10,
        hit_rate: hit,
        ttft_us: Percentiles {
            p50: ttft_ms * 1000.0,
            p90: ttft_ms * 2000.0,
            p99: ttft_ms * 3000.0,
            max: ttft_ms * 3000.0,
            count: 10,
        },
        ..Default::default()
    }
}

#[test]
fn table_has_a_row_per_report() {
    let mut kv = sample("kv", Mode::Kv, 120.0, 0.3);
    kv.set_decision_latencies(&[3.0, 5.0]);
    let t = table(&[kv, sample("", Mode::Random, 450.0, 0.05)]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("mode"));
    assert!(lines[1].starts_with("kv ") && lines[1].contains("30.0") && lines[1].contains("120.0"));
    assert!(lines[2].starts_with("random") && lines[2].contains("1350.0"));
    assert!(lines[1].contains("5.0") && lines[2].contains(" -"));
    // Columns line up.
    assert!(lines.iter().all(|l| l.len() == lines[0].len()));
}

#[test]
fn chart_has_a_series_per_mode() {
    let reports = [
        sample("kv", Mode::Kv, 120.0, 0.3),
        sample("round-robin", Mode::RoundRobin, 450.0, 0.05),
        sample("a<b", Mode::LeastLoaded, 0.0, 0.0),
    ];
    let svg = svg_chart(&reports);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("class=\"series\"").count(), 3);
    for name in ["kv", "round-robin", "a&lt;b"] {
        assert!(svg.contains(&format!("data-series=\"{name}\"")), "{name}");
    }
    assert!(!svg.contains("a<b"), "labels are escaped");
    // Each series: 3 TTFT bars + 1 hit-rate bar + 1 legend swatch.
    let kv = svg.split("data-series=\"kv\"").nth(1).unwrap();
    let kv = &kv[..kv.find("</g>").unwrap()];
    assert_eq!(kv.matches("<rect").count(), 5);
    assert!(kv.contains("30.0%"));
    assert!(svg_chart(&[]).contains("</svg>"));
}

#[test]
fn nice_axis_maximum() {
    assert_eq!(svg::nice_max(1350.0), 2000.0);
    assert_eq!(svg::nice_max(0.0), 1.0);
    assert_eq!(svg::nice_max(5.0), 5.0);
}
