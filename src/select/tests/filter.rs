//! Hard filters, their rejection reasons, and the errors they lead to.

use super::*;

/// The rejection recorded for each worker in an explained decision.
fn reasons(d: &Decision) -> Vec<(u16, Rejection)> {
    d.rejected.iter().map(|r| (r.worker, r.reason)).collect()
}

#[test]
fn model_must_match_exactly() {
    let ws = vec![
        W::new("a").model("llama").dev(9),
        W::new("b").dev(1),
        W::new("c").model("qwen"),
    ];
    assert_eq!(Case::new().decide(&ws).unwrap().decode_worker, 1);
    let llama = Case::new().filters(|f| f.model = "llama".into());
    assert_eq!(llama.decide(&ws).unwrap().decode_worker, 0);
    let err = Case::new()
        .filters(|f| f.model = "Llama".into())
        .decide(&ws)
        .unwrap_err();
    assert_eq!(
        err,
        RouteError::NoWorkers {
            model: "Llama".into()
        }
    );
    assert!(err.to_string().contains("Llama"));
}

#[test]
fn not_live_workers_are_never_chosen() {
    let ws = vec![W::new("a").dev(10).dead(), W::new("b")];
    let d = Case::new().explain().decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 1);
    assert_eq!(reasons(&d), vec![(0, Rejection::NotLive)]);
    let all_dead = vec![W::new("a").dead(), W::new("b").dead()];
    let err = Case::new().decide(&all_dead).unwrap_err();
    let RouteError::AllFiltered { stage, rejections } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*stage, Stage::Aggregated);
    assert_eq!(rejections.get(Rejection::NotLive), 2);
    assert_eq!(rejections.total(), 2);
    assert!(err.to_string().contains("2 not live"), "{err}");
}

#[test]
fn shared_role_is_never_a_candidate() {
    let ws = vec![W::new("store").role(Role::Shared).dev(10), W::new("a")];
    let d = Case::new().explain().decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 1);
    assert!(d.rejected.is_empty(), "pool membership is not a rejection");
    assert_eq!(d.candidates.len(), 1);
    let only = vec![W::new("store").role(Role::Shared)];
    assert!(matches!(
        Case::new().decide(&only),
        Err(RouteError::NoWorkers { .. })
    ));
}

#[test]
fn allow_list_restricts_candidates() {
    let ws = worked_example();
    let case = Case::new()
        .explain()
        .filters(|f| f.allow = Some(vec!["w1".into(), "w3".into()]));
    let d = case.decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 2);
    assert_eq!(reasons(&d), vec![(1, Rejection::AllowList)]);
    let none = Case::new().filters(|f| f.allow = Some(vec![]));
    let err = none.decide(&ws).unwrap_err();
    assert!(err.to_string().contains("3 not in allow-list"), "{err}");
}

#[test]
fn pin_restricts_to_one_worker_in_any_mode() {
    let ws = worked_example();
    for mode in [Mode::Kv, Mode::Random, Mode::LeastLoaded, Mode::RoundRobin] {
        let d = Case::new()
            .mode(mode)
            .explain()
            .filters(|f| f.pin = Some("w3".into()))
            .decide(&ws)
            .unwrap();
        assert_eq!(d.decode_worker, 2, "{mode:?}");
        assert_eq!(reasons(&d), vec![(0, Rejection::Pin), (1, Rejection::Pin)]);
    }
}

#[test]
fn pinned_worker_filtered_is_not_pin_not_found() {
    let ws = vec![W::new("a").dead(), W::new("b")];
    let err = Case::new()
        .filters(|f| f.pin = Some("a".into()))
        .decide(&ws)
        .unwrap_err();
    let RouteError::AllFiltered { rejections, .. } = err else {
        panic!("{err:?}");
    };
    assert_eq!(rejections.get(Rejection::NotLive), 1);
    assert_eq!(rejections.get(Rejection::Pin), 1);
}

