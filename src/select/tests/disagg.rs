//! Disaggregated prefill/decode: detection, stage configs, pin scope, fallbacks,
//! topology and explain records.

use super::*;
use crate::config::TopologyPolicy;

fn p(id: &str) -> W {
    W::new(id).role(Role::Prefill)
}
fn d(id: &str) -> W {
    W::new(id).role(Role::Decode)
}

/// P0 cached but with heavy decode-side load (irrelevant for prefill), P1 idle;
/// D2 cached but loaded, D3 idle.
fn fleet() -> Vec<W> {
    vec![
        p("p0").dev(8).unique(500.0),
        p("p1"),
        d("d2").dev(10).unique(20.0).total(20.0),
        d("d3"),
    ]
}

#[test]
fn two_stages_with_stage_configs() {
    let ws = fleet();
    let case = Case::new();
    let dec = case.decide(&ws).unwrap();
    assert_eq!(
        dec.prefill_worker,
        Some(0),
        "track_active_blocks off for prefill"
    );
    assert_eq!(dec.decode_worker, 3, "credit 0 for decode");
    assert_eq!(dec.fallback, Fallback::None);
    assert_eq!(dec.overlap.device, 8, "overlap of the prefill worker");
    assert_eq!(dec.prefill_cost, Some(2.0));
    assert_eq!(
        dec.cost,
        10.0 + 10.0,
        "decode: uncredited prompt + new blocks"
    );
    assert_eq!(
        dec.prefill_cost,
        Some(terms(&case.cfg.prefill_stage(), case.req, &ws[0]).cost)
    );
    assert_eq!(
        dec.cost,
        terms(&case.cfg.decode_stage(), case.req, &ws[3]).cost
    );
}

#[test]
fn decode_stage_ignores_in_flight_prompt_tokens() {
    let ws = vec![
        p("p"),
        d("d1").queued(12_800.0),
        d("d2").unique(5.0).total(5.0),
    ];
    assert_eq!(Case::new().decide(&ws).unwrap().decode_worker, 1);
    // The same workers as an aggregated-style fallback do count them.
    let d = Case::new().prefill_failed().decide(&ws).unwrap();
    assert_eq!(d.decode_worker, 2);
}

#[test]
fn knob_disagg_decode_assume_kv_reuse() {
    // d1: 10 distinct blocks, holds all 10 prompt blocks, 20 per-request total.
    // d2: 15 distinct, holds none, 15 total.
    let ws = vec![
        p("p"),
        d("d1").unique(10.0).reuse(10).total(20.0),
        d("d2").unique(15.0).total(15.0),
    ];
    assert_eq!(Case::new().decide(&ws).unwrap().decode_worker, 2); // 40 vs 35
    let reuse = Case::new().cfg(|c| c.disagg_decode_assume_kv_reuse = true);
    assert_eq!(reuse.decide(&ws).unwrap().decode_worker, 1); // 20 vs 35
}

#[test]
fn detection_counts_registered_workers_of_any_liveness() {
    // A dead prefill worker still makes the model disaggregated.
    let ws = vec![p("p").dead(), W::new("a").dev(3), d("d").dev(9)];
    let dec = Case::new().explain().decide(&ws).unwrap();
    assert_eq!(dec.fallback, Fallback::NoPrefillWorkers);
    assert_eq!(dec.prefill_worker, None);
    assert_eq!(
        dec.decode_worker, 2,
        "fallback: base config, cache credit applies"
    );
    assert_eq!(dec.overlap.device, 9);
    // Other models' prefill workers do not count.
    let ws = vec![p("p").model("other"), W::new("a")];
    let dec = Case::new().decide(&ws).unwrap();
    assert_eq!((dec.fallback, dec.decode_worker), (Fallback::None, 1));
}

#[test]
fn fallback_no_prefill_workers_when_only_decode_registered() {
    let ws = vec![d("d0"), d("d1").dev(4)];
    let dec = Case::new().decide(&ws).unwrap();
    assert_eq!(dec.fallback, Fallback::NoPrefillWorkers);
    assert_eq!(dec.decode_worker, 1);
}

#[test]
fn fallback_prefill_filtered_out() {
    let ws = fleet();
    let allow = Case::new().filters(|f| f.allow = Some(vec!["d2".into(), "d3".into()]));
    let dec = allow.decide(&ws).unwrap();
    assert_eq!(dec.fallback, Fallback::PrefillFilteredOut);
    // Base config: d2 = 0 + (20 + 10), d3 = 10 + 10.
    assert_eq!((dec.decode_worker, dec.cost), (3, 20.0));
    let tainted = vec![p("p").taint("x"), d("d")];
    let dec = Case::new().decide(&tainted).unwrap();
    assert_eq!(dec.fallback, Fallback::PrefillFilteredOut);
    let busy = vec![p("p").cap(10).unique(10.0), d("d")];
    let dec = Case::new()
        .cfg(|c| c.busy_threshold = Some(0.5))
        .decide(&busy)
        .unwrap();
    assert_eq!(dec.fallback, Fallback::PrefillFilteredOut);
}

