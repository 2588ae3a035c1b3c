//! Unit tests of the pending (speculative) structure: TTL, confirmation, cap, and the
//! extension of device runs.

use super::*;
use crate::index::{merge, Match, ShardAnswer};
use crate::types::Tier;

fn hits(p: &PendingShard, hashes: &[u64], now: u64) -> Vec<(u32, WorkerSlot)> {
    let items: Vec<(u32, u64)> = hashes
        .iter()
        .enumerate()
        .map(|(i, &h)| (i as u32, h))
        .collect();
    let mut out = Vec::new();
    p.query(&items, now, &mut out);
    out.sort_unstable();
    out
}

#[test]
fn pending_until_ttl() {
    let mut p = PendingShard::new(1_000, 100);
    p.add(1, &[10, 11, 12], 5_000);
    assert_eq!(hits(&p, &[10, 11, 12], 5_999), vec![(0, 1), (1, 1), (2, 1)]);
    // Exactly at the TTL it is gone, even before `expire` reclaims it.
    assert!(hits(&p, &[10, 11, 12], 6_000).is_empty());
    assert_eq!(p.len(), 3);
    p.expire(6_000);
    assert_eq!(p.len(), 0);
    assert_eq!(p.stats().expired, 3);
}

#[test]
fn re_adding_refreshes_without_double_counting() {
    let mut p = PendingShard::new(1_000, 100);
    p.add(1, &[10], 0);
    p.add(1, &[10], 800);
    assert_eq!(p.len(), 1);
    p.expire(1_500);
    assert_eq!(hits(&p, &[10], 1_500), vec![(0, 1)]);
    p.expire(1_800);
    assert!(p.is_empty());
    // Two workers may have the same hash pending.
    p.add(1, &[10], 2_000);
    p.add(2, &[10], 2_000);
    assert_eq!(hits(&p, &[10], 2_000), vec![(0, 1), (0, 2)]);
}

#[test]
fn confirm_drop_and_clear() {
    let mut p = PendingShard::new(1_000_000, 100);
    p.add(1, &[10, 11, 12], 0);
    p.add(2, &[10, 11], 0);
    p.confirm(1, &[10, 99]);
    assert_eq!(
        hits(&p, &[10, 11, 12], 1),
        vec![(0, 2), (1, 1), (1, 2), (2, 1)]
    );
    p.drop_hashes(2, &[11]);
    assert_eq!(hits(&p, &[10, 11, 12], 1), vec![(0, 2), (1, 1), (2, 1)]);
    p.clear_worker(1);
    assert_eq!(hits(&p, &[10, 11, 12], 1), vec![(0, 2)]);
    assert_eq!(p.len(), 1);
    let s = p.stats();
    assert_eq!((s.added, s.confirmed, s.dropped), (5, 1, 3));
    // Confirmed entries' queue records are stale: expiring skips them safely.
    p.expire(u64::MAX);
    assert!(p.is_empty());
}

#[test]
fn cap_evicts_oldest_first() {
    let mut p = PendingShard::new(1_000_000, 4);
    p.add(1, &[1, 2, 3], 0);
    p.add(2, &[4, 5, 6], 10);
    assert_eq!(p.len(), 4);
    // 1 and 2 (the oldest) went; 3 stays.
    assert_eq!(
        hits(&p, &[1, 2, 3, 4, 5, 6], 20),
        vec![(2, 1), (3, 2), (4, 2), (5, 2)]
    );
    assert_eq!(p.stats().evicted, 2);
    // Memory stays bounded under churn: the queue is compacted.
    for i in 0..100_000u64 {
        p.add((i % 3) as WorkerSlot, &[i % 7], i);
        p.confirm((i % 3) as WorkerSlot, &[i % 7]);
    }
    assert!(p.len() <= 4);
    assert!(p.queued() <= 2 * p.len() + 1025, "{}", p.queued());
}

#[test]
fn disabled_stores_nothing() {
    for (ttl, cap) in [(0, 10), (10, 0)] {
        let mut p = PendingShard::new(ttl, cap);
        assert!(!p.enabled());
        p.add(1, &[1, 2], 0);
        assert!(p.is_empty());
        assert!(hits(&p, &[1, 2], 0).is_empty());
    }
}

fn ov(device: u32, host: u32, disk: u32, shared: u32) -> Overlap {
    Overlap {
        device,
        host,
        disk,
        shared,
    }
}

#[test]
fn extend_device_moves_the_boundaries() {
    assert_eq!(extend_device(ov(0, 0, 0, 0), 3), ov(3, 0, 0, 0));
    assert_eq!(extend_device(ov(2, 3, 2, 4), 1), ov(3, 2, 2, 4));
    assert_eq!(extend_device(ov(2, 3, 2, 4), 4), ov(6, 0, 1, 4));
    assert_eq!(extend_device(ov(2, 3, 2, 4), 7), ov(9, 0, 0, 2));
    assert_eq!(extend_device(ov(0, 0, 0, 5), 8), ov(8, 0, 0, 0));
    assert_eq!(extend_device(ov(1, 0, 0, 0), u32::MAX).device, u32::MAX);
}

