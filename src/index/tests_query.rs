//! Property test of the query loops on requests longer than their prefetch ring.
//!
//! `tests_prop` drives the whole index with requests of at most 16 blocks, inside one
//! [`QUERY_AHEAD`](super::shard) ring: the steady part of the pipeline (a key
//! prefetched while an earlier one is probed) and its tail are never both reached
//! there. Here requests are up to 150 blocks, stores lay down runs of different holder
//! sets (one holder, several, spilled lists, stale entries after clears), and some
//! requests carry an unknown block at a random position. Every answer is compared with
//! the per-position reference: for each position in order its live holders (best tier
//! per worker), up to the first position nobody holds. Checked: [`IndexShard::query_seq`]
//! (one shard), [`IndexShard::query`] (the service's per-core call, each shard on its
//! own positions) and the one pass of [`ShardedIndex::query`] over 2, 4 and 8 shards
//! (which stops every shard at the first position nobody holds in any shard).

use super::*;
use crate::types::{Tier, WorkerSlot};
use proptest::prelude::*;
use std::collections::HashSet;

/// Hashes are `0..UNIVERSE`; requests are runs of it, so long prefixes are common.
const UNIVERSE: u64 = 200;
const WORKERS: [WorkerSlot; 5] = [0, 1, 2, 3, 300];

#[derive(Clone, Debug)]
enum Op {
    Store(usize, Tier, u64, u64),
    Remove(usize, Tier, u64, u64),
    ClearTier(usize, Tier),
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Device), Just(Tier::Host), Just(Tier::Disk)]
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS.len();
    prop_oneof![
        6 => (w.clone(), tier(), 0..UNIVERSE, 1..160u64).prop_map(|(w, t, s, l)| Op::Store(w, t, s, l)),
        2 => (w.clone(), tier(), 0..UNIVERSE, 1..40u64).prop_map(|(w, t, s, l)| Op::Remove(w, t, s, l)),
        1 => (w, tier()).prop_map(|(w, t)| Op::ClearTier(w, t)),
    ]
}

/// A request: `len` hashes from `start`, optionally one replaced by an unknown hash.
fn request() -> impl Strategy<Value = Vec<u64>> {
    (0..40u64, 0..150u64, prop::option::of(0..150usize)).prop_map(|(s, l, hole)| {
        let mut q: Vec<u64> = (s..s + l).collect();
        if let Some(x) = hole.and_then(|i| q.get_mut(i)) {
            *x = UNIVERSE + 1_000;
        }
        q
    })
}

/// Live (worker, tier, hash) entries.
#[derive(Default)]
struct Model(HashSet<(WorkerSlot, Tier, u64)>);

impl Model {
    /// Live holders of `h`, best tier per worker, sorted by worker.
    fn holders(&self, h: u64) -> Vec<Holder> {
        let mut out = Vec::new();
        for &worker in WORKERS.iter().collect::<std::collections::BTreeSet<_>>() {
            if let Some(&tier) = Tier::ALL
                .iter()
                .find(|&&t| self.0.contains(&(worker, t, h)))
            {
                out.push(Holder { worker, tier });
            }
        }
        out
    }

    /// The answer of the positions `owns` selects, in order, up to the first of them
    /// nobody holds (`global`: up to the first position of the whole request nobody
    /// holds, which ends the one pass of every shard).
    fn answer(&self, q: &[u64], owns: impl Fn(u64) -> bool, global: bool) -> ShardAnswer {
        let mut ms = Vec::new();
        let mut first_miss = u32::MAX;
        for (i, &h) in q.iter().enumerate() {
            let hs = self.holders(h);
            if !owns(h) {
                if global && hs.is_empty() {
                    break;
                }
                continue;
            }
            if hs.is_empty() {
                first_miss = i as u32;
                break;
            }
            ms.extend(hs.iter().map(|x| Match {
                pos: i as u32,
                worker: x.worker,
                tier: x.tier,
            }));
        }
        ShardAnswer::from_matches(first_miss, &ms)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn long_requests_answer_like_the_per_position_reference(
        ops in prop::collection::vec(op(), 1..30),
        queries in prop::collection::vec(request(), 1..6),
    ) {
        let mut idx: Vec<ShardedIndex> = (0..4).map(ShardedIndex::new).collect();
        let mut model = Model::default();
        for op in &ops {
            match *op {
                Op::Store(w, t, s, l) => {
                    let hs: Vec<u64> = (s..(s + l).min(UNIVERSE)).collect();
                    for x in &mut idx {
                        x.stored(WORKERS[w], t, &hs);
                    }
                    model.0.extend(hs.iter().map(|&h| (WORKERS[w], t, h)));
                }
                Op::Remove(w, t, s, l) => {
                    let hs: Vec<u64> = (s..(s + l).min(UNIVERSE)).collect();
                    for x in &mut idx {
                        x.removed(WORKERS[w], t, &hs);
                    }
                    for h in hs {
                        model.0.remove(&(WORKERS[w], t, h));
                    }
                }
                Op::ClearTier(w, t) => {
                    for x in &mut idx {
                        x.clear_tier(WORKERS[w], t);
                    }
                    model.0.retain(|&(mw, mt, _)| (mw, mt) != (WORKERS[w], t));
                }
            }
        }
        let mut out = MergeResult::new();
        for q in &queries {
            for (bits, x) in idx.iter().enumerate() {
                let bits = bits as u32;
                let owns = |s: usize| move |h: u64| shard_of(h, bits) == s;
                // The service's call: each shard on its own (position, hash) list.
                for (s, shard) in x.shards.iter().enumerate() {
                    let items: Vec<(u32, u64)> = q
                        .iter()
                        .enumerate()
                        .filter(|&(_, &h)| owns(s)(h))
                        .map(|(i, &h)| (i as u32, h))
                        .collect();
                    let mut a = ShardAnswer::default();
                    shard.query(&items, &mut a);
                    prop_assert_eq!(&a, &model.answer(q, owns(s), false), "query, {} bits, shard {}", bits, s);
                }
                // The index's own pass (query_seq for one shard).
                x.query(q, |_| false, &mut out);
                for (s, a) in out.scratch.answers.iter().enumerate() {
                    prop_assert_eq!(a, &model.answer(q, owns(s), true), "one pass, {} bits, shard {}", bits, s);
                }
            }
            let mut seq = ShardAnswer::default();
            idx[0].shards[0].query_seq(q, &mut seq);
            prop_assert_eq!(&seq, &model.answer(q, |_| true, true), "query_seq");
        }
    }
}
