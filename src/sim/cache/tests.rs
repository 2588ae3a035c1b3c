//! Tests of the LRU KV cache: eviction order, pinning, and event exactness.

use super::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;

fn apply(mirror: &mut HashSet<u64>, events: &[CacheEvent]) {
    for e in events {
        match e {
            CacheEvent::Stored { parent, hashes } => {
                if let Some(p) = parent {
                    assert!(mirror.contains(p), "parent {p} not present when stored");
                }
                for h in hashes {
                    assert!(mirror.insert(*h), "{h} stored twice");
                }
            }
            CacheEvent::Removed { hashes } => {
                for h in hashes {
                    assert!(mirror.remove(h), "{h} removed but absent");
                }
            }
        }
    }
}

/// Walks the LRU list both ways and checks it against the map and pin count.
fn check_list(c: &KvCache) {
    let mut fwd = Vec::new();
    let mut i = c.head;
    while i != NIL {
        fwd.push(i);
        i = c.nodes[i as usize].next;
    }
    let mut back = Vec::new();
    let mut i = c.tail;
    while i != NIL {
        back.push(i);
        i = c.nodes[i as usize].prev;
    }
    back.reverse();
    assert_eq!(fwd, back);
    assert_eq!(fwd.len() + c.pinned(), c.len());
    assert!(c.len() <= c.capacity());
    for idx in fwd {
        let n = &c.nodes[idx as usize];
        assert_eq!(n.pins, 0);
        assert_eq!(c.map.get(&n.hash), Some(&idx));
    }
}

#[test]
fn lru_evicts_least_recently_used() {
    let mut c = KvCache::new(3);
    let mut ev = Vec::new();
    for h in [1u64, 2, 3] {
        c.insert(&[h], &mut ev);
    }
    assert_eq!(c.lookup(&[1]), 1); // 2 is now the LRU block
    ev.clear();
    assert_eq!(c.insert(&[4], &mut ev), 1);
    assert_eq!(
        ev,
        vec![
            CacheEvent::Removed { hashes: vec![2] },
            CacheEvent::Stored {
                parent: None,
                hashes: vec![4]
            }
        ]
    );
    assert!(c.contains(1) && c.contains(3) && c.contains(4) && !c.contains(2));
    check_list(&c);
}

#[test]
fn deepest_block_of_a_prefix_is_evicted_first() {
    let mut c = KvCache::new(3);
    let mut ev = Vec::new();
    c.insert(&[10, 11, 12], &mut ev);
    ev.clear();
    c.insert(&[20], &mut ev);
    assert_eq!(ev[0], CacheEvent::Removed { hashes: vec![12] });
    assert_eq!(c.lookup(&[10, 11, 12]), 2);
}

#[test]
fn lookup_returns_longest_prefix_only() {
    let mut c = KvCache::new(10);
    let mut ev = Vec::new();
    c.insert(&[1, 2, 3], &mut ev);
    assert_eq!(c.lookup(&[1, 2, 9, 3]), 2);
    assert_eq!(c.lookup(&[9, 1]), 0);
    assert_eq!(c.lookup(&[]), 0);
}

#[test]
fn insert_events_name_parents_and_runs() {
    let mut c = KvCache::new(10);
    let mut ev = Vec::new();
    c.insert(&[1, 2], &mut ev);
    ev.clear();
    // Block 2 already cached in the middle: two runs, each with its parent.
    c.insert(&[1, 5], &mut ev);
    ev.clear();
    assert_eq!(c.insert(&[1, 5, 6, 7], &mut ev), 4);
    assert_eq!(
        ev,
        vec![CacheEvent::Stored {
            parent: Some(5),
            hashes: vec![6, 7]
        }]
    );
    ev.clear();
    assert_eq!(c.insert(&[1, 5, 6, 7], &mut ev), 4);
    assert!(ev.is_empty(), "nothing new, no events");
}

#[test]
fn pinned_blocks_survive_and_insert_stores_what_fits() {
    let mut c = KvCache::new(4);
    let mut ev = Vec::new();
    c.insert(&[1, 2, 3], &mut ev);
    assert_eq!(c.pin(&[1, 2, 3, 4]), 3);
    ev.clear();
    // One free slot: stores 7 only, stops at 8, evicts nothing pinned.
    assert_eq!(c.insert(&[7, 8, 9], &mut ev), 1);
    assert_eq!(
        ev,
        vec![CacheEvent::Stored {
            parent: None,
            hashes: vec![7]
        }]
    );
    ev.clear();
    // A request bigger than the free space keeps its own earlier blocks.
    assert_eq!(c.insert(&[20, 21], &mut ev), 1);
    assert_eq!(ev[0], CacheEvent::Removed { hashes: vec![7] });
    assert!(c.contains(1) && c.contains(2) && c.contains(3));
    c.unpin(&[1, 2, 3]);
    assert_eq!(c.pinned(), 0);
    check_list(&c);
    ev.clear();
    assert_eq!(c.insert(&[30, 31, 32], &mut ev), 3);
    assert_eq!(c.len(), 4);
    check_list(&c);
}

#[test]
fn zero_capacity_stores_nothing() {
    let mut c = KvCache::new(0);
    let mut ev = Vec::new();
    assert_eq!(c.insert(&[1, 2], &mut ev), 0);
    assert!(ev.is_empty() && c.is_empty());
}

/// Random operations: the set obtained by replaying every emitted event equals the
/// cache contents after every call, and pinned blocks are never evicted.
#[test]
fn replayed_events_mirror_the_cache() {
    for seed in 0..40u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let cap = rng.random_range(1..40);
        let mut c = KvCache::new(cap);
        let mut mirror = HashSet::new();
        let mut pins: Vec<Vec<u64>> = Vec::new();
        for _ in 0..300 {
            // Prompts share prefixes: a few roots, chains of varying length.
            let root = rng.random_range(0..5u64);
            let len = rng.random_range(0..12u64);
            let branch = rng.random_range(0..3u64);
            let hashes: Vec<u64> = (0..len)
                .map(|i| root * 1000 + i * 10 + if i > 3 { branch } else { 0 })
                .collect();
            let mut ev = Vec::new();
            match rng.random_range(0..4) {
                0 => {
                    c.lookup(&hashes);
                }
                1 => {
                    let k = c.pin(&hashes);
                    pins.push(hashes[..k].to_vec());
                }
                2 if !pins.is_empty() => {
                    let i = rng.random_range(0..pins.len());
                    c.unpin(&pins.swap_remove(i));
                }
                _ => {
                    let k = c.insert(&hashes, &mut ev);
                    assert_eq!(k, c.prefix_len(&hashes));
                }
            }
            apply(&mut mirror, &ev);
            let contents: HashSet<u64> = c.blocks().collect();
            assert_eq!(contents, mirror, "seed {seed}");
            for p in &pins {
                assert!(p.iter().all(|h| c.contains(*h)), "pinned block evicted");
            }
            check_list(&c);
        }
    }
}
