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
//! conversations together; the gateway's `cache_threshold` is 0.5 too). It must find
//! the previous turn's last block, the prefix the next turn shares exactly, which is
//! at no fixed stride (falling back to a stride anchor up to 7 blocks shorter was
//! often under half the prompt). It need not read every position for that: the note
//! that wrote a last block also wrote the stride anchor less than [`STRIDE`] below it.
//! So a lookup reads the stride positions from the deepest down to the first one
//! remembered, then the `STRIDE - 1` positions above that one: an eighth of the
//! positions instead of all of them (a long prompt's lookup is thousands of reads
//! spread over the table, each a likely cache miss).
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
//! [`crate::config::MAX_AFFINITY_ENTRIES`]); at most half the prompt's blocks /
//! STRIDE + STRIDE + 1 word reads per lookup and O(prompt blocks / STRIDE) writes per
//! note; pure apart from the atomics (no I/O, no clock), no
//! panics. A tag collision (two prefixes with the same upper 48 bits in the same
//! word) can name the wrong worker, and a stride anchor lost to a colliding prefix
//! can hide the last block above it (the lookup then answers a shallower anchor of
//! the same note, or nothing): harmless, it only moves one near tie.

use crate::types::WorkerSlot;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every this many blocks a routed prompt leaves an anchor (plus its last block).
pub const STRIDE: usize = 8;

/// How many positions ahead of its read a lookup prefetches a word.
const AHEAD: usize = 16;

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
        let n = hashes.len();
        // The shallowest position that counts: the prefix covers half the prompt.
        let lo = n.div_ceil(2) - 1;
        // 1. The deepest remembered stride anchor (positions k·STRIDE − 1), down to
        //    the last one whose window (2.) can still reach `lo`. The words are
        //    spread over the whole table: each is asked for `AHEAD` anchors before it
        //    is read, so the misses overlap.
        let top = n / STRIDE;
        let bottom = lo.saturating_sub(STRIDE - 2).div_ceil(STRIDE).max(1);
        let at = |k: usize| hashes.get(k * STRIDE - 1);
        for k in (bottom..=top).rev().take(AHEAD) {
            if let Some(&h) = at(k) {
                self.prefetch(h);
            }
        }
        let mut stride = None;
        for k in (bottom..=top).rev() {
            if let Some(&h) = k.checked_sub(AHEAD).filter(|&j| j >= bottom).and_then(at) {
                self.prefetch(h);
            }
            if let Some(w) = at(k).and_then(|&h| self.get(h)) {
                stride = Some((k * STRIDE - 1, w));
                break;
            }
        }
        // 2. The positions above it, short of the next anchor: where a prompt's last
        //    block can sit deeper (its note wrote the stride anchor below it too).
        let from = stride.map_or(0, |(p, _)| p + 1);
        let window = from.max(lo)..(from + STRIDE - 1).min(n);
        if let Some(w) = window.rev().find_map(|q| self.get(hashes[q])) {
            return Some(w);
        }
        stride.filter(|&(p, _)| p >= lo).map(|(_, w)| w)
    }

    /// Starts loading the word of hash `h` (a hint: no effect on contents).
    #[inline(always)]
    fn prefetch(&self, h: u64) {
        if let Some(w) = self.word(h) {
            crate::mem::prefetch(w);
        }
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
        // 10 of 21 do not, nor does block 8 (turn 1's stride anchor).
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
    fn a_long_scan_finds_the_deepest_remembered_prefix() {
        // Scans longer than the read-ahead: the deepest hit wins wherever it sits.
        let a = Affinity::new(1 << 16);
        let long: Vec<u64> = (1..=1000u64).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
        assert_eq!(a.lookup(&long), None);
        a.note(&long[..600], 2);
        assert_eq!(a.lookup(&long), Some(2), "400 positions down");
        a.note(&long[..990], 4);
        assert_eq!(a.lookup(&long), Some(4));
        let b = Affinity::new(1 << 16);
        b.note(&long[..499], 1);
        assert_eq!(b.lookup(&long), None);
        assert_eq!(b.lookup(&long[..998]), Some(1));
    }

    /// The scan of every position from the last down to half the prompt: what a
    /// lookup answers while no anchor was lost to a colliding prefix.
    fn full_scan(a: &Affinity, hashes: &[u64]) -> Option<WorkerSlot> {
        let need = hashes.len().div_ceil(2);
        hashes
            .get(need.saturating_sub(1)..)?
            .iter()
            .rev()
            .find_map(|&h| a.get(h))
    }

    proptest::proptest! {
        #[test]
        fn reads_an_eighth_and_answers_as_the_full_scan(
            notes in proptest::collection::vec((1usize..300, 0u16..8), 0..12),
            asks in proptest::collection::vec(1usize..300, 1..20),
        ) {
            let a = Affinity::new(1 << 20);
            let chain: Vec<u64> = (1..=300u64)
                .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i)
                .collect();
            // No two blocks of the chain share a word: no anchor is ever lost.
            let mut words: Vec<usize> = chain
                .iter()
                .map(|&h| a.word(h).unwrap() as *const _ as usize)
                .collect();
            words.sort_unstable();
            words.dedup();
            proptest::prop_assume!(words.len() == chain.len());
            for (len, w) in notes {
                a.note(&chain[..len], w);
            }
            for len in asks {
                let (got, want) = (a.lookup(&chain[..len]), full_scan(&a, &chain[..len]));
                proptest::prop_assert_eq!(got, want, "{} blocks", len);
            }
        }
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
