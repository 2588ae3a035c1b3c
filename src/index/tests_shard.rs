//! Unit tests of the mixer, the packed holder sets and [`IndexShard`].

use super::holders::{pack, slot_of, tier_of, Holders, Slab};
use super::*;
use crate::types::Tier::{Device, Disk, Host};

/// A shard's answer expanded to one match per (position, holder).
struct Expanded {
    matches: Vec<Match>,
    first_miss: u32,
}

fn q(s: &IndexShard, hashes: &[u64]) -> Expanded {
    let items: Vec<(u32, u64)> = hashes
        .iter()
        .enumerate()
        .map(|(i, &h)| (i as u32, h))
        .collect();
    let mut a = ShardAnswer::default();
    s.query(&items, &mut a);
    let mut seq = ShardAnswer::default();
    s.query_seq(hashes, &mut seq);
    assert_eq!(seq, a, "query_seq answers like query");
    Expanded {
        matches: a.matches().collect(),
        first_miss: a.first_miss,
    }
}

fn m(pos: u32, worker: u16, tier: Tier) -> Match {
    Match { pos, worker, tier }
}

/// Live + stale counters must match what is physically in the map.
fn check_counts(s: &IndexShard) {
    let st = s.stats();
    assert_eq!(s.physical_entries(), st.live_entries + st.stale_entries);
}

use crate::types::Tier;

#[test]
fn mix_is_injective_on_small_ints_and_spreads_over_shards() {
    let mut seen = std::collections::HashSet::new();
    let mut per_shard = [0u32; 4];
    for h in 0..100_000u64 {
        assert!(seen.insert(mix(h)));
        per_shard[shard_of(h, 2)] += 1;
    }
    for c in per_shard {
        assert!((23_000..27_000).contains(&c), "{per_shard:?}");
    }
    assert_eq!(shard_of(12345, 0), 0);
    assert!(shard_of(u64::MAX, 3) < 8);
    assert!(shard_of(7, 99) < 1 << MAX_SHARD_BITS);
}

#[test]
fn holders_inline_spill_and_back_keep_sorted_order() {
    let mut slab = Slab::default();
    let e = |w: u16, t: Tier| pack(w, t, 0);
    let mut hs = Holders::single(e(5, Device));
    hs.insert(&mut slab, e(2, Host));
    assert_eq!(hs.entries(&slab), &[e(2, Host), e(5, Device)]);
    assert!(hs.is_full_inline());
    hs.insert(&mut slab, e(3, Disk));
    hs.insert(&mut slab, e(2, Device));
    assert_eq!(slab.in_use(), 1);
    assert_eq!(
        hs.entries(&slab),
        &[e(2, Device), e(2, Host), e(3, Disk), e(5, Device)]
    );
    let i = hs.find(&slab, e(3, Disk) >> 14).unwrap();
    assert_eq!(i, 2);
    assert_eq!(hs.find(&slab, e(3, Host) >> 14), None);
    hs.remove(&mut slab, i);
    assert_eq!(slab.in_use(), 1);
    hs.remove(&mut slab, 0);
    assert_eq!(slab.in_use(), 0, "two entries go back inline");
    assert_eq!(hs.entries(&slab), &[e(2, Host), e(5, Device)]);
    hs.retain(&mut slab, |x| slot_of(x) == 5);
    assert_eq!(hs.entries(&slab), &[e(5, Device)]);
    assert_eq!(tier_of(hs.entries(&slab)[0]), Device);
    hs.remove(&mut slab, 0);
    assert!(hs.is_empty());
}

#[test]
fn store_query_and_first_miss() {
    let mut s = IndexShard::new();
    let out = s.stored(1, Device, &[10, 11, 12]);
    assert_eq!(
        out,
        StoreOutcome {
            added: 3,
            duplicate: 0,
            rejected: 0,
            over_budget: 0,
        }
    );
    s.stored(2, Host, &[10, 11]);
    let a = q(&s, &[10, 11, 12, 13, 10]);
    assert_eq!(
        a.matches,
        vec![
            m(0, 1, Device),
            m(0, 2, Host),
            m(1, 1, Device),
            m(1, 2, Host),
            m(2, 1, Device)
        ]
    );
    assert_eq!(a.first_miss, 3, "scan stops at the first unheld position");
    let a = q(&s, &[10, 11]);
    assert_eq!(a.first_miss, u32::MAX);
    assert_eq!(s.worker_blocks(1), 3);
    assert_eq!(s.worker_blocks(2), 2);
    assert_eq!(s.worker_blocks(9), 0);
    let st = s.stats();
    assert_eq!((st.blocks, st.live_entries, st.stale_entries), (3, 5, 0));
    assert!(st.heap_bytes > 0);
}

