use super::*;

fn space() -> Space {
    Space {
        dims: vec![
            Dim::parse("a=0|1|2|3").unwrap(),
            Dim::parse("b=false|true").unwrap(),
            Dim::parse("c=x|y|z").unwrap(),
        ],
    }
}

/// A landscape with an interaction: `a=3` only pays off together with `b=true`.
fn figures(p: &Point) -> Figures {
    let mut t = 10.0;
    if p[0] == 3 && p[1] == 1 {
        t -= 6.0;
    } else if p[0] == 3 {
        t += 1.0;
    }
    t -= p[2] as f64 * 0.5;
    Figures {
        ttft_p99_us: t,
        e2e_p99_us: 1.0,
        hit_rate: 0.3,
        imbalance: 1.0,
        failed: false,
    }
}

fn run(budget: usize, chunk: usize, seed: u64) -> Search {
    let mut s = Search::new(space(), vec![0, 0, 0], Objective::default(), budget, seed).unwrap();
    loop {
        let b = s.next_batch(chunk);
        if b.is_empty() {
            break;
        }
        for p in &b {
            s.record(p, figures(p));
        }
    }
    s
}

#[test]
fn dims_parse_and_reject_garbage() {
    let d = Dim::parse(" prefill_load_scale = 1|8| 8 |16").unwrap();
    assert_eq!(d.key, "prefill_load_scale");
    assert_eq!(d.values, ["1", "8", "16"]);
    for bad in ["", "x", "x=", "=1|2", "x=||"] {
        assert!(Dim::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn start_point_matches_or_inserts_the_current_values() {
    let mut sp = Space::default_for(false, false);
    sp.set(Dim::parse("prefill_load_scale=2|8").unwrap());
    let cur = serde_json::to_value(crate::config::RouterConfig::default()).unwrap();
    let cur = cur.as_object().unwrap();
    let p = sp.start_point(cur).unwrap();
    let knobs = sp.knobs(&p);
    // 1.0 was not in the given values: inserted first; "1" matches 1.0 elsewhere.
    assert_eq!(knobs[0], ("prefill_load_scale".into(), "1.0".into()));
    assert_eq!(sp.dims[0].values, ["1.0", "2", "8"]);
    assert_eq!(knobs[1], ("track_prefill_tokens".into(), "true".into()));
    assert_eq!(knobs[2], ("overlap_score_credit".into(), "1".into()));
    assert_eq!(knobs[5], ("prefill_load_model".into(), "full".into()));
    let mut bad = Space {
        dims: vec![Dim::parse("nope=1|2").unwrap()],
    };
    assert!(bad.start_point(cur).is_err());
    assert!(Space::default_for(true, true)
        .dims
        .iter()
        .any(|d| d.key == "cuda_to_cpu_ratio"));
}

#[test]
fn objective_trades_ttft_hit_rate_and_balance() {
    let o = Objective {
        bound: 0.4,
        ..Objective::default()
    };
    let base = Figures {
        ttft_p99_us: 1000.0,
        e2e_p99_us: 4000.0,
        hit_rate: 0.3,
        imbalance: 1.1,
        failed: false,
    };
    assert_eq!(o.score(&base, &base), 1.0);
    let faster = Figures {
        ttft_p99_us: 500.0,
        ..base
    };
    assert_eq!(o.score(&faster, &base), 0.5);
    // Losing 0.1 of hit rate out of a 0.4 bound costs 0.25.
    let colder = Figures {
        hit_rate: 0.2,
        ..base
    };
    assert!((o.score(&colder, &base) - 1.25).abs() < 1e-9);
    let skewed = Figures {
        imbalance: 1.75,
        ..base
    };
    assert!((o.score(&skewed, &base) - 1.5).abs() < 1e-9);
    let slow_end = Figures {
        e2e_p99_us: 6000.0,
        ..base
    };
    assert_eq!(
        o.score(&slow_end, &base),
        1.0,
        "e2e counts only with a weight"
    );
    let with_e2e = Objective {
        e2e_weight: 0.5,
        ..o
    };
    assert!((with_e2e.score(&slow_end, &base) - 1.25).abs() < 1e-9);
    let failed = Figures {
        failed: true,
        ..faster
    };
    assert_eq!(o.score(&failed, &base), f64::INFINITY);
    assert!(Objective {
        hit_weight: -1.0,
        ..o
    }
    .validate()
    .is_err());
}

#[test]
fn mixed_fleets_are_balanced_per_device_class() {
    use crate::sim::report::DeviceImbalance;
    use crate::types::DeviceClass;
    let class = |device, imbalance| DeviceImbalance {
        device,
        imbalance,
        ..Default::default()
    };
    let r = Report {
        imbalance: 3.0,
        imbalance_by_device: vec![class(DeviceClass::Gpu, 1.1), class(DeviceClass::Cpu, 1.3)],
        ..Default::default()
    };
    assert_eq!(Figures::of(&r).imbalance, 1.3);
    let plain = Report {
        imbalance: 1.2,
        ..Default::default()
    };
    assert_eq!(Figures::of(&plain).imbalance, 1.2);
}

#[test]
fn search_finds_the_interaction_optimum_within_budget() {
    // Grid of 24; the optimum a=3,b=true,c=z needs two knobs changed together.
    let s = run(16, 4, 7);
    let (best, score) = s.best().unwrap();
    assert_eq!(best, vec![3, 1, 2], "{:?}", s.history());
    assert!((score - 3.0 / 10.0).abs() < 1e-9, "{score}");
    assert!(s.used() <= 16);
}

#[test]
fn budget_bounds_evaluations_and_nothing_runs_twice() {
    for budget in [1, 3, 10, 100] {
        let s = run(budget, 3, 1);
        let h = s.history();
        assert!(h.len() <= budget && h.len() <= 24, "{budget}: {}", h.len());
        let mut seen = std::collections::HashSet::new();
        assert!(h.iter().all(|(p, _)| seen.insert(p.clone())));
        assert_eq!(h[0].0, vec![0, 0, 0], "the start point comes first");
    }
    // A large budget sees the whole grid and stops.
    assert_eq!(run(1000, 5, 2).history().len(), 24);
    assert!(Search::new(space(), vec![0, 0, 0], Objective::default(), 0, 1).is_err());
    assert!(Search::new(space(), vec![9, 0, 0], Objective::default(), 5, 1).is_err());
}

#[test]
fn search_is_deterministic_for_a_seed() {
    assert_eq!(run(12, 4, 5).history(), run(12, 4, 5).history());
}
