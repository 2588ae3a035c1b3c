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
        ..Default::default()
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

#[test]
fn imbalance_per_device_class_on_mixed_fleets_only() {
    let c = |w: &str, device, jobs| WorkerCount {
        worker: w.into(),
        role: Role::Aggregated,
        jobs,
        device,
    };
    let gpu_only = [c("g1", DeviceClass::Gpu, 9), c("g2", DeviceClass::Gpu, 1)];
    assert!(imbalance_by_device(&gpu_only).is_empty());
    let mixed = [
        c("g1", DeviceClass::Gpu, 90),
        c("g2", DeviceClass::Gpu, 110),
        c("c1", DeviceClass::Cpu, 10),
        c("c2", DeviceClass::Cpu, 30),
    ];
    let by = imbalance_by_device(&mixed);
    assert_eq!(by.len(), 2);
    assert_eq!(
        (by[0].device, by[0].workers, by[0].jobs),
        (DeviceClass::Gpu, 2, 200)
    );
    assert!((by[0].imbalance - 1.1).abs() < 1e-12);
    assert_eq!((by[1].device, by[1].max_jobs), (DeviceClass::Cpu, 30));
    assert!((by[1].mean_jobs - 20.0).abs() < 1e-12);
    assert!((by[1].imbalance - 1.5).abs() < 1e-12);
    let rep = Report {
        label: "kv".into(),
        imbalance_by_device: by,
        ..Default::default()
    };
    let t = device_table(std::slice::from_ref(&rep));
    assert!(
        t.contains("per device class") && t.contains("cpu") && t.contains("1.50"),
        "{t}"
    );
    assert!(device_table(&[Report::default()]).is_empty());
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
fn log_axis_ticks_and_labels() {
    let a = svg::LogAxis::around([0.0, 530.0, 11_398.0, f64::NAN].into_iter());
    assert_eq!((a.lo, a.hi), (100.0, 100_000.0));
    assert_eq!(a.ticks(), vec![100.0, 1000.0, 10_000.0, 100_000.0]);
    assert_eq!(a.frac(100.0), 0.0);
    assert!((a.frac(1000.0) - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(a.frac(1e9), 1.0);
    let narrow = svg::LogAxis::around([3.0, 40.0].into_iter());
    assert_eq!(narrow.ticks(), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
    assert_eq!(svg::LogAxis::around(std::iter::empty()).hi, 10.0);
    assert_eq!(svg::fmt_ms(530.8), "531 ms");
    assert_eq!(svg::fmt_ms(11_398.7), "11.4 s");
    assert_eq!(svg::fmt_ms(0.5), "0.50 ms");
    assert_eq!(svg::fmt_tick_ms(10_000.0), "10 s");
    assert_eq!(svg::fmt_tick_ms(100.0), "100 ms");
    assert_eq!(svg::fmt_tick_ms(2_500.0), "2.5 s");
    assert_eq!(svg::pct_axis(13.7 * 1.15), (20.0, 5.0));
    assert_eq!(svg::pct_axis(43.0), (50.0, 10.0));
    assert_eq!(svg::pct_axis(99.0), (100.0, 20.0));
    assert_eq!(svg::pct_axis(0.0), (1.0, 1.0));
}

#[test]
fn long_labels_wrap_at_commas() {
    assert_eq!(svg::wrap("kv", 10), ["kv"]);
    assert_eq!(
        svg::wrap("kv[a=1,bb=2,c=3]", 8),
        ["kv[a=1,", "bb=2,", "c=3]"]
    );
    assert_eq!(svg::wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
    let long = format!("kv[{}]", ["overlap_score_credit=0.5"; 12].join(","));
    let svg = svg_chart_with_bound(&[sample(&long, Mode::Kv, 10.0, 0.2)], Some(0.37));
    assert!(svg.contains("bound") && svg.contains("37.0%"));
    // The drawing grew to hold the wrapped legend.
    let h: f64 = svg
        .split("height=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(h > 380.0, "{h}");
}