#[test]
fn duplicates_and_independent_tiers() {
    let mut s = IndexShard::new();
    s.stored(1, Device, &[7]);
    let out = s.stored(1, Device, &[7, 7]);
    assert_eq!((out.added, out.duplicate), (0, 2));
    let out = s.stored(1, Host, &[7]);
    assert_eq!((out.added, out.duplicate), (1, 0));
    assert_eq!(s.worker_blocks(1), 2);
    assert_eq!(s.worker_tier_blocks(1, Host), 1);
    // Query reports only the best tier of a worker.
    assert_eq!(q(&s, &[7]).matches, vec![m(0, 1, Device)]);
    assert_eq!(s.removed(1, Device, &[7]), 1);
    assert_eq!(q(&s, &[7]).matches, vec![m(0, 1, Host)]);
    assert_eq!(s.removed(1, Device, &[7]), 0, "removal is per tier");
    assert_eq!(s.removed(1, Host, &[7, 8]), 1);
    assert_eq!(s.removed(3, Host, &[7]), 0, "unknown worker is a no-op");
    assert_eq!(s.stats().blocks, 0);
    check_counts(&s);
}

#[test]
fn cap_rejects_and_counts() {
    let mut s = IndexShard::new();
    assert_eq!(s.worker_cap(4), DEFAULT_WORKER_CAP);
    s.set_worker_cap(4, 3);
    let out = s.stored(4, Device, &[1, 2, 3, 4, 5]);
    assert_eq!((out.added, out.rejected), (3, 2));
    // Duplicates at the cap are duplicates, and the cap spans tiers.
    let out = s.stored(4, Device, &[1]);
    assert_eq!((out.duplicate, out.rejected), (1, 0));
    let out = s.stored(4, Host, &[1]);
    assert_eq!(out.rejected, 1);
    assert_eq!(s.worker_blocks(4), 3);
    s.removed(4, Device, &[2]);
    assert_eq!(s.stored(4, Device, &[5]).added, 1);
    assert_eq!(s.stats().rejected_total, 3);
    // Another worker is not affected.
    assert_eq!(s.stored(5, Device, &[1, 2, 3, 4]).added, 4);
    // A stale entry met at the cap is dropped, not revived.
    s.set_worker_cap(5, 1);
    s.clear_worker(5);
    assert_eq!(s.stored(5, Device, &[9]).added, 1);
    let out = s.stored(5, Device, &[1]);
    assert_eq!(out.rejected, 1);
    assert!(q(&s, &[1]).matches.iter().all(|x| x.worker != 5));
    check_counts(&s);
}

#[test]
fn clear_tier_versus_clear_worker() {
    let mut s = IndexShard::new();
    s.stored(1, Device, &[1, 2]);
    s.stored(1, Host, &[2, 3]);
    s.stored(1, Disk, &[4]);
    s.stored(2, Device, &[1, 2, 3, 4]);
    s.clear_tier(1, Device);
    assert_eq!(s.worker_blocks(1), 3);
    assert_eq!(s.worker_tier_blocks(1, Device), 0);
    let a = q(&s, &[1, 2, 3, 4]);
    let w1: Vec<Match> = a
        .matches
        .iter()
        .copied()
        .filter(|x| x.worker == 1)
        .collect();
    assert_eq!(w1, vec![m(1, 1, Host), m(2, 1, Host), m(3, 1, Disk)]);
    s.clear_worker(1);
    assert_eq!(s.worker_blocks(1), 0);
    assert!(q(&s, &[1, 2, 3, 4]).matches.iter().all(|x| x.worker == 2));
    assert_eq!(s.worker_blocks(2), 4);
    let st = s.stats();
    assert_eq!((st.live_entries, st.stale_entries), (4, 5));
    check_counts(&s);
    // Clearing something empty changes nothing.
    s.clear_worker(1);
    s.clear_worker(77);
    assert_eq!(s.stats().stale_entries, 5);
}

