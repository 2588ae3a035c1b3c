//! Unit tests of the load tracker's lifecycle rules (DESIGN §1 "Active load model"),
//! including out-of-order and repeated notifications.

use super::*;
use crate::config::{PrefillLoadModel, RouterConfig};
use crate::types::WorkerSlot;

const BS: u32 = 16;

fn cfg() -> RouterConfig {
    RouterConfig {
        block_size: BS,
        ..Default::default()
    }
}

fn tracker() -> LoadTracker {
    LoadTracker::new(BS, &cfg())
}

fn req(id: &str, d: WorkerSlot, p: Option<WorkerSlot>, isl: u32, cached: u32) -> NewRequest {
    NewRequest {
        id: id.to_string(),
        decode_worker: d,
        prefill_worker: p,
        input_tokens: isl,
        cached_tokens: cached,
        prompt_blocks: isl.div_ceil(BS),
        hashes: vec![u64::from(isl), 7, 9],
        expected_output_tokens: None,
        now_us: 1_000,
        pinned: false,
    }
}

fn all_aggs(t: &LoadTracker) -> Vec<WorkerAgg> {
    (0..8).map(|w| t.agg(w)).collect()
}

fn assert_all_zero(t: &LoadTracker) {
    for w in 0..8 {
        assert!(t.agg(w).is_zero(), "worker {w}: {:?}", t.agg(w));
    }
    assert_eq!(t.active_requests(), 0);
}

#[test]
fn aggregated_route_counts_prefill_and_decode_on_one_worker() {
    let mut t = tracker();
    t.on_route(req("a", 1, None, 100, 30)).unwrap();
    let a = t.agg(1);
    assert_eq!(a.active_requests, 1);
    assert_eq!(a.prefill_requests, 1);
    assert_eq!(a.prefill_tokens, 70, "effective isl = input - cached");
    assert_eq!(a.blocks_total, 7);
    assert_eq!(a.output_blocks_milli, 0);
    assert_eq!(a.oldest_prefill, None, "full model keeps no prefill order");
    assert!(t.agg(0).is_zero());
    assert!(t.agg(5000).is_zero(), "unknown slot is zero");
    // Cached beyond input saturates at 0.
    t.on_route(req("b", 1, None, 10, 50)).unwrap();
    assert_eq!(t.agg(1).prefill_tokens, 70);
    assert_eq!(t.agg(1).prefill_requests, 2);
    assert_eq!(t.active_requests(), 2);
}

#[test]
fn disaggregated_route_splits_prefill_and_decode() {
    let mut t = tracker();
    t.on_route(req("a", 2, Some(3), 64, 0)).unwrap();
    assert_eq!(t.agg(3).prefill_tokens, 64);
    assert_eq!(t.agg(3).prefill_requests, 1);
    assert_eq!(t.agg(3).active_requests, 0);
    assert_eq!(t.agg(3).blocks_total, 0);
    assert_eq!(t.agg(2).active_requests, 1);
    assert_eq!(t.agg(2).blocks_total, 4);
    assert_eq!(t.agg(2).prefill_tokens, 0);
    assert!(t.on_first_token("a", 1500).unwrap());
    assert!(t.agg(3).is_zero());
    assert_eq!(t.agg(2).active_requests, 1);
    let f = t.on_finish("a", 2000).unwrap();
    assert_eq!((f.decode_worker, f.prefill_worker), (2, Some(3)));
    assert_all_zero(&t);
}

#[test]
fn first_token_once_and_duplicate_ignored() {
    let mut t = tracker();
    t.on_route(req("a", 0, None, 100, 0)).unwrap();
    assert!(t.on_first_token("a", 1_400).unwrap());
    assert_eq!(t.agg(0).prefill_tokens, 0);
    assert_eq!(t.agg(0).prefill_requests, 0);
    assert_eq!(t.agg(0).active_requests, 1);
    assert_eq!(t.predictor().samples(), 1);
    let before = all_aggs(&t);
    assert!(!t.on_first_token("a", 1_500).unwrap());
    assert_eq!(all_aggs(&t), before);
    assert_eq!(
        t.predictor().samples(),
        1,
        "duplicate does not feed the predictor"
    );
    let info = t.get("a").unwrap();
    assert_eq!(info.phase, Phase::Decode);
    assert_eq!(info.first_token_us, Some(1_400));
}

