//! Unit tests of the approximate-mode model: idle TTL, LRU eviction at the cap, the
//! shared budget, clears, bounded queues, and a property test against a plain LRU.

use super::*;
use proptest::prelude::*;

fn budget() -> Arc<Budget> {
    Arc::new(Budget::new(16, u64::MAX))
}

fn hits(a: &ApproxShard, hashes: &[u64], now: u64) -> Vec<(u32, WorkerSlot)> {
    let items: Vec<(u32, u64)> = hashes
        .iter()
        .enumerate()
        .map(|(i, &h)| (i as u32, h))
        .collect();
    let mut out = Vec::new();
    a.query(&items, now, &mut out);
    out.sort_unstable();
    out
}

#[test]
fn touched_blocks_stay_after_the_request_until_the_idle_ttl() {
    let b = budget();
    let mut a = ApproxShard::new(1_000, b.clone(), 1);
    a.touch(1, &[10, 11, 12], 5_000);
    assert_eq!(hits(&a, &[10, 11, 12], 5_999), vec![(0, 1), (1, 1), (2, 1)]);
    // Exactly at the TTL it is gone, even before a sweep reclaims it.
    assert!(hits(&a, &[10, 11, 12], 6_000).is_empty());
    assert_eq!((a.len(), b.held(1)), (3, 3));
    a.expire(6_000);
    assert_eq!((a.len(), b.held(1), a.stats().expired), (0, 0, 3));
}

#[test]
fn a_touch_refreshes_without_counting_twice() {
    let mut a = ApproxShard::new(1_000, budget(), 1);
    a.touch(1, &[10, 11], 0);
    a.touch(1, &[10, 10, 12], 800);
    assert_eq!((a.len(), a.worker_entries(1)), (3, 3));
    assert_eq!(a.stats().refreshed, 1);
    // 11 was last touched at 0, 10 and 12 at 800.
    assert_eq!(hits(&a, &[10, 11, 12], 1_500), vec![(0, 1), (2, 1)]);
    a.expire(1_500);
    assert_eq!(a.worker_entries(1), 2);
    // Two workers may model the same block.
    a.touch(2, &[10], 1_600);
    assert_eq!(hits(&a, &[10], 1_700), vec![(0, 1), (0, 2)]);
}

#[test]
fn at_the_cap_the_least_recently_touched_block_goes_deepest_first() {
    let b = budget();
    let mut a = ApproxShard::new(u64::MAX, b.clone(), 1);
    a.set_worker_cap(3, 3);
    a.touch(3, &[1, 2, 3], 0); // eviction order 3, 2, 1: a prompt's tail goes first
    a.touch(3, &[4], 1);
    assert_eq!(hits(&a, &[1, 2, 3, 4], 2), vec![(0, 3), (1, 3), (3, 3)]);
    a.touch(3, &[1], 2); // 2 is now the least recently touched
    a.touch(3, &[5, 6], 3); // evicts 2, then 4
    assert_eq!(hits(&a, &[1, 2, 4, 5, 6], 4), vec![(0, 3), (3, 3), (4, 3)]);
    assert_eq!(
        (a.worker_entries(3), b.held(3), a.stats().evicted),
        (3, 3, 3)
    );
}

#[test]
fn blocks_of_one_touch_never_evict_each_other() {
    let b = budget();
    let mut a = ApproxShard::new(u64::MAX, b.clone(), 1);
    a.set_worker_cap(0, 2);
    a.touch(0, &[1, 2, 3, 4], 0);
    assert_eq!(hits(&a, &[1, 2, 3, 4], 1), vec![(0, 0), (1, 0)]);
    assert_eq!((a.stats().refused, b.held(0)), (2, 2));
    // The next prompt evicts the older ones.
    a.touch(0, &[7, 8, 9], 1);
    assert_eq!(hits(&a, &[1, 2, 7, 8, 9], 2), vec![(2, 0), (3, 0)]);
}

#[test]
fn shards_split_the_cap_and_the_global_limit_holds() {
    let b = Arc::new(Budget::new(4, 7));
    let mut s0 = ApproxShard::new(u64::MAX, b.clone(), 2);
    let mut s1 = ApproxShard::new(u64::MAX, b.clone(), 2);
    for s in [&mut s0, &mut s1] {
        s.set_worker_cap(0, 4);
        s.set_worker_cap(1, 100);
    }
    // Each shard keeps its share (2) of worker 0, its own LRU.
    s0.touch(0, &[1, 2], 0);
    s1.touch(0, &[3, 4, 5], 0); // one left out: a touch never evicts its own blocks
    s1.touch(0, &[6], 1); // evicts 4, the deepest of the older touch
    assert_eq!(
        (s0.worker_entries(0), s1.worker_entries(0), b.held(0)),
        (2, 2, 4)
    );
    assert_eq!(hits(&s1, &[3, 4, 6], 2), vec![(0, 0), (2, 0)]);
    // The global limit (7) leaves worker 1 three entries; then it evicts its own.
    s0.touch(1, &[10, 11, 12, 13], 2);
    assert_eq!((s0.worker_entries(1), b.total()), (3, 7));
    s0.touch(1, &[14], 3); // evicts 12
    assert_eq!(hits(&s0, &[10, 12, 14], 4), vec![(0, 1), (2, 1)]);
    s0.clear_worker(0);
    assert_eq!((b.held(0), b.total()), (2, 5));
}

