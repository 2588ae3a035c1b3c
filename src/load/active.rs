//! Blocks held by active requests, per worker, for `assume_kv_reuse` (DESIGN §1
//! "Cost": blocks already held by a worker's active requests are not counted twice).
//!
//! The service keeps one shard per index shard, keyed by the same sequence hashes, so
//! a request's hashes are routed to the same shards as its index lookups. Each shard
//! maps a hash to the workers whose active requests hold it, with a reference count per
//! (hash, worker): two active requests on a worker sharing a prefix count it twice, and
//! the block stays "active" until both finish.
//!
//! Guarantees: `remove` of something never added is a no-op and counts never
//! underflow; `add` and `remove` cost O(hashes) (plus the few workers sharing a hash);
//! memory is one map entry per distinct active hash with its worker list inline for up
//! to two workers (24 bytes), so it is bounded by the hashes of active requests, and
//! the table shrinks again after a burst (`remove`).

use crate::types::WorkerSlot;
use smallvec::SmallVec;

/// Keys are block sequence hashes, already uniform 64-bit values: one `mix` (a
/// bijective finaliser, ~1 ns) spreads them as well as a keyed hasher would, and made
/// `active_blocks/add_remove` ~13 % faster than ahash (27.4–27.8 vs 23.8–24.9 M ops/s,
/// old and new bench binaries run alternately; `cargo bench --bench load`).
/// Like the block index, which stores `mix`ed hashes too, this trades resistance to
/// crafted collisions for speed: hashes come from authenticated workers and frontends.
type Map<K, V> = hashbrown::HashMap<K, V, MixState>;

/// [`std::hash::BuildHasher`] of [`Map`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MixState;

/// Hasher of one `u64` key (other writes fold in byte by byte; unused here).
#[derive(Clone, Copy, Debug, Default)]
pub struct MixHasher(u64);

impl std::hash::BuildHasher for MixState {
    type Hasher = MixHasher;
    #[inline]
    fn build_hasher(&self) -> MixHasher {
        MixHasher(0)
    }
}

impl std::hash::Hasher for MixHasher {
    #[inline]
    fn finish(&self) -> u64 {
        crate::index::mix(self.0)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 ^= x;
    }
}

/// (worker, number of its active requests holding the hash). The count is 32 bits: a
/// common system prompt is held by every active request of a worker, which may exceed
/// 65 535, and with two inline entries a wider count costs no extra memory.
type Holders = SmallVec<[(WorkerSlot, u32); 2]>;

/// Tables at most this large are never shrunk (they stay in cache anyway).
const SHRINK_FLOOR: usize = 4096;

/// Active-block reference counts of one index shard.
#[derive(Clone, Debug, Default)]
pub struct ActiveBlocksShard {
    map: Map<u64, Holders>,
    /// Distinct active hashes per worker slot (grown on demand).
    unique: Vec<u64>,
}

impl ActiveBlocksShard {
    /// An empty shard.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one reference of worker `w` to each hash (a hash repeated in `hashes` gets
    /// one reference per occurrence).
    pub fn add(&mut self, w: WorkerSlot, hashes: &[u64]) {
        let mut created = 0u64;
        for &h in hashes {
            let holders = self.map.entry(h).or_default();
            match holders.iter_mut().find(|(s, _)| *s == w) {
                Some((_, n)) => *n = n.saturating_add(1),
                None => {
                    holders.push((w, 1));
                    created += 1;
                }
            }
        }
        if created > 0 {
            let i = usize::from(w);
            if self.unique.len() <= i {
                self.unique.resize(i + 1, 0);
            }
            self.unique[i] += created;
        }
    }

