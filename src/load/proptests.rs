//! Property tests: random interleavings of lifecycle calls (and expiries) over a few
//! ids and workers never panic (aggregate underflow is a `debug_assert`), keep every aggregate equal to
//! the sum of the active requests' contributions, and return to all-zero once every
//! request has left. The active-block shard is driven alongside, as the service would.

use super::*;
use crate::config::{PrefillLoadModel, RouterConfig};
use crate::types::WorkerSlot;
use proptest::prelude::*;
use std::collections::BTreeSet;

const IDS: [&str; 5] = ["a", "b", "c", "d", "e"];
const WORKERS: WorkerSlot = 4;
const BS: u32 = 8;

#[derive(Clone, Debug)]
enum Op {
    Route {
        id: usize,
        d: WorkerSlot,
        p: Option<WorkerSlot>,
        isl: u32,
        cached: u32,
        osl: Option<u32>,
        now: u64,
    },
    FirstToken(usize, u64),
    Progress(usize, u32, u64),
    Finish(usize),
    PrefillFailed(usize),
    RemoveWorker(WorkerSlot),
    /// `expire(now, ttl)`.
    Expire(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..IDS.len();
    let w = 0..WORKERS;
    prop_oneof![
        4 => (
            id.clone(),
            w.clone(),
            proptest::option::of(w.clone()),
            0..300u32,
            0..300u32,
            proptest::option::of(0..200u32),
            0..2_000u64
        )
            .prop_map(|(id, d, p, isl, cached, osl, now)| Op::Route {
                id,
                d,
                p,
                isl,
                cached,
                osl,
                now
            }),
        2 => (id.clone(), 0..3_000u64).prop_map(|(i, t)| Op::FirstToken(i, t)),
        3 => (id.clone(), 0..250u32, 0..3_000u64).prop_map(|(i, o, t)| Op::Progress(i, o, t)),
        2 => id.clone().prop_map(Op::Finish),
        1 => id.prop_map(Op::PrefillFailed),
        1 => w.prop_map(Op::RemoveWorker),
        1 => (0..4_000u64, 0..2_000u64).prop_map(|(now, ttl)| Op::Expire(now, ttl)),
    ]
}

fn hashes_of(id: usize, isl: u32) -> Vec<u64> {
    // Shared first block across ids, so refcounts above one happen.
    let mut h = vec![1];
    h.extend((1..isl.div_ceil(BS) as u64).map(|i| (id as u64) << 32 | i));
    h
}

/// Recomputes every worker's aggregate from the active requests and compares.
fn check_consistent(t: &LoadTracker, active: &BTreeSet<usize>, predicted: bool) {
    let mut expect = vec![WorkerAgg::default(); usize::from(WORKERS)];
    let mut oldest: Vec<Option<(u64, u64)>> = vec![None; usize::from(WORKERS)];
    for &i in active {
        let info = t.get(IDS[i]).expect("active id is known");
        let d = &mut expect[usize::from(info.decode_worker)];
        d.active_requests += 1;
        d.blocks_total += u64::from(info.prompt_blocks);
        d.output_blocks_milli += info.output_blocks_milli;
        if info.phase == Phase::Prefill {
            let pw = usize::from(info.prefill_worker.unwrap_or(info.decode_worker));
            expect[pw].prefill_requests += 1;
            expect[pw].prefill_tokens += u64::from(info.effective_isl);
            let key = (info.routed_at_us, u64::from(info.effective_isl));
            if oldest[pw].is_none_or(|o| key.0 < o.0) {
                oldest[pw] = Some(key);
            }
        }
    }
    for w in 0..WORKERS {
        let got = t.agg(w);
        let e = expect[usize::from(w)];
        assert_eq!(
            WorkerAgg {
                oldest_prefill: None,
                ..got
            },
            e,
            "worker {w}"
        );
        if predicted {
            assert_eq!(
                got.oldest_prefill.map(|o| o.started_us),
                oldest[usize::from(w)].map(|o| o.0),
                "oldest of worker {w}"
            );
            assert!(got.oldest_prefill.is_none_or(|o| o.predicted_us >= 1));
        } else {
            assert_eq!(got.oldest_prefill, None);
        }
        let l = t.load(w, 1_000);
        assert!(l.prefill_tokens >= 0.0 && l.prefill_tokens <= got.prefill_tokens as f64);
    }
    assert_eq!(t.active_requests(), active.len());
}

fn run(ops: Vec<Op>, model: PrefillLoadModel, track_output_blocks: bool) {
    let cfg = RouterConfig {
        block_size: BS,
        prefill_load_model: model,
        track_output_blocks,
        predictor_min_samples: 3,
        ..Default::default()
    };
    let predicted = model == PrefillLoadModel::Predicted;
    let mut t = LoadTracker::new(BS, &cfg);
    let mut shard = ActiveBlocksShard::new();
    let mut active = BTreeSet::new();
    let undo =
        |shard: &mut ActiveBlocksShard, f: &Finished| shard.remove(f.decode_worker, &f.hashes);
    for op in ops {
        match op {
            Op::Route {
                id,
                d,
                p,
                isl,
                cached,
                osl,
                now,
            } => {
                let hashes = hashes_of(id, isl);
                let r = NewRequest {
                    id: IDS[id].to_string(),
                    decode_worker: d,
                    prefill_worker: p,
                    input_tokens: isl,
                    cached_tokens: cached,
                    prompt_blocks: isl.div_ceil(BS),
                    hashes: hashes.clone(),
                    expected_output_tokens: osl,
                    now_us: now,
                    pinned: false,
                };
                let res = t.on_route(r);
                if active.insert(id) {
                    assert_eq!(res, Ok(()));
                    shard.add(d, &hashes);
                } else {
                    assert_eq!(res, Err(LifecycleError::Duplicate));
                }
            }
            Op::FirstToken(i, now) => {
                let res = t.on_first_token(IDS[i], now);
                assert_eq!(res.is_ok(), active.contains(&i));
            }
            Op::Progress(i, out, now) => {
                let res = t.on_progress(IDS[i], out, now);
                assert_eq!(res.is_ok(), active.contains(&i));
            }
            Op::Finish(i) | Op::PrefillFailed(i) => {
                let res = if matches!(op, Op::Finish(_)) {
                    t.on_finish(IDS[i], 0)
                } else {
                    t.on_prefill_failed(IDS[i], 0)
                };
                match res {
                    Ok(f) => {
                        assert!(active.remove(&i));
                        assert_eq!(f.id, IDS[i]);
                        undo(&mut shard, &f);
                    }
                    Err(e) => {
                        assert_eq!(e, LifecycleError::UnknownRequest);
                        assert!(!active.contains(&i));
                    }
                }
            }
            Op::RemoveWorker(w) => {
                for f in t.remove_worker(w) {
                    assert_eq!(f.decode_worker, w);
                    let i = IDS.iter().position(|&s| s == f.id).expect("known id");
                    assert!(active.remove(&i));
                    undo(&mut shard, &f);
                }
                assert!(t.agg(w).is_zero());
                assert_eq!(shard.unique_blocks(w), 0);
            }
            Op::Expire(now, ttl) => {
                for f in t.expire(now, ttl) {
                    assert_eq!(f.reason, FinishReason::Expired);
                    let i = IDS.iter().position(|&s| s == f.id).expect("known id");
                    assert!(active.remove(&i), "expired once");
                    undo(&mut shard, &f);
                }
            }
        }
        check_consistent(&t, &active, predicted);
    }
    for i in std::mem::take(&mut active) {
        let f = t.on_finish(IDS[i], 0).expect("active request finishes");
        undo(&mut shard, &f);
    }
    check_consistent(&t, &active, predicted);
    for w in 0..WORKERS {
        assert!(t.agg(w).is_zero(), "worker {w}: {:?}", t.agg(w));
        assert_eq!(shard.unique_blocks(w), 0);
    }
    assert!(shard.is_empty());
    let mut dirty = Vec::new();
    t.take_dirty(&mut dirty);
    let unique: BTreeSet<_> = dirty.iter().collect();
    assert_eq!(unique.len(), dirty.len(), "each dirty worker reported once");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_interleavings_full(ops in proptest::collection::vec(op(), 0..60)) {
        run(ops, PrefillLoadModel::Full, false);
    }

    #[test]
    fn random_interleavings_predicted_with_output_blocks(
        ops in proptest::collection::vec(op(), 0..60)
    ) {
        run(ops, PrefillLoadModel::Predicted, true);
    }
}