#[test]
fn first_token_before_route_time_gives_no_sample() {
    let mut t = tracker();
    t.on_route(req("a", 0, None, 100, 0)).unwrap();
    assert!(t.on_first_token("a", 10).unwrap());
    assert_eq!(t.predictor().samples(), 0);
    assert_eq!(t.agg(0).prefill_tokens, 0);
}

#[test]
fn finish_before_first_token_removes_prefill_too() {
    let mut t = tracker();
    t.on_route(req("a", 4, None, 100, 20)).unwrap();
    let f = t.on_finish("a", 5_000).unwrap();
    assert_eq!(f.id, "a");
    assert_eq!(f.hashes, vec![100, 7, 9]);
    assert_eq!(f.reason, FinishReason::Finished);
    assert_eq!(f.first_token_us, None);
    assert_eq!(f.prompt_blocks, 7);
    assert_all_zero(&t);
    assert_eq!(t.predictor().samples(), 0);
}

#[test]
fn unknown_and_invalid_ids_change_nothing() {
    let mut t = tracker();
    t.on_route(req("a", 1, Some(2), 100, 0)).unwrap();
    let mut dirty = Vec::new();
    t.take_dirty(&mut dirty);
    assert_eq!(dirty.len(), 2);
    dirty.clear();
    let before = all_aggs(&t);
    let e = LifecycleError::UnknownRequest;
    assert_eq!(t.on_first_token("b", 2), Err(e));
    assert_eq!(t.on_progress("b", 50, 2), Err(e));
    assert_eq!(t.on_finish("b", 2), Err(e));
    assert_eq!(t.on_prefill_failed("b", 2), Err(e));
    let long = "x".repeat(129);
    for id in ["", long.as_str()] {
        assert_eq!(t.on_first_token(id, 2), Err(LifecycleError::InvalidId));
        assert_eq!(t.on_progress(id, 5, 2), Err(LifecycleError::InvalidId));
        assert_eq!(t.on_finish(id, 2), Err(LifecycleError::InvalidId));
        assert_eq!(t.on_prefill_failed(id, 2), Err(LifecycleError::InvalidId));
        let mut r = req("z", 1, None, 10, 0);
        r.id = id.to_string();
        assert_eq!(t.on_route(r), Err(LifecycleError::InvalidId));
    }
    assert_eq!(all_aggs(&t), before);
    assert_eq!(t.active_requests(), 1);
    t.take_dirty(&mut dirty);
    assert!(dirty.is_empty(), "rejected calls mark nothing dirty");
}

#[test]
fn double_finish_is_unknown() {
    let mut t = tracker();
    t.on_route(req("a", 1, None, 100, 0)).unwrap();
    t.on_first_token("a", 2_000).unwrap();
    t.on_finish("a", 3_000).unwrap();
    assert_eq!(t.on_finish("a", 3_001), Err(LifecycleError::UnknownRequest));
    assert_eq!(
        t.on_prefill_failed("a", 3_001),
        Err(LifecycleError::UnknownRequest)
    );
    assert_eq!(
        t.on_first_token("a", 3_002),
        Err(LifecycleError::UnknownRequest)
    );
    assert_all_zero(&t);
}

#[test]
fn duplicate_route_rejected_and_original_kept() {
    let mut t = tracker();
    t.on_route(req("a", 1, None, 100, 0)).unwrap();
    let before = all_aggs(&t);
    assert_eq!(
        t.on_route(req("a", 2, None, 50, 0)),
        Err(LifecycleError::Duplicate)
    );
    assert_eq!(all_aggs(&t), before);
    assert_eq!(t.get("a").unwrap().decode_worker, 1);
    t.on_finish("a", 2).unwrap();
    // The id is free again once finished.
    t.on_route(req("a", 2, None, 50, 0)).unwrap();
    assert_eq!(t.agg(2).active_requests, 1);
}