#[test]
fn slot_reuse_after_clear_sees_only_new_blocks() {
    let mut s = IndexShard::new();
    s.stored(3, Device, &[1, 2, 3]);
    s.clear_worker(3);
    // The new owner of slot 3 stores a different, overlapping set.
    let out = s.stored(3, Device, &[2, 5]);
    assert_eq!((out.added, out.duplicate), (2, 0));
    assert_eq!(s.worker_blocks(3), 2);
    assert_eq!(q(&s, &[1]).matches, vec![]);
    assert_eq!(q(&s, &[2]).matches, vec![m(0, 3, Device)]);
    // Re-storing 2 replaced its stale entry in place.
    assert_eq!(s.stats().stale_entries, 2);
    // Removing a stale block is not counted but reclaims it.
    assert_eq!(s.removed(3, Device, &[1]), 0);
    assert_eq!(s.stats().stale_entries, 1);
    check_counts(&s);
}

#[test]
fn spilled_holders_report_best_tier_per_worker() {
    let mut s = IndexShard::new();
    for w in [9u16, 1, 4, 7, 2] {
        s.stored(w, Host, &[42]);
    }
    s.stored(4, Device, &[42]);
    assert_eq!(s.spilled_lists(), 1);
    let a = q(&s, &[42]);
    let got: Vec<(u16, Tier)> = a.matches.iter().map(|x| (x.worker, x.tier)).collect();
    assert_eq!(
        got,
        vec![(1, Host), (2, Host), (4, Device), (7, Host), (9, Host)]
    );
    s.clear_tier(4, Device);
    assert!(q(&s, &[42]).matches.contains(&m(0, 4, Host)));
    for w in [9u16, 1, 4] {
        s.removed(w, Host, &[42]);
    }
    s.compact_now();
    assert_eq!(s.spilled_lists(), 0);
    assert_eq!(q(&s, &[42]).matches, vec![m(0, 2, Host), m(0, 7, Host)]);
    check_counts(&s);
}

#[test]
fn stale_entries_are_purged_before_spilling() {
    let mut s = IndexShard::new();
    s.stored(1, Device, &[5]);
    s.stored(2, Device, &[5]);
    s.clear_worker(1);
    s.stored(3, Device, &[5]);
    assert_eq!(s.spilled_lists(), 0);
    assert_eq!(s.stats().stale_entries, 0);
    check_counts(&s);
}

#[test]
fn query_reuses_its_buffers_and_encodes_runs() {
    let mut s = IndexShard::new();
    s.stored(1, Device, &[1, 2, 3, 4]);
    s.stored(2, Host, &[3]);
    let mut a = ShardAnswer::default();
    let items = [(0, 1), (3, 2), (5, 3), (6, 4)];
    s.query(&items, &mut a);
    let ptrs = (a.positions.as_ptr(), a.runs.as_ptr(), a.holders.as_ptr());
    a.clear();
    s.query(&items, &mut a);
    assert_eq!(
        (a.positions.as_ptr(), a.runs.as_ptr(), a.holders.as_ptr()),
        ptrs
    );
    assert_eq!(a.positions, vec![0, 3, 5, 6]);
    // Worker 1 alone, then with worker 2 (position 5), then alone again: three runs.
    let runs: Vec<(Vec<u32>, Vec<Holder>)> = a
        .iter_runs()
        .map(|(p, h)| (p.to_vec(), h.to_vec()))
        .collect();
    let h = |worker, tier| Holder { worker, tier };
    assert_eq!(
        runs,
        vec![
            (vec![0, 3], vec![h(1, Device)]),
            (vec![5], vec![h(1, Device), h(2, Host)]),
            (vec![6], vec![h(1, Device)]),
        ]
    );
    assert_eq!(a.first_miss, u32::MAX);
    assert_eq!(
        a,
        ShardAnswer::from_matches(u32::MAX, &a.matches().collect::<Vec<_>>())
    );
}

/// Generations wrap after `period` clears; an entry left stale from the previous cycle
/// (same generation number) must not come back.
#[test]
fn generation_wrap_never_revives_stale_entries() {
    for period in [2u32, 3, 5] {
        let mut s = IndexShard::with_limits(period, u64::MAX / 4);
        s.stored(1, Device, &[100]); // gen 0, then left stale
        s.stored(2, Device, &[100]);
        s.clear_tier(1, Device);
        for cycle in 0..(3 * period + 1) {
            s.stored(1, Device, &[cycle as u64 + 1000]);
            s.clear_tier(1, Device);
            let a = q(&s, &[100]);
            assert_eq!(a.matches, vec![m(0, 2, Device)], "period {period}");
            assert_eq!(s.worker_blocks(1), 0);
            check_counts(&s);
        }
        assert!(s.stats().compactions >= 3);
        // After the wraps the worker stores normally.
        assert_eq!(s.stored(1, Device, &[100]).added, 1);
        assert_eq!(q(&s, &[100]).matches.len(), 2);
    }
}

