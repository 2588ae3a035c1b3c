//! The read path of a shard: a query's live holders per position, run-length encoded
//! ([`ShardAnswer`]).
//!
//! Guarantees: positions are answered in the order given, each with its live holders
//! (one per worker, its best tier); scanning stops at the first position nobody holds
//! (`first_miss`); no allocation once the output has capacity.
//!
//! Per position the work is mix + probe + one 8-byte compare in the common case: when a
//! block's raw holder set equals the previous block's (same entries, generations
//! included, so the same live holders), the position just extends the current run
//! without decoding anything. In [`IndexShard::query_seq`] (one shard owns the whole
//! request) the answered positions are `0..n`, so the loop does not even record them:
//! they are written in bulk when a run starts and at the end.

use super::{is_live, slot_of, tier_of, IndexShard};
use crate::index::answer::{Holder, ShardAnswer};
use crate::index::hashmix::mix;
use crate::index::holders::Holders;

/// How many blocks ahead of its probe a query prefetches a block's home slot (a power
/// of two). Why 32 (stores and removes use [`super::AHEAD`], 16): a query's loop body
/// is a few dozen instructions, so 16 blocks ahead is ~300 cycles, less than one DRAM
/// miss; 32 keeps a cold 64-block query's misses overlapped without flooding the miss
/// buffers, and a 64-block query then has half its lines requested before its first
/// probe.
pub(crate) const QUERY_AHEAD: usize = 32;

/// The keys of a query's items in order, each prefetched [`QUERY_AHEAD`] items before
/// its turn: a steady pipeline of misses in flight (the read path's [`super::Ahead`]).
/// Each key is computed once; the ring lives on the stack, and the home slot is
/// recomputed from the key at the probe (as cheap as storing it).
pub(crate) struct QueryRing {
    keys: [u64; QUERY_AHEAD],
}

impl QueryRing {
    /// An empty ring; [`QueryRing::start`] fills it. (Built in place by the caller:
    /// returning a filled ring from a constructor copies it.)
    #[inline(always)]
    pub(crate) fn new() -> QueryRing {
        QueryRing {
            keys: [0; QUERY_AHEAD],
        }
    }

    /// Computes and prefetches the keys of the first [`QUERY_AHEAD`] items.
    #[inline(always)]
    pub(crate) fn start<T>(
        &mut self,
        items: &[T],
        key_of: impl Fn(&T) -> u64,
        prefetch: impl Fn(u64),
    ) {
        for (r, it) in self.keys.iter_mut().zip(items) {
            *r = key_of(it);
            prefetch(*r);
        }
    }

    /// The key of `items[i]`; call with `i = 0, 1, 2, …` in turn, with the same
    /// `items` and functions as [`QueryRing::start`].
    #[inline(always)]
    pub(crate) fn key<T>(
        &mut self,
        items: &[T],
        i: usize,
        key_of: impl Fn(&T) -> u64,
        prefetch: impl Fn(u64),
    ) -> u64 {
        let r = &mut self.keys[i % QUERY_AHEAD];
        let k = *r;
        if let Some(it) = items.get(i + QUERY_AHEAD) {
            *r = key_of(it);
            prefetch(*r);
        }
        k
    }
}

impl IndexShard {
    /// Live holders of `items` — (position, hash) pairs sorted by position, only the
    /// positions this shard owns — appended to `out` (see [`ShardAnswer`]). Sets
    /// `out.first_miss` to the first position with no live holder (scanning stops
    /// there: no prefix can extend past it), or `u32::MAX`. Does not allocate when
    /// `out` has capacity.
    pub fn query(&self, items: &[(u32, u64)], out: &mut ShardAnswer) {
        out.first_miss = u32::MAX;
        // One run per position is the worst case of the common one-holder load: room
        // for that up front keeps the pushes below off the growth path.
        out.reserve(items.len());
        let t = self.map.reader();
        let mut prev = Holders::NONE;
        let key_of = |it: &(u32, u64)| mix(it.1);
        let prefetch = |k| t.prefetch_lookup(k);
        let mut ring = QueryRing::new();
        ring.start(items, key_of, prefetch);
        for (i, &(pos, _)) in items.iter().enumerate() {
            let k = ring.key(items, i, key_of, prefetch);
            if !self.answer_found(pos, t.lookup(k), &mut prev, out) {
                out.first_miss = pos;
                break;
            }
        }
        out.close();
    }