#[test]
fn progress_before_first_token_implies_it() {
    let mut t = tracker();
    t.on_route(req("a", 0, None, 100, 0)).unwrap();
    t.on_progress("a", 0, 1_100).unwrap();
    assert_eq!(
        t.get("a").unwrap().phase,
        Phase::Prefill,
        "0 tokens: no info"
    );
    t.on_progress("a", 3, 1_200).unwrap();
    assert_eq!(t.agg(0).prefill_tokens, 0);
    assert_eq!(t.agg(0).prefill_requests, 0);
    let info = t.get("a").unwrap();
    assert_eq!(info.phase, Phase::Decode);
    assert_eq!(info.first_token_us, Some(1_200));
    assert_eq!(info.output_tokens, 3);
    assert_eq!(
        t.predictor().samples(),
        0,
        "progress is only an upper bound"
    );
    // The late first token is a duplicate now.
    assert!(!t.on_first_token("a", 1_300).unwrap());
    // Progress is monotone.
    t.on_progress("a", 2, 1_400).unwrap();
    assert_eq!(t.get("a").unwrap().output_tokens, 3);
    t.on_finish("a", 2_000).unwrap();
    assert_all_zero(&t);
}

#[test]
fn prefill_failed_acts_like_finish_and_allows_fallback_route() {
    let mut t = tracker();
    t.on_route(req("a", 1, Some(2), 100, 10)).unwrap();
    let f = t.on_prefill_failed("a", 1_500).unwrap();
    assert_eq!(f.reason, FinishReason::PrefillFailed);
    assert_eq!(f.prefill_worker, Some(2));
    assert_all_zero(&t);
    // Aggregated fallback with the same id.
    t.on_route(req("a", 1, None, 100, 0)).unwrap();
    assert_eq!(t.agg(1).prefill_tokens, 100);
    assert!(t.agg(2).is_zero());
}

#[test]
fn remove_worker_drops_its_requests_and_releases_its_prefills() {
    let mut t = tracker();
    t.on_route(req("d1", 1, None, 32, 0)).unwrap(); // aggregated on 1
    t.on_route(req("d2", 1, Some(2), 48, 0)).unwrap(); // decode on 1, prefill on 2
    t.on_route(req("p1", 3, Some(1), 64, 0)).unwrap(); // prefill on 1, decode on 3
    t.on_route(req("o", 3, Some(2), 16, 0)).unwrap(); // unrelated
    t.on_progress("d1", 20, 2_000).unwrap();
    let mut gone = t.remove_worker(1);
    gone.sort_by(|a, b| a.id.cmp(&b.id));
    let ids: Vec<&str> = gone.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids, ["d1", "d2"]);
    assert!(gone.iter().all(|f| f.reason == FinishReason::WorkerRemoved));
    assert_eq!(gone[0].output_tokens, 20);
    assert!(t.agg(1).is_zero());
    // d2's prefill on 2 is released with it; o's stays.
    assert_eq!(t.agg(2).prefill_tokens, 16);
    assert_eq!(t.agg(2).prefill_requests, 1);
    // p1 stays, decoding on 3, no longer counted as prefill anywhere.
    let p1 = t.get("p1").unwrap();
    assert_eq!(p1.phase, Phase::Decode);
    assert_eq!(p1.first_token_us, None);
    assert_eq!(t.agg(3).active_requests, 2);
    assert_eq!(
        t.on_finish("d1", 3_000),
        Err(LifecycleError::UnknownRequest)
    );
    assert!(!t.on_first_token("p1", 3_000).unwrap());
    t.on_prefill_failed("p1", 3_000).unwrap();
    t.on_finish("o", 3_000).unwrap();
    assert_all_zero(&t);
    assert!(t.remove_worker(6).is_empty());
}