/// The same with the real 14-bit period: 20k clears on a tiny shard.
#[test]
fn generation_wrap_at_full_period() {
    let mut s = IndexShard::new();
    s.stored(1, Host, &[7, 8]);
    s.clear_worker(1);
    for i in 0..20_000u64 {
        s.stored(1, Host, &[8, 1_000 + i % 3]);
        s.clear_worker(1);
    }
    assert_eq!(q(&s, &[7]).first_miss, 0);
    assert_eq!(q(&s, &[8]).first_miss, 0);
    assert!(s.stats().compactions >= 1);
    assert!(s.physical_entries() <= 8);
    check_counts(&s);
}

/// Right after a store, entries stay within `2 * live + floor + batch`; clears never add
/// entries; the heap stops growing once the working set is reached.
#[test]
fn stale_compaction_bounds_memory() {
    let floor = 64;
    let mut s = IndexShard::with_limits(GEN_PERIOD_FOR_TESTS, floor);
    let mut next = 0u64;
    let mut heap_after_warmup = 0;
    let mut peak_live = 0;
    for round in 0..200u64 {
        let w = (round % 3) as u16;
        let batch: Vec<u64> = (next..next + 100).collect();
        next += 100;
        s.stored(w, Tier::ALL[(round % 3) as usize], &batch);
        s.stored(5, Device, &[round % 50]); // a long-lived worker
        let live = s.stats().live_entries;
        peak_live = peak_live.max(live);
        assert!(s.physical_entries() <= 2 * live + floor + 100 + 1);
        if round % 2 == 0 {
            s.clear_worker(w);
        } else {
            s.clear_tier(w, Tier::ALL[(round % 3) as usize]);
        }
        let st = s.stats();
        assert!(s.physical_entries() <= 2 * peak_live + floor + 100 + 1);
        check_counts(&s);
        if round == 20 {
            heap_after_warmup = st.heap_bytes;
        }
        if round > 20 {
            assert!(st.heap_bytes <= 2 * heap_after_warmup, "round {round}");
        }
    }
    assert!(s.stats().compactions > 10);
    assert_eq!(s.worker_blocks(5), 50);
}

const GEN_PERIOD_FOR_TESTS: u32 = 1 << 14;

#[test]
fn a_shared_budget_makes_caps_exact_over_shards_and_bounds_the_index() {
    use crate::index::Budget;
    use std::sync::Arc;
    let b = Arc::new(Budget::new(4, 25));
    let (mut s0, mut s1) = (IndexShard::new(), IndexShard::new());
    s0.stored(3, Device, &[1, 2]); // before attaching: counted, whatever the limits
    s0.attach_budget(b.clone());
    s1.attach_budget(b.clone());
    for s in [&mut s0, &mut s1] {
        s.set_worker_cap(1, 10);
        s.set_worker_cap(2, 100);
    }
    assert_eq!(b.total(), 2);
    let a = s0.stored(1, Device, &(100..108).collect::<Vec<_>>());
    let c = s1.stored(1, Device, &(200..208).collect::<Vec<_>>());
    assert_eq!((a.added, c.added, c.rejected, c.over_budget), (8, 2, 6, 0));
    // Duplicates and the other tier: duplicates cost nothing, a new tier entry counts.
    assert_eq!(s0.stored(1, Device, &[100, 101]).duplicate, 2);
    assert_eq!(s0.stored(1, Host, &[100]).rejected, 1);
    assert_eq!(b.held(1), 10);
    // The global limit (25) cuts worker 2 below its own cap.
    let d = s1.stored(2, Device, &(300..320).collect::<Vec<_>>());
    assert_eq!((d.added, d.rejected, d.over_budget), (13, 7, 7));
    assert_eq!(b.total(), 25);
    // Removals and clears give entries back.
    assert_eq!(s0.removed(1, Device, &[100, 101]), 2);
    s1.clear_worker(2);
    assert_eq!((b.held(1), b.held(2), b.total()), (8, 0, 10));
    assert_eq!(s1.stored(1, Device, &[400, 401, 402]).added, 2);
}