    /// Removes one reference of worker `w` from each hash. References that do not exist
    /// are ignored (no underflow).
    pub fn remove(&mut self, w: WorkerSlot, hashes: &[u64]) {
        let mut dropped = 0u64;
        for &h in hashes {
            let Some(holders) = self.map.get_mut(&h) else {
                continue;
            };
            let Some(pos) = holders.iter().position(|(s, _)| *s == w) else {
                continue;
            };
            let n = &mut holders[pos].1;
            *n -= 1; // n >= 1: entries with a zero count are never kept
            if *n == 0 {
                holders.swap_remove(pos);
                dropped += 1;
                if holders.is_empty() {
                    self.map.remove(&h);
                }
            }
        }
        if dropped > 0 {
            if let Some(u) = self.unique.get_mut(usize::from(w)) {
                debug_assert!(*u >= dropped, "unique block count underflow");
                *u = u.saturating_sub(dropped);
            }
            self.shrink_if_sparse();
        }
    }

    /// Gives back the room of a past burst: a map that once held many active hashes
    /// keeps its table, and every later lookup lands somewhere in it (a cache miss per
    /// hash once the table outgrows the cache). Shrinks to twice the live entries when
    /// fewer than an eighth of the room is used; amortised O(1) per removal (the live
    /// count must fall fourfold again before the next shrink).
    fn shrink_if_sparse(&mut self) {
        let cap = self.map.capacity();
        if cap > SHRINK_FLOOR && self.map.len() * 8 < cap {
            self.map
                .shrink_to((self.map.len() * 2).max(SHRINK_FLOOR / 2));
        }
    }

    /// Drops every reference of worker `w` (worker removed or restarted). Costs one pass
    /// over the shard's entries; it only runs on fleet changes.
    pub fn clear_worker(&mut self, w: WorkerSlot) {
        if self.unique_blocks(w) == 0 {
            return;
        }
        self.map.retain(|_, holders| {
            holders.retain(|(s, _)| *s != w);
            !holders.is_empty()
        });
        self.unique[usize::from(w)] = 0;
    }

    /// For the given `(position, hash)` items (positions are ignored here: reuse counts
    /// any active block, not only a prefix), appends one `(worker, count)` per worker
    /// that has at least one of these hashes active, `count` being how many of them it
    /// has. Entries are appended in increasing worker order after whatever `out`
    /// already holds.
    pub fn count_reuse(&self, items: &[(u32, u64)], out: &mut Vec<(WorkerSlot, u32)>) {
        let start = out.len();
        for (_, h) in items {
            if let Some(holders) = self.map.get(h) {
                out.extend(holders.iter().map(|&(w, _)| (w, 1)));
            }
        }
        // Merge the per-hit entries into one per worker: O(hits · log hits).
        let hits = &mut out[start..];
        hits.sort_unstable_by_key(|&(w, _)| w);
        let mut write = start;
        for read in start..out.len() {
            let (w, c) = out[read];
            if write > start && out[write - 1].0 == w {
                out[write - 1].1 = out[write - 1].1.saturating_add(c);
            } else {
                out[write] = (w, c);
                write += 1;
            }
        }
        out.truncate(write);
    }

    /// Distinct active hashes of worker `w` in this shard.
    pub fn unique_blocks(&self, w: WorkerSlot) -> u64 {
        self.unique.get(usize::from(w)).copied().unwrap_or(0)
    }