#[test]
fn output_blocks_with_osl_hint() {
    let mut t = LoadTracker::new(
        BS,
        &RouterConfig {
            track_output_blocks: true,
            ..cfg()
        },
    );
    let mut r = req("h", 0, None, 32, 0);
    r.expected_output_tokens = Some(100);
    t.on_route(r).unwrap();
    t.on_route(req("n", 0, None, 32, 0)).unwrap();
    t.on_progress("h", 15, 10).unwrap();
    assert_eq!(t.agg(0).output_blocks_milli, 0, "no completed block yet");
    t.on_progress("h", 32, 11).unwrap(); // 2 blocks × 0.68
    assert_eq!(t.agg(0).output_blocks_milli, 1360);
    t.on_progress("h", 64, 12).unwrap(); // 4 × 0.36
    assert_eq!(t.agg(0).output_blocks_milli, 1440);
    t.on_progress("h", 40, 13).unwrap(); // smaller: ignored
    assert_eq!(t.agg(0).output_blocks_milli, 1440);
    t.on_progress("h", 96, 14).unwrap(); // 6 × 0.04
    assert_eq!(t.agg(0).output_blocks_milli, 240);
    // Without a hint blocks count fully.
    t.on_progress("n", 47, 15).unwrap();
    assert_eq!(t.agg(0).output_blocks_milli, 240 + 2000);
    assert_eq!(t.load(0, 15).output_blocks, 2.24);
    t.on_progress("h", 150, 16).unwrap(); // past the hint
    assert_eq!(t.agg(0).output_blocks_milli, 2000);
    assert_eq!(t.get("n").unwrap().output_blocks_milli, 2000);
    t.on_finish("n", 17).unwrap();
    t.on_finish("h", 17).unwrap();
    assert_all_zero(&t);
}

#[test]
fn output_blocks_off_by_default() {
    let mut t = tracker();
    t.on_route(req("n", 0, None, 32, 0)).unwrap();
    t.on_progress("n", 1000, 5).unwrap();
    assert_eq!(t.agg(0).output_blocks_milli, 0);
    assert_eq!(t.get("n").unwrap().output_tokens, 1000);
}

fn predicted_tracker() -> LoadTracker {
    // Fallback: 100 µs + 1 µs/token, never replaced (min samples huge).
    LoadTracker::new(
        BS,
        &RouterConfig {
            prefill_load_model: PrefillLoadModel::Predicted,
            prefill_fallback_us: [100.0, 1.0, 0.0],
            predictor_min_samples: u32::MAX,
            ..cfg()
        },
    )
}

#[test]
fn predicted_model_decays_oldest_prefill() {
    let mut t = predicted_tracker();
    let mut a = req("a", 0, None, 300, 0); // predicted 400 µs
    a.now_us = 1_000;
    let mut b = req("b", 0, None, 200, 0);
    b.now_us = 1_100;
    t.on_route(b.clone()).unwrap();
    t.on_route(a).unwrap(); // routed earlier, arrives later: still the oldest
    let o = t.agg(0).oldest_prefill.unwrap();
    assert_eq!((o.started_us, o.tokens, o.predicted_us), (1_000, 300, 400));
    assert_eq!(t.get("a").unwrap().predicted_prefill_us, Some(400));
    let at = |t: &LoadTracker, now| t.load(0, now).prefill_tokens;
    assert_eq!(at(&t, 1_000), 500.0);
    assert_eq!(at(&t, 1_100), 200.0 + 225.0);
    assert_eq!(at(&t, 1_200), 200.0 + 150.0);
    assert_eq!(at(&t, 1_400), 200.0);
    assert_eq!(at(&t, 9_000), 200.0);
    // The full view of the same aggregate is unchanged.
    assert_eq!(
        t.agg(0).load(PrefillLoadModel::Full, 1_200).prefill_tokens,
        500.0
    );
    // a completes: b (predicted 300 µs from 1100) becomes the oldest.
    t.on_first_token("a", 1_300).unwrap();
    let o = t.agg(0).oldest_prefill.unwrap();
    assert_eq!((o.started_us, o.tokens, o.predicted_us), (1_100, 200, 300));
    assert_eq!(at(&t, 1_250), 100.0);
    t.on_finish("b", 1_500).unwrap();
    assert_eq!(t.agg(0).oldest_prefill, None);
    t.on_finish("a", 1_500).unwrap();
    assert_all_zero(&t);
}

#[test]
fn predicted_model_equal_route_times_are_distinct() {
    let mut t = predicted_tracker();
    for id in ["x", "y", "z"] {
        t.on_route(req(id, 5, None, 100, 0)).unwrap();
    }
    assert_eq!(t.agg(5).prefill_requests, 3);
    t.on_finish("x", 2_000).unwrap();
    assert_eq!(t.agg(5).oldest_prefill.unwrap().tokens, 100);
    t.on_first_token("y", 2_000).unwrap();
    t.on_progress("z", 1, 2_000).unwrap();
    assert_eq!(t.agg(5).oldest_prefill, None);
    assert_eq!(t.agg(5).prefill_tokens, 0);
}

