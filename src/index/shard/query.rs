//! The read path of a shard: a query's live matches, per position.
//!
//! Guarantees: matches come sorted by position, at most one per (position, worker)
//! (the worker's best tier); scanning stops at the first position nobody holds; no
//! allocation once the output has capacity.

use super::{is_live, slot_of, tier_of, IndexShard, CHUNK};
use crate::index::merge::{Match, ShardAnswer};
use crate::index::mix;

impl IndexShard {
    /// Live matches of `items` — (position, hash) pairs sorted by position, only the
    /// positions this shard owns — appended to `out.matches` (sorted by position, at
    /// most one per (position, worker): the worker's best tier). Sets `out.first_miss`
    /// to the first position with no live holder (scanning stops there: no prefix can
    /// extend past it), or `u32::MAX`. Does not allocate when `out` has capacity.
    pub fn query(&self, items: &[(u32, u64)], out: &mut ShardAnswer) {
        self.query_by(
            items.len(),
            |i| (items[i].0, mix(items[i].1)),
            |_| true,
            out,
        );
    }

    /// [`IndexShard::query`] of a whole request: position `i` is `hashes[i]` (the
    /// one-shard case, without building the `(position, hash)` list).
    pub fn query_seq(&self, hashes: &[u64], out: &mut ShardAnswer) {
        let n = hashes.len().min(u32::MAX as usize);
        self.query_by(n, |i| (i as u32, mix(hashes[i])), |_| true, out);
    }

    /// [`IndexShard::query`] with the keys already mixed (`(position, mix(hash))`, as
    /// [`super::ShardedIndex::query`] computes them to pick the shard).
    pub(crate) fn query_keys(&self, items: &[(u32, u64)], out: &mut ShardAnswer) {
        self.query_by(items.len(), |i| items[i], |_| true, out);
    }

    /// The query loop over `len` items, `at(i)` giving item `i`'s position and key;
    /// items whose key fails `own` are skipped. Keys are computed and prefetched
    /// [`CHUNK`] at a time, then looked up.
    #[inline(always)]
    fn query_by(
        &self,
        len: usize,
        at: impl Fn(usize) -> (u32, u64),
        own: impl Fn(u64) -> bool,
        out: &mut ShardAnswer,
    ) {
        out.first_miss = u32::MAX;
        // One match per position is the common case (one holder per block): room for
        // that up front keeps the pushes below off the growth path.
        out.matches.reserve(len);
        let mut keys = [0u64; CHUNK];
        let mut start = 0usize;
        while start < len {
            let n = CHUNK.min(len - start);
            for (j, k) in keys.iter_mut().enumerate().take(n) {
                *k = at(start + j).1;
                if own(*k) {
                    self.map.prefetch(*k);
                }
            }
            for (j, &k) in keys.iter().enumerate().take(n) {
                if !own(k) {
                    continue;
                }
                let pos = at(start + j).0;
                let before = out.matches.len();
                if let Some(i) = self.map.find(k) {
                    let hs = self.map.holders(i);
                    let mut last_slot = u32::MAX;
                    for &e in hs.entries(&self.slab) {
                        let slot = slot_of(e);
                        // Sorted by (slot, tier): the first live entry of a slot is its best.
                        if u32::from(slot) != last_slot && is_live(&self.gens, e) {
                            last_slot = u32::from(slot);
                            out.matches.push(Match {
                                pos,
                                worker: slot,
                                tier: tier_of(e),
                            });
                        }
                    }
                }
                if out.matches.len() == before {
                    out.first_miss = pos;
                    return;
                }
            }
            start += n;
        }
    }
}
