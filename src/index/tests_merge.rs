//! Unit tests of [`merge`] and of [`ShardedIndex`] end to end.

use super::*;
use crate::types::Overlap;
use crate::types::Tier::{self, Device, Disk, Host};

fn ans(first_miss: u32, ms: &[(u32, u16, Tier)]) -> ShardAnswer {
    let ms: Vec<Match> = ms
        .iter()
        .map(|&(pos, worker, tier)| Match { pos, worker, tier })
        .collect();
    ShardAnswer::from_matches(first_miss, &ms)
}

fn ov(device: u32, host: u32, disk: u32, shared: u32) -> Overlap {
    Overlap {
        device,
        host,
        disk,
        shared,
    }
}

const NONE: u32 = u32::MAX;

#[test]
fn phases_follow_worst_tier_so_far() {
    // Worker 1: D D H D Di H | (gap at 6) D
    let a = ans(
        NONE,
        &[
            (0, 1, Device),
            (1, 1, Device),
            (2, 1, Host),
            (3, 1, Device),
            (4, 1, Disk),
            (5, 1, Host),
            (7, 1, Device),
            (7, 2, Device),
        ],
    );
    let mut r = MergeResult::new();
    merge(8, &[a], |_| false, &mut r);
    assert_eq!(r.get(1), ov(2, 2, 2, 0));
    assert_eq!(r.workers(), &[1]);
    assert_eq!(r.get(2), Overlap::default(), "no run from position 0");
    assert_eq!(r.end(), 6, "position 6 is answered by nobody");
}

#[test]
fn duplicate_matches_keep_the_best_tier() {
    let a = ans(
        NONE,
        &[(0, 3, Host), (0, 3, Device), (1, 3, Disk), (1, 3, Host)],
    );
    let mut r = MergeResult::new();
    merge(2, &[a], |_| false, &mut r);
    assert_eq!(r.get(3), ov(1, 1, 0, 0));
}

#[test]
fn positions_split_over_answers_and_combined() {
    // Interleaved positions; worker 1's run in `a` is one run over positions 0, 1, 3.
    let a = ans(
        NONE,
        &[(0, 1, Device), (1, 1, Device), (3, 1, Host), (4, 1, Host)],
    );
    let b = ans(NONE, &[(2, 1, Device), (2, 2, Device), (5, 1, Disk)]);
    assert_eq!(a.runs.len(), 2);
    let mut r = MergeResult::new();
    merge(6, &[b.clone(), a.clone()], |_| false, &mut r);
    assert_eq!(r.get(1), ov(3, 2, 1, 0));
    assert_eq!(r.workers(), &[1]);
    assert_eq!(r.get(2), Overlap::default());
    // Worker 1 stops in `b` at 5, the first of b's positions it does not hold.
    let b = ans(NONE, &[(2, 1, Device), (5, 2, Disk)]);
    merge(6, &[a, b], |_| false, &mut r);
    assert_eq!(r.get(1), ov(3, 2, 0, 0));
}

#[test]
fn a_position_no_answer_covers_ends_every_run() {
    // Position 2 is in no answer (a shard that did not reply): nobody holds it.
    let a = ans(NONE, &[(0, 1, Device), (1, 1, Device), (3, 1, Device)]);
    let b = ans(NONE, &[(4, 1, Device)]);
    let mut r = MergeResult::new();
    merge(5, &[a, b], |_| false, &mut r);
    assert_eq!(r.end(), 2);
    assert_eq!(r.get(1), ov(2, 0, 0, 0));
    // Without position 0 nobody has an own overlap.
    let c = ans(NONE, &[(1, 1, Device)]);
    merge(2, &[c], |_| false, &mut r);
    assert_eq!(r.end(), 0);
    assert!(r.workers().is_empty());
}

#[test]
fn shared_run_follows_own_run_and_shared_workers_are_hidden() {
    let shared = |w: u16| w == 9;
    let a = ans(
        NONE,
        &[
            (0, 1, Device),
            (0, 9, Disk),
            (1, 1, Host),
            (1, 9, Device),
            (2, 9, Host),
            (3, 9, Device),
            (4, 2, Device), // worker 2 has no run from 0
            (5, 9, Device),
        ],
    );
    let mut r = MergeResult::new();
    merge(6, &[a], shared, &mut r);
    assert_eq!(r.get(1), ov(1, 1, 0, 2), "shared run stops at position 4");
    assert_eq!(r.workers(), &[1]);
    assert_eq!(r.shared_from_start(), 4);
    assert_eq!(r.get(2), ov(0, 0, 0, 4));
    assert_eq!(r.get(9), ov(0, 0, 0, 4));
    assert_eq!(r.get(500), ov(0, 0, 0, 4));
}

#[test]
fn first_miss_and_n_bound_every_run() {
    let a = ans(2, &[(0, 1, Device), (1, 1, Device)]);
    let b = ans(NONE, &[(2, 1, Device), (3, 1, Device), (4, 5, Device)]);
    let mut r = MergeResult::new();
    merge(10, &[a.clone(), b.clone()], |w| w == 5, &mut r);
    assert_eq!(r.get(1), ov(2, 0, 0, 0));
    assert_eq!(r.end(), 2);
    let a = ans(
        NONE,
        &a.matches()
            .map(|m| (m.pos, m.worker, m.tier))
            .collect::<Vec<_>>(),
    );
    merge(3, &[a, b], |w| w == 5, &mut r);
    assert_eq!(r.get(1), ov(3, 0, 0, 0));
    assert_eq!(r.end(), 3);
}