#[test]
fn predictor_is_fed_by_first_tokens() {
    let mut t = LoadTracker::new(
        BS,
        &RouterConfig {
            prefill_load_model: PrefillLoadModel::Predicted,
            predictor_min_samples: 16,
            ..cfg()
        },
    );
    // True law: 500 µs + 10 µs per effective token (+0 per cached).
    for i in 0..40u32 {
        let id = format!("r{i}");
        let (isl, cached) = (200 + 97 * i, (i % 5) * 64);
        let mut r = req(&id, 0, None, isl, cached);
        r.now_us = 10_000 * u64::from(i);
        t.on_route(r.clone()).unwrap();
        let d = 500 + 10 * u64::from(isl - cached);
        t.on_first_token(&id, r.now_us + d).unwrap();
        t.on_finish(&id, r.now_us + d + 5).unwrap();
    }
    assert_eq!(t.predictor().samples(), 40);
    let mut r = req("q", 0, None, 3000, 0);
    r.now_us = 1_000_000;
    t.on_route(r).unwrap();
    let p = t.get("q").unwrap().predicted_prefill_us.unwrap();
    assert!((p as i64 - 30_500).abs() < 300, "predicted {p}");
}

#[test]
fn take_dirty_reports_changed_workers_once() {
    let mut t = tracker();
    let mut out = Vec::new();
    t.take_dirty(&mut out);
    assert!(out.is_empty());
    t.on_route(req("a", 1, Some(4), 100, 0)).unwrap();
    t.on_route(req("b", 1, None, 100, 0)).unwrap();
    t.take_dirty(&mut out);
    out.sort();
    assert_eq!(out, vec![1, 4]);
    out.clear();
    t.take_dirty(&mut out);
    assert!(out.is_empty());
    assert!(t.on_first_token("x", 5).is_err());
    t.on_first_token("a", 5).unwrap();
    t.take_dirty(&mut out);
    assert_eq!(out, vec![4]);
    out.clear();
    assert!(!t.on_first_token("a", 6).unwrap());
    t.take_dirty(&mut out);
    assert!(out.is_empty(), "a duplicate changes nothing");
    t.on_finish("a", 7).unwrap();
    t.take_dirty(&mut out);
    assert_eq!(out, vec![1]);
}

#[test]
fn per_core_aggregates_sum_to_single_tracker() {
    // Two "cores" each owning some requests vs one tracker owning them all.
    let mut one = predicted_tracker();
    let mut cores = [predicted_tracker(), predicted_tracker()];
    for i in 0..10u32 {
        let mut r = req(
            &format!("r{i}"),
            (i % 3) as WorkerSlot,
            None,
            50 + i * 10,
            i,
        );
        r.now_us = 1_000 + u64::from(i) * 7;
        one.on_route(r.clone()).unwrap();
        cores[(i % 2) as usize].on_route(r).unwrap();
    }
    for w in 0..3 {
        let mut sum = WorkerAgg::default();
        for c in &cores {
            sum.add(&c.agg(w));
        }
        assert_eq!(sum, one.agg(w), "worker {w}");
        assert_eq!(
            sum.load(PrefillLoadModel::Predicted, 1_050),
            one.load(w, 1_050)
        );
    }
}