#[test]
fn clearing_a_worker_drops_its_entries_and_gives_back_its_budget() {
    let b = budget();
    let mut a = ApproxShard::new(u64::MAX, b.clone(), 1);
    a.touch(1, &[1, 2, 3], 0);
    a.touch(2, &[1, 2], 0);
    a.clear_worker(1);
    assert_eq!(hits(&a, &[1, 2, 3], 1), vec![(0, 2), (1, 2)]);
    assert_eq!((b.held(1), b.held(2), a.stats().dropped), (0, 2, 3));
    a.clear_worker(9); // unknown: nothing
    a.touch(1, &[3], 2);
    assert_eq!(hits(&a, &[3], 3), vec![(0, 1)]);
}

#[test]
fn touch_queues_stay_bounded_under_repeated_touches() {
    let mut a = ApproxShard::new(u64::MAX, budget(), 1);
    let prompt: Vec<u64> = (0..100).collect();
    for t in 0..10_000 {
        a.touch(0, &prompt, t);
        assert!(a.queued(0) <= 2 * 100 + QUEUE_SLACK, "{}", a.queued(0));
    }
    assert_eq!(a.len(), 100);
}

#[test]
fn sweeps_are_throttled_to_an_eighth_of_the_ttl_but_queries_never_lag() {
    let mut a = ApproxShard::new(800, budget(), 1);
    a.touch(0, &[1], 0);
    a.touch(1, &[2], 200);
    a.expire(900); // reclaims 1 only (2 lives until 1,000)
    assert_eq!(a.len(), 1);
    assert_eq!(hits(&a, &[2], 999), vec![(0, 1)]);
    a.expire(950); // within 100 µs of the last sweep: no work
    assert_eq!(a.len(), 1);
    assert!(hits(&a, &[2], 1_000).is_empty());
    a.expire(1_000);
    assert_eq!(a.len(), 0);
}

/// A plain reference LRU per worker: entries in touch order (oldest first).
#[derive(Default)]
struct Model {
    lanes: Vec<Vec<(u64, u64)>>, // (hash, touched)
}

impl Model {
    fn touch(&mut self, w: usize, hashes: &[u64], now: u64, ttl: u64, cap: usize) {
        if self.lanes.len() <= w {
            self.lanes.resize_with(w + 1, Vec::new);
        }
        let lane = &mut self.lanes[w];
        lane.retain(|&(_, t)| t + ttl > now);
        // This call's blocks leave the LRU order (those held first: none of them is
        // evicted for a new one); the earlier ones may be evicted.
        let mut call = Vec::new();
        for &h in hashes {
            if let Some(p) = lane.iter().position(|&(x, _)| x == h) {
                lane.remove(p);
                call.push(h);
            }
        }
        for &h in hashes {
            if call.contains(&h) {
                continue;
            }
            if lane.len() + call.len() < cap {
                call.push(h);
            } else if !lane.is_empty() {
                lane.remove(0);
                call.push(h);
            }
        }
        // They come back most recent, the deepest first in eviction order.
        for &h in hashes.iter().rev() {
            if call.contains(&h) && !lane.iter().any(|&(x, _)| x == h) {
                lane.push((h, now));
            }
        }
    }

    fn hits(&self, hashes: &[u64], now: u64, ttl: u64) -> Vec<(u32, WorkerSlot)> {
        let mut out = Vec::new();
        for (i, &h) in hashes.iter().enumerate() {
            for (w, lane) in self.lanes.iter().enumerate() {
                if lane.iter().any(|&(x, t)| x == h && t + ttl > now) {
                    out.push((i as u32, w as WorkerSlot));
                }
            }
        }
        out.sort_unstable();
        out
    }
}

#[derive(Clone, Debug)]
enum Op {
    Touch(u8, Vec<u8>),
    Advance(u16),
    Expire,
    Clear(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, prop::collection::vec(0u8..24, 0..10)).prop_map(|(w, h)| Op::Touch(w, h)),
        2 => (0u16..400).prop_map(Op::Advance),
        1 => Just(Op::Expire),
        1 => (0u8..3).prop_map(Op::Clear),
    ]
}

proptest! {
    #[test]
    fn matches_a_plain_lru_with_an_idle_ttl(ops in prop::collection::vec(op(), 1..80)) {
        const TTL: u64 = 1_000;
        const CAP: usize = 6;
        let b = budget();
        let mut a = ApproxShard::new(TTL, b.clone(), 1);
        for w in 0..3 {
            a.set_worker_cap(w, CAP as u64);
        }
        let mut m = Model::default();
        let mut now = 0u64;
        let all: Vec<u64> = (0..24).collect();
        for op in ops {
            match op {
                Op::Touch(w, hs) => {
                    let hs: Vec<u64> = hs.into_iter().map(u64::from).collect();
                    a.touch(w as WorkerSlot, &hs, now);
                    m.touch(w as usize, &hs, now, TTL, CAP);
                    prop_assert_eq!(a.worker_entries(w as WorkerSlot), m.lanes[w as usize].len() as u64);
                    prop_assert_eq!(b.held(w as WorkerSlot), m.lanes[w as usize].len() as u64);
                }
                Op::Advance(d) => now += u64::from(d),
                Op::Expire => a.expire(now),
                Op::Clear(w) => {
                    a.clear_worker(w as WorkerSlot);
                    if let Some(l) = m.lanes.get_mut(w as usize) {
                        l.clear();
                    }
                    prop_assert_eq!(b.held(w as WorkerSlot), 0);
                }
            }
            prop_assert_eq!(hits(&a, &all, now), m.hits(&all, now, TTL));
        }
    }
}