    /// [`IndexShard::query`] of a whole request: position `i` is `hashes[i]` (the
    /// one-shard case, without building the `(position, hash)` list). Positions are
    /// u32 in answers; a request longer than that cannot be cached anyway, so
    /// positions past `u32::MAX` are not queried.
    pub fn query_seq(&self, hashes: &[u64], out: &mut ShardAnswer) {
        let hashes = &hashes[..hashes.len().min(u32::MAX as usize)];
        out.first_miss = u32::MAX;
        out.reserve(hashes.len());
        let t = self.map.reader();
        let mut prev = Holders::NONE;
        // Positions answered so far are `0..answered` (`hashes.len()` until a miss);
        // `out.positions` lags behind and catches up when a run starts.
        let mut answered = hashes.len();
        let key_of = |&h: &u64| mix(h);
        let prefetch = |k| t.prefetch_lookup(k);
        let mut ring = QueryRing::new();
        ring.start(hashes, key_of, prefetch);
        for i in 0..hashes.len() {
            let k = ring.key(hashes, i, key_of, prefetch);
            match t.lookup(k) {
                Some(hs) if hs == prev => {}
                Some(hs) => {
                    out.fill_positions(i as u32);
                    if !self.start_run(i as u32, hs, out) {
                        answered = i;
                        break;
                    }
                    prev = hs;
                }
                None => {
                    answered = i;
                    break;
                }
            }
        }
        if answered < hashes.len() {
            out.first_miss = answered as u32;
        }
        out.fill_positions(answered as u32);
        out.close();
    }

    /// Starts loading what [`IndexShard::answer_one`] of `key` will read.
    #[inline(always)]
    pub(crate) fn prefetch_lookup(&self, key: u64) {
        self.map.reader().prefetch_lookup(key);
    }

    /// Appends position `pos` (key `key`, prefetched with
    /// [`IndexShard::prefetch_lookup`]; above every position in `out`) with its live
    /// holders to `out`; `prev` is the raw holder set of the previous position
    /// appended (`Holders::NONE` at first), updated. False (and `out` unchanged) when
    /// nobody holds it.
    #[inline(always)]
    pub(crate) fn answer_one(
        &self,
        pos: u32,
        key: u64,
        prev: &mut Holders,
        out: &mut ShardAnswer,
    ) -> bool {
        self.answer_found(pos, self.map.reader().lookup(key), prev, out)
    }

    /// [`IndexShard::answer_one`] once the key was looked up: `found` is its raw
    /// holder set, if present (the one-shard loop looks up through a reader it keeps
    /// in registers).
    #[inline(always)]
    fn answer_found(
        &self,
        pos: u32,
        found: Option<Holders>,
        prev: &mut Holders,
        out: &mut ShardAnswer,
    ) -> bool {
        match found {
            Some(hs) if hs == *prev => {
                out.repeat_position(pos);
                true
            }
            Some(hs) => {
                let ok = self.start_run(pos, hs, out);
                if ok {
                    *prev = hs;
                }
                ok
            }
            None => false,
        }
    }

    /// Appends position `pos` (above every position in `out`) whose raw holder set
    /// `hs` differs from the previous position's, with its live holders; false (and
    /// `out` unchanged) when none of them is live. Out of line: the hot loops above
    /// keep only the probe and the compare (and their state in registers).
    #[inline(never)]
    fn start_run(&self, pos: u32, hs: Holders, out: &mut ShardAnswer) -> bool {
        let from = out.holders.len();
        let mut last_slot = u32::MAX;
        for &e in hs.entries(&self.slab) {
            let slot = slot_of(e);
            // Sorted by (slot, tier): the first live entry of a slot is its best.
            if u32::from(slot) != last_slot && is_live(&self.gens, e) {
                last_slot = u32::from(slot);
                out.holders.push(Holder {
                    worker: slot,
                    tier: tier_of(e),
                });
            }
        }
        if out.holders.len() == from {
            return false;
        }
        out.push_position(pos, from);
        true
    }
}