#[test]
fn speculate_continues_the_device_run() {
    // Worker 1 holds positions 0..2 on device; worker 2 holds nothing.
    let answer = ShardAnswer::from_matches(
        2,
        &[
            Match {
                pos: 0,
                worker: 1,
                tier: Tier::Device,
            },
            Match {
                pos: 1,
                worker: 1,
                tier: Tier::Device,
            },
        ],
    );
    let mut merged = MergeResult::default();
    merge(6, &[answer], |_| false, &mut merged);
    // Pending: worker 1 at 2, 3 and 5 (a gap at 4); worker 2 at 1..3 (not from 0);
    // worker 3 at 0..3, given twice and out of order.
    let mut m = vec![
        (5, 1),
        (2, 1),
        (3, 1),
        (1, 2),
        (2, 2),
        (2, 3),
        (0, 3),
        (1, 3),
        (0, 3),
    ];
    let mut out = Vec::new();
    speculate(&merged, &mut m, &mut out);
    assert_eq!(
        out,
        vec![
            Speculated {
                worker: 1,
                overlap: ov(4, 0, 0, 0),
                speculative: 2,
            },
            Speculated {
                worker: 3,
                overlap: ov(3, 0, 0, 0),
                speculative: 3,
            },
        ]
    );
}

/// A plain model of the pending set: every (hash, worker) with its expiry and its
/// eviction order (the order of the `add` that last inserted or refreshed it).
mod model {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct Model {
        ttl: u64,
        cap: usize,
        /// (hash, worker) -> (order, expires)
        m: BTreeMap<(u64, WorkerSlot), (u64, u64)>,
        next: u64,
        stats: PendingStats,
    }

    impl Model {
        fn expire(&mut self, now: u64) {
            let before = self.m.len();
            self.m.retain(|_, &mut (_, exp)| exp > now);
            self.stats.expired += (before - self.m.len()) as u64;
        }
        fn add(&mut self, w: WorkerSlot, hashes: &[u64], now: u64) {
            if self.ttl == 0 || self.cap == 0 {
                return;
            }
            self.expire(now);
            let call = self.next;
            for &h in hashes {
                let order = self.next;
                self.next += 1;
                let exp = now + self.ttl;
                if let Some(e) = self.m.get_mut(&(h, w)) {
                    if e.0 >= call {
                        continue; // repeated within this call
                    }
                    *e = (order, exp);
                    continue;
                }
                while self.m.len() >= self.cap {
                    let oldest = *self.m.iter().min_by_key(|(_, v)| v.0).unwrap().0;
                    self.m.remove(&oldest);
                    self.stats.evicted += 1;
                }
                self.m.insert((h, w), (order, exp));
                self.stats.added += 1;
            }
        }
        fn remove(&mut self, w: WorkerSlot, hashes: &[u64]) -> u64 {
            hashes
                .iter()
                .filter(|&&h| self.m.remove(&(h, w)).is_some())
                .count() as u64
        }
        fn query(&self, hashes: &[u64], now: u64) -> Vec<(u32, WorkerSlot)> {
            let mut out = Vec::new();
            for (i, &h) in hashes.iter().enumerate() {
                for (&(_, w), &(_, exp)) in self.m.range((h, 0)..=(h, WorkerSlot::MAX)) {
                    if exp > now {
                        out.push((i as u32, w));
                    }
                }
            }
            out.sort_unstable();
            out
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Add(WorkerSlot, Vec<u64>),
        Confirm(WorkerSlot, Vec<u64>),
        Drop(WorkerSlot, Vec<u64>),
        Clear(WorkerSlot),
        Expire,
        Tick(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let w = 0u16..3;
        let hs = proptest::collection::vec(0u64..24, 0..12);
        prop_oneof![
            6 => (w.clone(), hs.clone()).prop_map(|(w, h)| Op::Add(w, h)),
            2 => (w.clone(), hs.clone()).prop_map(|(w, h)| Op::Confirm(w, h)),
            2 => (w.clone(), hs).prop_map(|(w, h)| Op::Drop(w, h)),
            1 => w.prop_map(Op::Clear),
            1 => Just(Op::Expire),
            3 => (0u64..40).prop_map(Op::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn matches_the_model(
            ttl in 0u64..60,
            cap in prop_oneof![Just(0usize), 1usize..6, 6usize..40],
            ops in proptest::collection::vec(op(), 0..80),
        ) {
            let mut p = PendingShard::new(ttl, cap);
            let mut m = Model { ttl, cap, ..Model::default() };
            let mut now = 0u64;
            let all: Vec<u64> = (0..24).collect();
            for op in ops {
                match op {
                    Op::Add(w, h) => {
                        p.add(w, &h, now);
                        m.add(w, &h, now);
                    }
                    Op::Confirm(w, h) => {
                        p.confirm(w, &h);
                        m.stats.confirmed += m.remove(w, &h);
                    }
                    Op::Drop(w, h) => {
                        p.drop_hashes(w, &h);
                        m.stats.dropped += m.remove(w, &h);
                    }
                    Op::Clear(w) => {
                        p.clear_worker(w);
                        let before = m.m.len();
                        m.m.retain(|&(_, x), _| x != w);
                        m.stats.dropped += (before - m.m.len()) as u64;
                    }
                    Op::Expire => {
                        p.expire(now);
                        m.expire(now);
                    }
                    Op::Tick(d) => now += d,
                }
                prop_assert_eq!(p.len(), m.m.len());
                prop_assert_eq!(p.stats(), m.stats);
                prop_assert_eq!(hits(&p, &all, now), m.query(&all, now));
                prop_assert!(p.len() <= cap);
                prop_assert!(p.queued() <= 2 * p.len() + 1024 + 12);
            }
        }
    }
}