#[test]
fn dp_bounds_filter_and_pick_lowest_rank_of_intersection() {
    let ws = vec![W::new("a").dp(0, 3).unique(5.0), W::new("b").dp(6, 7)];
    // No bounds: the cheaper worker, at its lowest rank.
    let d = Case::new().decide(&ws).unwrap();
    assert_eq!((d.decode_worker, d.dp_rank), (1, 6));
    let d = Case::new()
        .explain()
        .filters(|f| f.dp = Some(DpBounds { lo: 2, hi: 5 }))
        .decide(&ws)
        .unwrap();
    assert_eq!((d.decode_worker, d.dp_rank), (0, 2));
    assert_eq!(reasons(&d), vec![(1, Rejection::DpRanks)]);
    let d = Case::new()
        .filters(|f| f.dp = Some(DpBounds { lo: 7, hi: 9 }))
        .decide(&ws)
        .unwrap();
    assert_eq!((d.decode_worker, d.dp_rank), (1, 7));
}

#[test]
fn taints_need_every_toleration() {
    let ws = vec![
        W::new("a").taint("gpu-a100").dev(10),
        W::new("b").taint("gpu-a100").taint("spot").dev(8),
        W::new("c"),
    ];
    let d = Case::new().explain().decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 2);
    assert_eq!(
        reasons(&d),
        vec![(0, Rejection::Taint), (1, Rejection::Taint)]
    );
    let one = Case::new().filters(|f| f.tolerations = vec!["gpu-a100".into()]);
    assert_eq!(one.decide(&ws).unwrap().decode_worker, 0);
    let both = Case::new().filters(|f| f.tolerations = vec!["spot".into(), "gpu-a100".into()]);
    let d = both
        .filters(|f| f.allow = Some(vec!["b".into(), "c".into()]))
        .decide(&ws)
        .unwrap();
    assert_eq!(d.decode_worker, 1);
}

#[test]
fn busy_threshold_skips_overloaded_workers() {
    // Capacity 100, threshold 0.5: 50 distinct active blocks is busy, 49 is not.
    let ws = vec![
        W::new("a").cap(100).unique(50.0).dev(10),
        W::new("b").cap(100).unique(49.0),
    ];
    let case = Case::new().cfg(|c| c.busy_threshold = Some(0.5)).explain();
    let d = case.decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 1);
    assert_eq!(reasons(&d), vec![(0, Rejection::Busy)]);
    // Without the threshold the cached worker wins.
    assert_eq!(Case::new().decide(&ws).unwrap().decode_worker, 0);
}

#[test]
fn busy_uses_the_active_block_rule() {
    // blocks_unique is small but the per-request total is large.
    let ws = vec![W::new("a").cap(100).unique(10.0).total(80.0)];
    let reuse = Case::new().cfg(|c| c.busy_threshold = Some(0.5));
    assert!(reuse.decide(&ws).is_ok());
    let no_reuse = reuse.clone().cfg(|c| c.assume_kv_reuse = false);
    assert_eq!(
        no_reuse.decide(&ws),
        Err(RouteError::AllBusy {
            stage: Stage::Aggregated
        })
    );
    // Output placeholders count when tracked.
    let ws = vec![W::new("a").cap(100).unique(30.0).output(25.0)];
    assert!(reuse.decide(&ws).is_ok());
    let out = reuse.cfg(|c| c.track_output_blocks = true);
    assert!(matches!(out.decide(&ws), Err(RouteError::AllBusy { .. })));
}

#[test]
fn all_busy_only_when_busy_is_what_is_left() {
    let ws = vec![
        W::new("a").cap(10).unique(10.0),
        W::new("b").cap(10).unique(10.0).dead(),
    ];
    let case = Case::new().cfg(|c| c.busy_threshold = Some(0.9));
    let err = case.decide(&ws).unwrap_err();
    assert_eq!(
        err,
        RouteError::AllBusy {
            stage: Stage::Aggregated
        }
    );
    assert!(err.to_string().contains("busy"));
    let ws = vec![W::new("b").cap(10).unique(10.0).dead()];
    assert!(matches!(
        case.decide(&ws),
        Err(RouteError::AllFiltered { .. })
    ));
}

#[test]
fn rejection_counts_display() {
    let mut c = RejectionCounts::default();
    assert_eq!(c.to_string(), "no workers");
    c.add(Rejection::NotLive);
    c.add(Rejection::NotLive);
    c.add(Rejection::Busy);
    assert_eq!(c.to_string(), "2 not live, 1 busy");
    assert_eq!(c.total(), 3);
}

#[test]
fn explain_is_empty_without_the_flag() {
    let ws = vec![W::new("a").dead(), W::new("b")];
    let d = Case::new().decide(&ws).unwrap();
    assert!(d.candidates.is_empty() && d.rejected.is_empty());
}