#[test]
fn fallback_prefill_failed() {
    let ws = fleet();
    let dec = Case::new().prefill_failed().explain().decide(&ws).unwrap();
    assert_eq!(dec.fallback, Fallback::PrefillFailed);
    assert_eq!(dec.prefill_worker, None);
    assert!(dec.candidates.iter().all(|e| e.stage == Stage::Aggregated));
    let slots: Vec<u16> = dec.candidates.iter().map(|e| e.worker).collect();
    assert_eq!(slots, vec![2, 3], "decode workers only");
}

#[test]
fn fallback_pool_includes_aggregated_workers_but_decode_stage_does_not() {
    let ws = vec![p("p").dead(), d("d").unique(50.0), W::new("a")];
    assert_eq!(Case::new().decide(&ws).unwrap().decode_worker, 2);
    let ws = vec![p("p"), d("d").dead(), W::new("a")];
    let err = Case::new().decide(&ws).unwrap_err();
    let RouteError::AllFiltered { stage, rejections } = err else {
        panic!("{err:?}");
    };
    assert_eq!(stage, Stage::Decode);
    assert_eq!(rejections.get(Rejection::NotLive), 1);
}

#[test]
fn missing_pools_are_errors() {
    let ws = vec![p("p")];
    let err = Case::new().decide(&ws).unwrap_err();
    assert!(
        matches!(
            err,
            RouteError::EmptyPool {
                stage: Stage::Decode,
                ..
            }
        ),
        "{err:?}"
    );
    let err = Case::new().prefill_failed().decide(&ws).unwrap_err();
    assert!(
        matches!(
            err,
            RouteError::EmptyPool {
                stage: Stage::Aggregated,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn pin_applies_to_the_decode_stage() {
    let ws = fleet();
    let pinned = Case::new().filters(|f| f.pin = Some("d2".into()));
    let dec = pinned.decide(&ws).unwrap();
    assert_eq!((dec.prefill_worker, dec.decode_worker), (Some(0), 2));
    let at_prefill = Case::new().filters(|f| f.pin = Some("p1".into()));
    let err = at_prefill.decide(&ws).unwrap_err();
    assert!(
        matches!(
            err,
            RouteError::PinNotFound {
                stage: Stage::Decode,
                ..
            }
        ),
        "{err:?}"
    );
    // Direct mode: prefill by cost, decode = the pin.
    let dec = pinned.mode(Mode::Direct).decide(&ws).unwrap();
    assert_eq!((dec.prefill_worker, dec.decode_worker), (Some(0), 2));
}

#[test]
fn allow_and_dp_apply_to_both_stages() {
    let ws = vec![p("p0").dev(8), p("p1").dp(2, 3), d("d2"), d("d3").dp(1, 2)];
    let allow = Case::new().filters(|f| f.allow = Some(vec!["p1".into(), "d3".into()]));
    let dec = allow.decide(&ws).unwrap();
    assert_eq!((dec.prefill_worker, dec.decode_worker), (Some(1), 3));
    let dp = Case::new().filters(|f| f.dp = Some(DpBounds { lo: 2, hi: 9 }));
    let dec = dp.decide(&ws).unwrap();
    assert_eq!(
        (dec.prefill_worker, dec.prefill_dp_rank),
        (Some(1), Some(2))
    );
    assert_eq!((dec.decode_worker, dec.dp_rank), (3, 2));
}

#[test]
fn request_mode_drives_both_stages() {
    let ws = vec![
        p("p0").active(4).dev(9),
        p("p1").active(1),
        d("d2").active(0),
        d("d3").active(3),
    ];
    let dec = Case::new().mode(Mode::LeastLoaded).decide(&ws).unwrap();
    assert_eq!((dec.prefill_worker, dec.decode_worker), (Some(1), 2));
    // Round-robin: both stages use the same cursor value, which advances once.
    let case = Case::new().mode(Mode::RoundRobin);
    let mut rng = SmallRng::seed_from_u64(1);
    let mut rr = RrState {
        counter: 1,
        ..Default::default()
    };
    let dec = case.decide_with(&ws, &mut rng, &mut rr).unwrap();
    assert_eq!((dec.prefill_worker, dec.decode_worker), (Some(1), 3));
    assert_eq!(rr.counter, 2);
}

fn topo_fleet(d_same_cost: f64) -> Vec<W> {
    vec![
        p("p").topo("zone-a"),
        d("far").topo("zone-b"),
        d("near").topo("zone-a").total(d_same_cost),
        d("none"),
    ]
}

#[test]
fn topology_none_ignores_domains() {
    let dec = Case::new().decide(&topo_fleet(20.0)).unwrap();
    assert!(dec.decode_worker == 1 || dec.decode_worker == 3);
}

#[test]
fn topology_restrict_keeps_the_prefill_domain() {
    let case = Case::new()
        .explain()
        .cfg(|c| c.topology_policy = TopologyPolicy::Restrict);
    let dec = case.decide(&topo_fleet(20.0)).unwrap();
    assert_eq!(dec.decode_worker, 2);
    let rej: Vec<(u16, Rejection)> = dec.rejected.iter().map(|r| (r.worker, r.reason)).collect();
    assert_eq!(
        rej,
        vec![(1, Rejection::Topology), (3, Rejection::Topology)]
    );
    let ws = vec![p("p").topo("zone-a"), d("far").topo("zone-b")];
    assert_eq!(
        case.decide(&ws).unwrap_err(),
        RouteError::NoDecodeInDomain {
            domain: "zone-a".into()
        }
    );
    // A prefill worker without a domain imposes none.
    let ws = vec![p("p"), d("far").topo("zone-b")];
    assert_eq!(case.decide(&ws).unwrap().decode_worker, 1);
}

#[test]
fn topology_prefer_charges_the_penalty() {
    let case = Case::new().cfg(|c| {
        c.topology_policy = TopologyPolicy::Prefer;
        c.topology_penalty = 32.0;
    });
    // near: 20 + 20 = 40 < far: 20 + 32.
    let dec = case.decide(&topo_fleet(20.0)).unwrap();
    assert_eq!((dec.decode_worker, dec.cost), (2, 40.0));
    // near: 40 + 20 = 60 > far: 52 (reported cost includes the penalty).
    let dec = case.decide(&topo_fleet(40.0)).unwrap();
    assert!(dec.decode_worker == 1 || dec.decode_worker == 3);
    assert_eq!(dec.cost, 52.0);
    let small = case.cfg(|c| c.topology_penalty = 5.0);
    let dec = small.decide(&topo_fleet(20.0)).unwrap();
    assert_ne!(dec.decode_worker, 2);
}

#[test]
fn explain_records_both_stages() {
    let mut ws = fleet();
    ws.push(d("dead").dead());
    let dec = Case::new().explain().decide(&ws).unwrap();
    let tags: Vec<(u16, Stage)> = dec.candidates.iter().map(|e| (e.worker, e.stage)).collect();
    assert_eq!(
        tags,
        vec![
            (0, Stage::Prefill),
            (1, Stage::Prefill),
            (2, Stage::Decode),
            (3, Stage::Decode)
        ]
    );
    assert!(dec.candidates[..2].iter().all(|e| e.decode_blocks == 0.0));
    assert_eq!(dec.candidates[0].overlap.device, 8);
    assert_eq!(
        dec.candidates[2].overlap.device, 10,
        "terms show overlap even without credit"
    );
    assert_eq!(dec.candidates[2].adjusted_prefill, 10.0);
    assert_eq!(dec.candidates[2].cost, 10.0 + 30.0);
    assert_eq!(dec.rejected.len(), 1);
    assert_eq!(
        (dec.rejected[0].worker, dec.rejected[0].stage),
        (4, Stage::Decode)
    );
}

#[test]
fn prefill_stage_counts_queued_prompts_despite_aggregated_tuning() {
    // p0 caches 8 of 10 blocks but has 40 blocks of prompts queued; p1 is idle.
    let ws = vec![p("p0").dev(8).queued(5_120.0), p("p1"), d("d")];
    let tuned = Case::new().cfg(|c| {
        c.prefill_load_scale = 8.0;
        c.track_prefill_tokens = false;
    });
    // p0: 8 * (50 - 8) = 336 > p1: 8 * 10 = 80.
    assert_eq!(tuned.decide(&ws).unwrap().prefill_worker, Some(1));
    // The pre-issue-15 behaviour, per stage: queue-blind prefill piles onto p0.
    let blind = tuned.cfg(|c| c.prefill_stage_track_prefill_tokens = Some(false));
    assert_eq!(blind.decide(&ws).unwrap().prefill_worker, Some(0));
}
