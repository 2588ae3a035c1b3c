//! Property test: [`ShardedIndex`] against a naive reference model.
//!
//! The model is `HashMap<(worker, tier), HashSet<hash>>` with per-shard cap counting and
//! a straightforward prefix walk implementing the merge semantics of DESIGN §1. Random
//! operation sequences run over 1, 2, 4 or 8 shards, six workers (one shared, one with a
//! high slot), 40 small-integer hashes (so the same blocks are stored, removed and
//! cleared over and over), tiny generation periods and compaction floors (so wraps and
//! compactions happen constantly), and small caps.

use super::*;
use crate::types::{Overlap, Tier, WorkerSlot};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

const WORKERS: [WorkerSlot; 6] = [0, 1, 2, 7, 300, 5];
const SHARED: WorkerSlot = 5;
const UNIVERSE: u64 = 40;

#[derive(Clone, Debug)]
enum Op {
    Store(usize, Tier, Vec<u64>),
    Remove(usize, Tier, Vec<u64>),
    ClearTier(usize, Tier),
    ClearWorker(usize),
    SetCap(usize, u64),
    Query(Vec<u64>),
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Device), Just(Tier::Host), Just(Tier::Disk)]
}

/// Mostly contiguous runs of the universe (prefix-like), sometimes scattered picks.
fn hashes() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        3 => (0..UNIVERSE, 1..12u64)
            .prop_map(|(s, l)| (s..(s + l).min(UNIVERSE)).collect()),
        1 => prop::collection::vec(0..UNIVERSE, 0..8),
    ]
}

fn query() -> impl Strategy<Value = Vec<u64>> {
    (
        0..4u64,
        0..16u64,
        prop::option::of((0..16usize, 0..UNIVERSE)),
    )
        .prop_map(|(s, l, sub)| {
            let mut q: Vec<u64> = (s..(s + l).min(UNIVERSE)).collect();
            if let Some((i, h)) = sub {
                if let Some(x) = q.get_mut(i) {
                    *x = h;
                }
            }
            q
        })
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS.len();
    prop_oneof![
        6 => (w.clone(), tier(), hashes()).prop_map(|(w, t, h)| Op::Store(w, t, h)),
        2 => (w.clone(), tier(), hashes()).prop_map(|(w, t, h)| Op::Remove(w, t, h)),
        1 => (w.clone(), tier()).prop_map(|(w, t)| Op::ClearTier(w, t)),
        1 => w.clone().prop_map(Op::ClearWorker),
        1 => (w, 0..30u64).prop_map(|(w, c)| Op::SetCap(w, c)),
        4 => query().prop_map(Op::Query),
    ]
}

#[derive(Default)]
struct Model {
    sets: HashMap<(WorkerSlot, Tier), HashSet<u64>>,
    /// Cap of each worker over all shards.
    caps: HashMap<WorkerSlot, u64>,
}

impl Model {
    fn has(&self, w: WorkerSlot, t: Tier, h: u64) -> bool {
        self.sets.get(&(w, t)).is_some_and(|s| s.contains(&h))
    }

    fn blocks(&self, w: WorkerSlot) -> u64 {
        Tier::ALL
            .iter()
            .map(|&t| self.sets.get(&(w, t)).map_or(0, |s| s.len() as u64))
            .sum()
    }

    /// The index applies a store shard by shard (hashes of shard 0 first), each hash
    /// in turn; the cap counts the worker's entries over all shards.
    fn store(&mut self, w: WorkerSlot, t: Tier, hs: &[u64], bits: u32) -> StoreOutcome {
        let mut out = StoreOutcome::default();
        let cap = *self.caps.get(&w).unwrap_or(&DEFAULT_WORKER_CAP);
        for shard in 0..1usize << bits {
            for &h in hs.iter().filter(|&&h| shard_of(h, bits) == shard) {
                if self.has(w, t, h) {
                    out.duplicate += 1;
                } else if self.blocks(w) >= cap {
                    out.rejected += 1;
                } else {
                    self.sets.entry((w, t)).or_default().insert(h);
                    out.added += 1;
                }
            }
        }
        out
    }

    fn remove(&mut self, w: WorkerSlot, t: Tier, hs: &[u64]) -> u32 {
        let set = self.sets.entry((w, t)).or_default();
        hs.iter().filter(|h| set.remove(h)).count() as u32
    }

    /// The merge semantics, walked position by position.
    fn overlap(&self, w: WorkerSlot, q: &[u64]) -> Overlap {
        let mut ov = Overlap::default();
        let mut p = 0;
        let mut phase = 0;
        if w != SHARED {
            while p < q.len() {
                let Some(best) = Tier::ALL.iter().position(|&t| self.has(w, t, q[p])) else {
                    break;
                };
                phase = phase.max(best);
                *[&mut ov.device, &mut ov.host, &mut ov.disk][phase] += 1;
                p += 1;
            }
        }
        while p < q.len() && Tier::ALL.iter().any(|&t| self.has(SHARED, t, q[p])) {
            ov.shared += 1;
            p += 1;
        }
        ov
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn sharded_index_matches_reference_model(
        bits in 0..4u32,
        period in 2..6u32,
        floor in 0..8u64,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut idx = ShardedIndex::with_limits(bits, period, floor);
        let mut model = Model::default();
        let mut r = MergeResult::new();
        for op in &ops {
            match op {
                Op::Store(w, t, hs) => {
                    let w = WORKERS[*w];
                    let got = idx.stored(w, *t, hs);
                    prop_assert_eq!(got, model.store(w, *t, hs, bits), "{:?}", op);
                }
                Op::Remove(w, t, hs) => {
                    let w = WORKERS[*w];
                    prop_assert_eq!(idx.removed(w, *t, hs), model.remove(w, *t, hs));
                }
                Op::ClearTier(w, t) => {
                    let w = WORKERS[*w];
                    idx.clear_tier(w, *t);
                    model.sets.remove(&(w, *t));
                }
                Op::ClearWorker(w) => {
                    let w = WORKERS[*w];
                    idx.clear_worker(w);
                    for t in Tier::ALL {
                        model.sets.remove(&(w, t));
                    }
                }
                Op::SetCap(w, c) => {
                    let w = WORKERS[*w];
                    idx.set_worker_cap(w, *c);
                    model.caps.insert(w, *c);
                }
                Op::Query(q) => {
                    idx.query(q, |w| w == SHARED, &mut r);
                    let mut expect_workers = Vec::new();
                    for &w in &WORKERS {
                        let want = model.overlap(w, q);
                        prop_assert_eq!(r.get(w), want, "worker {} query {:?}", w, q);
                        if w != SHARED && want.own() > 0 {
                            expect_workers.push(w);
                        }
                    }
                    let mut got = r.workers().to_vec();
                    got.sort_unstable();
                    expect_workers.sort_unstable();
                    prop_assert_eq!(got, expect_workers);
                }
            }
            for &w in &WORKERS {
                prop_assert_eq!(idx.worker_blocks(w), model.blocks(w), "worker {}", w);
            }
            let live: u64 = WORKERS.iter().map(|&w| model.blocks(w)).sum();
            prop_assert_eq!(idx.stats().live_entries, live);
            for s in &idx.shards {
                let st = s.stats();
                prop_assert_eq!(s.physical_entries(), st.live_entries + st.stale_entries);
            }
        }
    }
}
