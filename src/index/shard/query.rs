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
//! without decoding anything.

use super::{is_live, slot_of, tier_of, IndexShard, AHEAD};
use crate::index::answer::{Holder, ShardAnswer};
use crate::index::holders::Holders;
use crate::index::mix;

impl IndexShard {
    /// Live holders of `items` — (position, hash) pairs sorted by position, only the
    /// positions this shard owns — appended to `out` (see [`ShardAnswer`]). Sets
    /// `out.first_miss` to the first position with no live holder (scanning stops
    /// there: no prefix can extend past it), or `u32::MAX`. Does not allocate when
    /// `out` has capacity.
    pub fn query(&self, items: &[(u32, u64)], out: &mut ShardAnswer) {
        self.query_by(items.len(), |i| (items[i].0, mix(items[i].1)), out);
    }

    /// [`IndexShard::query`] of a whole request: position `i` is `hashes[i]` (the
    /// one-shard case, without building the `(position, hash)` list).
    pub fn query_seq(&self, hashes: &[u64], out: &mut ShardAnswer) {
        let n = hashes.len().min(u32::MAX as usize);
        self.query_by(n, |i| (i as u32, mix(hashes[i])), out);
    }

    /// The query loop over `len` items, `at(i)` giving item `i`'s position and key
    /// (`i < len`). Each key's home slot is prefetched [`AHEAD`] items before its turn,
    /// a steady pipeline of misses in flight.
    #[inline(always)]
    fn query_by(&self, len: usize, at: impl Fn(usize) -> (u32, u64), out: &mut ShardAnswer) {
        out.first_miss = u32::MAX;
        // One run per position is the worst case of the common one-holder load: room
        // for that up front keeps the pushes below off the growth path.
        out.reserve(len);
        let mut ring = [(0u64, 0usize); AHEAD];
        for (j, r) in ring.iter_mut().enumerate().take(len) {
            let k = at(j).1;
            *r = (k, self.map.prefetch_lookup(k));
        }
        let mut prev = Holders::NONE;
        for i in 0..len {
            let r = &mut ring[i % AHEAD];
            let (k, home) = *r;
            if i + AHEAD < len {
                let k2 = at(i + AHEAD).1;
                *r = (k2, self.map.prefetch_lookup(k2));
            }
            let pos = at(i).0;
            if !self.answer_one(pos, k, home, &mut prev, out) {
                out.first_miss = pos;
                break;
            }
        }
        out.close();
    }

    /// Starts loading what [`IndexShard::answer_one`] of `key` will read; returns the
    /// key's home slot for it.
    #[inline(always)]
    pub(crate) fn prefetch_lookup(&self, key: u64) -> usize {
        self.map.prefetch_lookup(key)
    }

    /// Appends position `pos` (key `key` with home slot `home` from
    /// [`IndexShard::prefetch_lookup`], above every position in `out`) with its live
    /// holders to `out`; `prev` is the raw holder set of the previous position
    /// appended (`Holders::NONE` at first), updated. False (and `out` unchanged) when
    /// nobody holds it.
    #[inline(always)]
    pub(crate) fn answer_one(
        &self,
        pos: u32,
        key: u64,
        home: usize,
        prev: &mut Holders,
        out: &mut ShardAnswer,
    ) -> bool {
        let Some(hs) = self.map.lookup(home, key) else {
            return false;
        };
        if hs == *prev {
            out.repeat_position(pos);
            return true;
        }
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
        *prev = hs;
        true
    }
}
