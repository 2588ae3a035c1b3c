//! Route-time prefix affinity: which worker the router last sent a prompt prefix to
//! (`affinity_max_entries`, `affinity_slack`; docs/ROUTING.md "Prefix affinity").
//!
//! Under cache pressure the KV index often cannot tell workers apart: a conversation's
//! earlier turns were evicted everywhere, or survive only in part, and the `kv` cost
//! of the workers is within `balance_slack` of each other. Taking such near ties in
//! turn spreads a conversation's turns over the fleet, so every worker caches a slice
//! of every conversation and the LRU caches thrash (4 workers × 4,096 blocks,
//! 6.5 % hits against 11.3 % for SGLang's gateway, whose approximate tree of routed
//! text keeps a conversation on one worker). This map remembers, per prompt prefix,
//! the worker it was routed to; the decision then prefers that worker among the
//! near-tied ones (`Hits::set_affinity`, the kernel's tie rule), which keeps the
//! workers' caches holding disjoint sets of conversations.
//!
//! Keys are the router's prefix-chained block hashes, so a hash names the whole prefix
//! up to its block. A routed prompt is noted at its anchors: every [`STRIDE`]-th block
//! and its last block. A lookup scans the request's blocks from its last down to the
//! middle of its prompt and answers the worker of the deepest one found, so it covers
//! at least half of the prompt (a shared system prompt alone does not pull
//! conversations together; the gateway's `cache_threshold` is 0.5 too). It reads
//! every position there, not only its own anchors: the previous turn's last block,
//! the prefix the next turn shares exactly, is at no fixed stride (scanning the
//! anchors only missed it and fell back to a stride anchor up to 7 blocks shorter,
//! often under half the prompt).
//!
//! The map is a direct-mapped table of `max_entries` (rounded up to a power of two)
//! atomic words, each holding a hash's upper 48 bits as its tag and a worker slot:
//! a lookup reads one word per position it scans, a note one per anchor, and a colliding prefix
//! simply replaces the older one, as in a hardware cache. Being atomic, one table
//! serves every core of the service (a conversation's turns may arrive on different
//! cores) without a lock; relaxed ordering is enough, since an entry is a hint that
//! a stale or lost value only makes less useful, never wrong.
//!
//! Guarantees: memory fixed at start (8 bytes per entry, at most
//! [`crate::config::MAX_AFFINITY_ENTRIES`]); at most half the prompt's blocks + 1
//! word reads per lookup (stopping at the deepest hit) and O(prompt blocks / STRIDE)
//! writes per note; pure apart from the atomics (no I/O, no clock), no
//! panics. A tag collision (two prefixes with the same upper 48 bits in the same
//! word) can name the wrong worker: harmless, it only moves one near tie.

use crate::types::WorkerSlot;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every this many blocks a routed prompt leaves an anchor (plus its last block).
pub const STRIDE: usize = 8;

/// An empty word (no tag is 0 once the low bit is forced on, see [`tag`]).
const EMPTY: u64 = 0;

/// The affinity map (see the module docs). `Default` is disabled (no entries).
#[derive(Debug, Default)]
pub struct Affinity {
    words: Box<[AtomicU64]>,
    mask: usize,
}

/// Anchor positions of a prompt of `n` blocks, deepest first.
fn anchors(n: usize) -> impl Iterator<Item = usize> {
    let last = n.checked_sub(1);
    let aligned = (1..=n / STRIDE).rev().map(|k| k * STRIDE - 1);
    last.into_iter()
        .chain(aligned.filter(move |&i| Some(i) != last))
}

/// The tag of hash `h` in a word: its upper 48 bits, with bit 16 set so that no
/// tagged word is [`EMPTY`].
#[inline]
fn tag(h: u64) -> u64 {
    (h & !0xffff) | 0x1_0000
}

impl Affinity {
    /// A map of `max_entries` entries (rounded up to a power of two, at most
    /// [`crate::config::MAX_AFFINITY_ENTRIES`]); 0 disables it.
    pub fn new(max_entries: usize) -> Affinity {
        if max_entries == 0 {
            return Affinity::default();
        }
        let n = max_entries
            .min(crate::config::MAX_AFFINITY_ENTRIES)
            .next_power_of_two();
        Affinity {
            words: (0..n).map(|_| AtomicU64::new(EMPTY)).collect(),
            mask: n - 1,
        }
    }

    /// Whether the map is in use.
    pub fn enabled(&self) -> bool {
        !self.words.is_empty()
    }

    /// Entries the table can hold.
    pub fn capacity(&self) -> usize {
        self.words.len()
    }

