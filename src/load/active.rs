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
//! memory is one 16-byte slot per distinct active (hash, worker) at a load of 1/16 to
//! 1/2 (or the 1 MiB floor), so it is bounded by the hashes of active requests, and
//! the table shrinks again after a burst (`remove`).

use crate::types::WorkerSlot;

/// (worker, number of its active requests holding the hash), one flat-table slot per
/// pair. The count is 32 bits: a common system prompt is held by every active request
/// of a worker, which may exceed 65 535, and a 16-byte slot has room for it.
type Table = crate::index::pending::flat::Table<u32>;

/// Tables at most this large (slots) are never shrunk: 1 MiB, room for 32k active
/// blocks, four of the longest prompts at once (a 120k-token prompt is 7.5k blocks of
/// 16). A smaller floor had the table grow again, in fresh memory the kernel must
/// fault in and zero, whenever two long prompts were in flight: with 256 KiB, ~400
/// page faults and ~1.5 ms inside the decision that applied the update.
const SHRINK_FLOOR: usize = 65536;

/// Active-block reference counts of one index shard.
///
/// Layout: one flat open-addressing table of (hash, worker) → count
/// ([`crate::index::pending::flat`]): an update is one probe per hash in one array,
/// where a map of per-hash worker lists cost a hasher, a control-byte probe, a small
/// vector search and a second probe to delete an emptied key (~150 instructions per
/// hash, and most of the time on cache misses, by `perf`). A large table is
/// read once ahead of each update (`Table::touch`) so the misses overlap.
#[derive(Clone, Debug, Default)]
pub struct ActiveBlocksShard {
    map: Table,
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
        use crate::index::pending::flat::Probe;
        if hashes.is_empty() {
            return;
        }
        self.map.reserve(hashes.len());
        self.map.touch(hashes);
        let mut created = 0u64;
        for &h in hashes {
            match self.map.probe(h, w) {
                Probe::Found(i) => {
                    if let Some(n) = self.map.val_mut(i) {
                        *n = n.saturating_add(1);
                    }
                }
                Probe::Vacant(i) => {
                    self.map.put(i, h, w, 1);
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
        if self.map.is_empty() {
            return;
        }
        self.map.touch(hashes);
        let mut dropped = 0u64;
        for &h in hashes {
            let Some(i) = self.map.find(h, w) else {
                continue;
            };
            let Some(n) = self.map.val_mut(i) else {
                continue;
            };
            *n = n.saturating_sub(1); // n >= 1: entries with a zero count are never kept
            if *n == 0 {
                self.map.remove_at(i);
                dropped += 1;
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

    /// Gives back the room of a past burst: a table that once held many active hashes
    /// keeps its size, and every later lookup lands somewhere in it (a cache miss per
    /// hash once the table outgrows the cache). Shrinks once removals keep finding
    /// fewer than a sixteenth of the slots used (`flat::Table::shrink_if_sparse`);
    /// amortised O(1) per removal.
    fn shrink_if_sparse(&mut self) {
        self.map.shrink_if_sparse(SHRINK_FLOOR);
    }

    /// Drops every reference of worker `w` (worker removed or restarted). Costs one pass
    /// over the shard's entries; it only runs on fleet changes.
    pub fn clear_worker(&mut self, w: WorkerSlot) {
        if self.unique_blocks(w) == 0 {
            return;
        }
        self.map.retain(|_, s, _| s != w);
        self.unique[usize::from(w)] = 0;
        self.shrink_if_sparse();
    }

    /// For the given `(position, hash)` items (positions are ignored here: reuse counts
    /// any active block, not only a prefix), appends one `(worker, count)` per worker
    /// that has at least one of these hashes active, `count` being how many of them it
    /// has. Entries are appended in increasing worker order after whatever `out`
    /// already holds.
    pub fn count_reuse(&self, items: &[(u32, u64)], out: &mut Vec<(WorkerSlot, u32)>) {
        let start = out.len();
        if self.map.is_empty() {
            return;
        }
        self.map.for_each_at(items, |_, w, _| out.push((w, 1)));
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

    /// Distinct active (hash, worker) pairs in this shard.
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
        assert_eq!(s.len(), 5); // (hash, worker) pairs
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
        // Given back once removals keep finding the table sparse.
        for _ in 0..crate::index::pending::flat::SHRINK_AFTER {
            s.add(3, &[9]);
            s.remove(3, &[9]);
        }
        assert!(
            s.map.capacity() <= SHRINK_FLOOR,
            "{} vs {big}",
            s.map.capacity()
        );
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