    /// Distinct active hashes in this shard (any worker).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no block is active.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reuse(s: &ActiveBlocksShard, hashes: &[u64]) -> Vec<(WorkerSlot, u32)> {
        let items: Vec<(u32, u64)> = hashes
            .iter()
            .enumerate()
            .map(|(i, &h)| (i as u32, h))
            .collect();
        let mut out = vec![(999, 999)]; // pre-existing content is preserved
        s.count_reuse(&items, &mut out);
        assert_eq!(out[0], (999, 999));
        out.remove(0);
        out
    }

    #[test]
    fn refcounts_per_hash_and_worker() {
        let mut s = ActiveBlocksShard::new();
        s.add(1, &[10, 11, 12]);
        s.add(1, &[10, 11]); // second request sharing a prefix
        s.add(2, &[10, 20]);
        assert_eq!(s.unique_blocks(1), 3);
        assert_eq!(s.unique_blocks(2), 2);
        assert_eq!(s.unique_blocks(3), 0);
        assert_eq!(s.len(), 4);
        assert_eq!(reuse(&s, &[10, 11, 12, 13]), vec![(1, 3), (2, 1)]);

        s.remove(1, &[10, 11, 12]);
        // Still held by the second request of worker 1.
        assert_eq!(s.unique_blocks(1), 2);
        assert_eq!(reuse(&s, &[10, 11, 12, 13]), vec![(1, 2), (2, 1)]);
        s.remove(1, &[10, 11]);
        assert_eq!(s.unique_blocks(1), 0);
        assert_eq!(reuse(&s, &[10, 11, 12, 20]), vec![(2, 2)]);
        s.remove(2, &[10, 20]);
        assert!(s.is_empty());
        assert_eq!(s.unique_blocks(2), 0);
    }

    #[test]
    fn table_shrinks_after_a_burst() {
        let mut s = ActiveBlocksShard::new();
        let burst: Vec<u64> = (0..100_000).collect();
        s.add(1, &burst);
        let big = s.map.capacity();
        s.add(2, &[7, 1_000_000]);
        s.remove(1, &burst);
        assert!(s.map.capacity() < big / 8, "{} vs {big}", s.map.capacity());
        assert_eq!(reuse(&s, &[7, 1_000_000, 5]), vec![(2, 2)]);
        assert_eq!(s.unique_blocks(2), 2);
        assert_eq!(s.unique_blocks(1), 0);
    }

    #[test]
    fn remove_missing_is_noop() {
        let mut s = ActiveBlocksShard::new();
        s.remove(4, &[1, 2, 3]); // unknown worker, unknown hashes
        s.add(4, &[1]);
        s.remove(5, &[1]); // hash held by another worker
        s.remove(4, &[2]); // worker holds other hashes
        assert_eq!(s.unique_blocks(4), 1);
        s.remove(4, &[1, 1, 1]); // more removes than adds
        assert_eq!(s.unique_blocks(4), 0);
        assert!(s.is_empty());
        s.add(4, &[1]);
        assert_eq!(reuse(&s, &[1]), vec![(4, 1)]);
    }

    #[test]
    fn duplicate_hashes_in_one_call_are_counted_per_occurrence() {
        let mut s = ActiveBlocksShard::new();
        s.add(0, &[7, 7]);
        assert_eq!(s.unique_blocks(0), 1);
        s.remove(0, &[7]);
        assert_eq!(s.unique_blocks(0), 1);
        s.remove(0, &[7]);
        assert_eq!(s.unique_blocks(0), 0);
    }

    #[test]
    fn clear_worker_drops_only_that_worker() {
        let mut s = ActiveBlocksShard::new();
        s.add(1, &[1, 2, 3]);
        s.add(1, &[1, 2]);
        s.add(2, &[2, 3, 4]);
        s.add(3, &[5]);
        s.clear_worker(1);
        assert_eq!(s.unique_blocks(1), 0);
        assert_eq!(s.unique_blocks(2), 3);
        assert_eq!(reuse(&s, &[1, 2, 3, 4, 5]), vec![(2, 3), (3, 1)]);
        assert_eq!(s.len(), 4);
        // Removing the cleared worker's old requests afterwards is harmless.
        s.remove(1, &[1, 2, 3]);
        assert_eq!(s.unique_blocks(2), 3);
        s.clear_worker(9); // unknown slot
        assert_eq!(s.len(), 4);
    }

    #[test]
    fn count_reuse_many_workers_sorted_and_merged() {
        let mut s = ActiveBlocksShard::new();
        for w in (0..40u16).rev() {
            // worker w holds hashes 0..=w
            let hs: Vec<u64> = (0..=u64::from(w)).collect();
            s.add(w, &hs);
        }
        let got = reuse(&s, &[0, 5, 10, 1000]);
        let expect: Vec<(WorkerSlot, u32)> = (0..40u16)
            .map(|w| (w, [0, 5, 10].iter().filter(|&&h| h <= w).count() as u32))
            .collect();
        assert_eq!(got, expect);
        assert!(reuse(&s, &[]).is_empty());
        assert!(reuse(&s, &[5000]).is_empty());
    }
}