    /// The word of hash `h`: the low bits of a mix of it (the block hashes are already
    /// uniform, the mix guards against a caller's structured ones).
    #[inline]
    fn word(&self, h: u64) -> Option<&AtomicU64> {
        let i = (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize & self.mask;
        self.words.get(i)
    }

    fn get(&self, h: u64) -> Option<WorkerSlot> {
        let w = self.word(h)?.load(Ordering::Relaxed);
        (w != EMPTY && w & !0xffff == tag(h)).then_some((w & 0xffff) as WorkerSlot)
    }

    /// The worker the deepest remembered prefix of `hashes` was routed to, if that
    /// prefix covers at least half of the prompt's blocks.
    pub fn lookup(&self, hashes: &[u64]) -> Option<WorkerSlot> {
        if !self.enabled() || hashes.is_empty() {
            return None;
        }
        // Every position from the last down to half the prompt, not only this
        // prompt's anchors: an earlier turn's last block (its anchor) sits anywhere.
        let need = hashes.len().div_ceil(2);
        hashes
            .get(need.saturating_sub(1)..)?
            .iter()
            .rev()
            .find_map(|&h| self.get(h))
    }

    /// Remembers a decision for `hashes`: its prefill worker (else its only worker).
    /// A pinned request is the caller's choice, not a routing of its prefix, and
    /// leaves no note.
    pub fn note_decision(&self, hashes: &[u64], pinned: bool, d: &super::Decision) {
        self.note_route(hashes, pinned, d.decode_worker, d.prefill_worker);
    }

    /// [`Affinity::note_decision`]'s rule for a decision known only by its workers:
    /// a peer replica's route (`--cluster`), whose pinned flag travels with it.
    pub fn note_route(
        &self,
        hashes: &[u64],
        pinned: bool,
        decode: WorkerSlot,
        prefill: Option<WorkerSlot>,
    ) {
        if !pinned {
            self.note(hashes, prefill.unwrap_or(decode));
        }
    }

    /// Remembers that `hashes` was routed to `worker`.
    pub fn note(&self, hashes: &[u64], worker: WorkerSlot) {
        if !self.enabled() {
            return;
        }
        for i in anchors(hashes.len()) {
            if let Some((&h, w)) = hashes.get(i).and_then(|h| Some((h, self.word(*h)?))) {
                w.store(tag(h) | u64::from(worker), Ordering::Relaxed);
            }
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
        let a = Affinity::new(1000);
        let turn1: Vec<u64> = (1..=10).collect();
        a.note(&turn1, 3);
        // Turn 1's last block (block 10) is found although it is no anchor of turn
        // 2: 10 blocks of 18 cover half.
        let turn2: Vec<u64> = (1..=18).collect();
        assert_eq!(a.lookup(&turn2), Some(3));
        // 10 of 21 do not; block 8 (turn 1's stride anchor) is not looked at either.
        let turn3: Vec<u64> = (1..=21).collect();
        assert_eq!(a.lookup(&turn3), None);
        // 8 blocks (the stride anchor) of a diverging 16-block prompt do.
        let other: Vec<u64> = (1..=8).chain(100..108).collect();
        assert_eq!(a.lookup(&other), Some(3));
        // The same prompt again: its last block.
        assert_eq!(a.lookup(&turn1), Some(3));
        // A later routing of the same prefix elsewhere wins.
        a.note(&turn1, 5);
        assert_eq!(a.lookup(&turn1), Some(5));
        assert_eq!(a.lookup(&[99]), None);
        assert_eq!(a.lookup(&[]), None);
    }

    #[test]
    fn a_pinned_route_leaves_no_note_and_a_routed_one_notes_its_prefill_worker() {
        let a = Affinity::new(64);
        a.note_route(&[1, 2], true, 4, None);
        assert_eq!(a.lookup(&[1, 2]), None);
        a.note_route(&[1, 2], false, 4, Some(6));
        assert_eq!(a.lookup(&[1, 2]), Some(6));
        a.note_route(&[3], false, 4, None);
        assert_eq!(a.lookup(&[3]), Some(4));
    }

    #[test]
    fn disabled_remembers_nothing() {
        let a = Affinity::new(0);
        a.note(&[1, 2, 3], 1);
        assert!(!a.enabled());
        assert_eq!(a.lookup(&[1, 2, 3]), None);
    }

    #[test]
    fn the_table_is_fixed_and_a_colliding_prefix_replaces_the_older() {
        let a = Affinity::new(6);
        assert_eq!(a.capacity(), 8);
        assert_eq!(
            Affinity::new(usize::MAX).capacity(),
            crate::config::MAX_AFFINITY_ENTRIES
        );
        let hs: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D))
            .collect();
        for (i, &h) in hs.iter().enumerate() {
            a.note(&[h], (i % 7) as WorkerSlot);
        }
        assert_eq!(a.lookup(&[hs[999]]), Some((999 % 7) as WorkerSlot));
        let found = hs.iter().filter(|&&h| a.lookup(&[h]).is_some()).count();
        assert!(found <= 8, "at most one entry per word: {found}");
        // A hash whose tag matches a word's but whose slot differs is not confused
        // with an empty word: slot 0 is remembered too.
        let b = Affinity::new(4);
        b.note(&[42], 0);
        assert_eq!(b.lookup(&[42]), Some(0));
    }
}
