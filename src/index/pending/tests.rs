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
    assert!(p.queue.len() <= 2 * p.len() + 1025, "{}", p.queue.len());
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