#[test]
fn reuse_after_clear_matches_a_fresh_result() {
    let first = ans(NONE, &[(0, 7, Device), (0, 8, Host), (1, 7, Device)]);
    let second = ans(NONE, &[(0, 8, Disk), (1, 8, Device)]);
    let mut reused = MergeResult::new();
    merge(2, &[first], |_| false, &mut reused);
    assert_eq!(reused.workers(), &[7, 8]);
    merge(2, std::slice::from_ref(&second), |_| false, &mut reused);
    let mut fresh = MergeResult::new();
    merge(2, &[second], |_| false, &mut fresh);
    for w in 0..10 {
        assert_eq!(reused.get(w), fresh.get(w));
    }
    assert_eq!(reused.workers(), &[8]);
    assert_eq!(reused.get(8), ov(0, 0, 2, 0));
    reused.clear();
    assert_eq!(reused.get(8), Overlap::default());
    assert!(reused.workers().is_empty());
}

#[test]
fn empty_inputs() {
    let mut r = MergeResult::new();
    merge(0, &[], |_| false, &mut r);
    assert!(r.workers().is_empty());
    merge(usize::MAX, &[ShardAnswer::default()], |_| false, &mut r);
    assert_eq!(r.end(), 0);
}

/// DESIGN §1 worked example overlaps, through a 2-shard index.
#[test]
fn sharded_index_end_to_end() {
    let mut idx = ShardedIndex::with_shards(2).unwrap();
    assert!(ShardedIndex::with_shards(3).is_none());
    let req: Vec<u64> = (100..110).collect();
    idx.stored(1, Device, &req[..2]);
    idx.stored(2, Device, &req[..5]);
    idx.stored(3, Device, &req[..6]);
    idx.stored(3, Host, &req[6..8]);
    idx.stored(4, Device, &req); // shared store
    let mut r = MergeResult::new();
    idx.query(&req, |w| w == 4, &mut r);
    assert_eq!(r.get(1), ov(2, 0, 0, 8));
    assert_eq!(r.get(2), ov(5, 0, 0, 5));
    assert_eq!(r.get(3), ov(6, 2, 0, 2));
    assert_eq!(r.get(0), ov(0, 0, 0, 10));
    let mut ws = r.workers().to_vec();
    ws.sort();
    assert_eq!(ws, vec![1, 2, 3]);
    assert_eq!(idx.worker_blocks(3), 8);
    assert_eq!(idx.removed(3, Host, &req), 2);
    idx.clear_worker(4);
    idx.query(&req, |w| w == 4, &mut r);
    assert_eq!(r.get(3), ov(6, 0, 0, 0));
    assert_eq!(r.end(), 6);
    assert_eq!(idx.stats().live_entries, 13);
}

#[test]
fn worker_caps_are_exact_over_shards() {
    let mut idx = ShardedIndex::new(2);
    assert_eq!(idx.shard_count(), 4);
    idx.set_worker_cap(1, 400);
    let hashes: Vec<u64> = (0..1000).collect();
    let out = idx.stored(1, Device, &hashes);
    assert_eq!((out.added, out.rejected), (400, 600));
    assert_eq!(idx.worker_blocks(1), 400);
    let freed = idx.removed(1, Device, &hashes[..500]);
    assert_eq!(idx.worker_blocks(1), 400 - u64::from(freed));
    let more: Vec<u64> = (5000..6000).collect();
    assert_eq!(idx.stored(1, Host, &more).added, freed);
    assert_eq!(idx.worker_blocks(1), 400);
}

#[test]
fn query_reuses_buffers() {
    let mut idx = ShardedIndex::new(3);
    let req: Vec<u64> = (0..64).collect();
    idx.stored(1, Device, &req);
    let mut r = MergeResult::new();
    idx.query(&req, |_| false, &mut r);
    let caps: Vec<usize> = r
        .scratch
        .answers
        .iter()
        .map(|a| a.positions.capacity())
        .collect();
    idx.query(&req, |_| false, &mut r);
    let again: Vec<usize> = r
        .scratch
        .answers
        .iter()
        .map(|a| a.positions.capacity())
        .collect();
    assert_eq!(caps, again);
    assert_eq!(r.get(1), ov(64, 0, 0, 0));
}

#[test]
fn far_positions_bound_nothing_by_their_value() {
    // One answered position near u32::MAX: nothing covers 0, so the merge ends at 0,
    // and its scratch is sized by the one answered position, not by its value.
    let a = ans(NONE, &[(u32::MAX - 2, 1, Device)]);
    let mut r = MergeResult::new();
    merge(usize::MAX, &[a], |_| false, &mut r);
    assert_eq!(r.end(), 0);
    assert!(r.workers().is_empty());
    assert!(r.seen.capacity() < 1024);
}
