//! Route-time prefix affinity: which worker the router last sent a prompt prefix to
//! (`affinity_max_entries`, `affinity_slack`; docs/ROUTING.md "Prefix affinity").
//!
//! Under cache pressure the KV index often cannot tell workers apart: a conversation's
//! earlier turns were evicted everywhere, or survive only in part, and the `kv` cost
//! of the workers is within `balance_slack` of each other. Taking such near ties in
//! turn spreads a conversation's turns over the fleet, so every worker caches a slice
//! of every conversation and the LRU caches thrash (issue 18: 4 workers × 4,096 blocks,
//! 6.5 % hits against 11.3 % for SGLang's gateway, whose approximate tree of routed
//! text keeps a conversation on one worker). This map remembers, per prompt prefix,
//! the worker it was routed to; the decision then prefers that worker among the
//! near-tied ones (`Hits::set_affinity`, the kernel's tie rule), which keeps the
//! workers' caches holding disjoint sets of conversations.
//!
//! Keys are the router's prefix-chained block hashes, so a hash names the whole prefix
//! up to its block. A routed prompt is noted at its anchors: every [`STRIDE`]-th block
//! and its last block. A lookup scans the request's anchors from the deepest down and
//! answers the worker of the deepest one found, if it covers at least half of the
//! prompt (a shared system prompt alone does not pull conversations together; the
//! gateway's `cache_threshold` is 0.5 too).
//!
//! Guarantees: at most `max_entries` entries (two generations of at most half each:
//! when the young one is full, the old one is dropped and the young one ages), so
//! memory is bounded and old prefixes are forgotten first; O(prompt blocks / STRIDE)
//! hash-map operations per lookup and per note; pure (no I/O, no clock), no panics.

use crate::types::WorkerSlot;
use hashbrown::HashMap;

/// Every this many blocks a routed prompt leaves an anchor (plus its last block).
pub const STRIDE: usize = 8;

/// The affinity map (see the module docs). `Default` is disabled (no entries).
#[derive(Clone, Debug, Default)]
pub struct Affinity {
    max_entries: usize,
    young: HashMap<u64, WorkerSlot>,
    old: HashMap<u64, WorkerSlot>,
}

/// Anchor positions of a prompt of `n` blocks, deepest first.
fn anchors(n: usize) -> impl Iterator<Item = usize> {
    let last = n.checked_sub(1);
    let aligned = (1..=n / STRIDE).rev().map(|k| k * STRIDE - 1);
    last.into_iter()
        .chain(aligned.filter(move |&i| Some(i) != last))
}

impl Affinity {
    /// A map of at most `max_entries` entries; 0 disables it.
    pub fn new(max_entries: usize) -> Affinity {
        Affinity {
            max_entries,
            ..Default::default()
        }
    }

    /// Resizes to `max_entries` (0 disables and forgets everything).
    pub fn set_max_entries(&mut self, max_entries: usize) {
        if max_entries != self.max_entries {
            *self = Affinity::new(max_entries);
        }
    }

    /// Whether the map is in use.
    pub fn enabled(&self) -> bool {
        self.max_entries > 0
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, h: u64) -> Option<WorkerSlot> {
        self.young.get(&h).or_else(|| self.old.get(&h)).copied()
    }

    /// The worker the deepest remembered prefix of `hashes` was routed to, if that
    /// prefix covers at least half of the prompt's blocks.
    pub fn lookup(&self, hashes: &[u64]) -> Option<WorkerSlot> {
        if !self.enabled() || hashes.is_empty() {
            return None;
        }
        let need = hashes.len().div_ceil(2);
        anchors(hashes.len())
            .take_while(|&i| i + 1 >= need)
            .find_map(|i| hashes.get(i).and_then(|&h| self.get(h)))
    }

    /// Remembers that `hashes` was routed to `worker`.
    pub fn note(&mut self, hashes: &[u64], worker: WorkerSlot) {
        if !self.enabled() {
            return;
        }
        let half = (self.max_entries / 2).max(1);
        for i in anchors(hashes.len()) {
            let Some(&h) = hashes.get(i) else { continue };
            if self.young.len() >= half && !self.young.contains_key(&h) {
                self.old = std::mem::take(&mut self.young);
            }
            self.young.insert(h, worker);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_the_last_block_then_every_stride_th_deepest_first() {
        assert_eq!(anchors(0).collect::<Vec<_>>(), Vec::<usize>::new());
        assert_eq!(anchors(3).collect::<Vec<_>>(), vec![2]);
        assert_eq!(anchors(8).collect::<Vec<_>>(), vec![7]);
        assert_eq!(anchors(20).collect::<Vec<_>>(), vec![19, 15, 7]);
    }

    #[test]
    fn a_longer_turn_finds_the_worker_of_its_earlier_turn() {
        let mut a = Affinity::new(1000);
        let turn1: Vec<u64> = (1..=10).collect();
        a.note(&turn1, 3);
        let turn2: Vec<u64> = (1..=18).collect();
        // Deepest anchor of turn 2 found: 7 (block 8, anchored by turn 1's stride).
        // 8 blocks of 18 is less than half: not enough.
        assert_eq!(a.lookup(&turn2), None);
        let turn2: Vec<u64> = (1..=14).collect();
        // Block 10 is not an anchor of turn 2 (only 13 and 7 are); 7 covers 8 of 14.
        assert_eq!(a.lookup(&turn2), Some(3));
        // The same prompt again: its last block.
        assert_eq!(a.lookup(&turn1), Some(3));
        // A later routing of the same prefix elsewhere wins.
        a.note(&turn1, 5);
        assert_eq!(a.lookup(&turn1), Some(5));
        assert_eq!(a.lookup(&[99]), None);
        assert_eq!(a.lookup(&[]), None);
    }

    #[test]
    fn disabled_remembers_nothing() {
        let mut a = Affinity::default();
        a.note(&[1, 2, 3], 1);
        assert!(a.is_empty());
        assert_eq!(a.lookup(&[1, 2, 3]), None);
    }

    #[test]
    fn entries_stay_bounded_and_the_oldest_go_first() {
        let mut a = Affinity::new(8);
        for h in 0..100u64 {
            a.note(&[h], h as WorkerSlot);
            assert!(a.len() <= 8, "{} entries", a.len());
        }
        assert_eq!(a.lookup(&[99]), Some(99));
        assert_eq!(a.lookup(&[0]), None, "the oldest were forgotten");
        a.set_max_entries(0);
        assert!(a.is_empty() && !a.enabled());
    }
}