#[test]
fn carried_requests_restore_the_same_load_and_finish_to_zero() {
    for model in [PrefillLoadModel::Full, PrefillLoadModel::Predicted] {
        let cfg = RouterConfig {
            block_size: BS,
            prefill_load_model: model,
            track_output_blocks: true,
            ..Default::default()
        };
        let mut t = LoadTracker::new(BS, &cfg);
        t.on_route(req("a", 1, None, 100, 30)).unwrap();
        t.on_route(req("b", 2, Some(3), 64, 0)).unwrap();
        let mut c = req("c", 1, None, 40, 0);
        c.expected_output_tokens = Some(100);
        c.pinned = true;
        t.on_route(c).unwrap();
        t.on_first_token("b", 2_000).unwrap();
        t.on_progress("c", 40, 3_000).unwrap();
        let mut carried = t.carry(5_000);
        carried.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(carried[0].age_us, 4_000);
        assert_eq!(carried[1].first_token_age_us, Some(3_000));
        // A pinned request stays pinned when carried (a load sync tells peers).
        let pins: Vec<bool> = carried.iter().map(|c| c.pinned).collect();
        assert_eq!(pins, [false, false, true]);
        let mut u = LoadTracker::new(BS, &cfg);
        for c in carried.iter().cloned() {
            u.restore(c, 10).unwrap();
        }
        let mut again = u.carry(20);
        again.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(again.iter().map(|c| c.pinned).collect::<Vec<_>>(), pins);
        assert_eq!(
            u.restore(carried[0].clone(), 10),
            Err(LifecycleError::Duplicate)
        );
        for w in 0..8 {
            let (a, b) = (t.agg(w), u.agg(w));
            // The oldest prefill's time moves to the new clock; the sums do not change.
            assert_eq!(
                (a.active_requests, a.prefill_requests, a.prefill_tokens),
                (b.active_requests, b.prefill_requests, b.prefill_tokens),
                "worker {w}"
            );
            assert_eq!(
                (a.blocks_total, a.output_blocks_milli),
                (b.blocks_total, b.output_blocks_milli)
            );
            assert_eq!(a.oldest_prefill.is_some(), b.oldest_prefill.is_some());
        }
        let samples = u.predictor().samples();
        assert_eq!(u.on_first_token("a", 20), Ok(true));
        assert_eq!(
            u.predictor().samples(),
            samples,
            "a carried first token is no sample"
        );
        for id in ["a", "b", "c"] {
            u.on_finish(id, 30).unwrap();
        }
        assert_all_zero(&u);
    }
}

#[test]
fn idle_requests_expire_and_every_lifecycle_call_restarts_the_ttl() {
    const TTL: u64 = 10_000;
    let mut t = tracker();
    // Routed at 1,000 µs (`req`).
    t.on_route(req("quiet", 1, None, 100, 0)).unwrap();
    t.on_route(req("streams", 2, Some(3), 64, 0)).unwrap();
    t.on_route(req("keepalive", 4, None, 32, 0)).unwrap();
    assert!(
        t.expire(1_000 + TTL - 1, TTL).is_empty(),
        "not before the TTL"
    );
    // Progress keeps a stream; a zero-token progress is a keep-alive.
    t.on_first_token("streams", 8_000).unwrap();
    t.on_progress("streams", 5, 9_000).unwrap();
    t.on_progress("keepalive", 0, 9_500).unwrap();
    let gone = t.expire(1_000 + TTL, TTL);
    assert_eq!(gone.len(), 1);
    let f = &gone[0];
    assert_eq!((f.id.as_str(), f.reason), ("quiet", FinishReason::Expired));
    assert_eq!(
        f.hashes,
        vec![100, 7, 9],
        "handed back to clear active blocks"
    );
    assert!(t.agg(1).is_zero(), "its load is released");
    assert_eq!(
        t.on_finish("quiet", 12_000),
        Err(LifecycleError::UnknownRequest)
    );
    // The others expire TTL after their last call, each exactly once, and their
    // prefill load (still in prefill on worker 4) goes too.
    assert_eq!(t.agg(4).prefill_requests, 1);
    let gone = t.expire(9_500 + TTL, TTL);
    assert_eq!(gone.len(), 2);
    assert_all_zero(&t);
    assert!(t.expire(u64::MAX, TTL).is_empty());
}

#[test]
fn a_carried_request_keeps_its_idle_time() {
    const TTL: u64 = 10_000;
    let mut t = tracker();
    t.on_route(req("r", 1, None, 64, 0)).unwrap();
    let carried = t.carry(4_000);
    assert_eq!(carried[0].idle_us, 3_000);
    assert!(carried[0].local, "routed here");
    // Taken over by another tracker whose clock reads 50,000: it expires when the
    // holder's copy would, 7,000 µs later.
    let mut peer = tracker();
    peer.restore(carried[0].clone(), 50_000).unwrap();
    assert!(!peer.carry(50_000)[0].local, "not routed there");
    assert!(peer.expire(56_999, TTL).is_empty());
    assert_eq!(peer.expire(57_000, TTL).len(), 1);
    assert_all_zero(&peer);
}
