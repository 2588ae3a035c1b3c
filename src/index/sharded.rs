//! [`ShardedIndex`]: all shards of the index in one process.
//!
//! The service gives each core its own [`IndexShard`] and moves hashes between cores
//! through queues; this type does the same routing synchronously, so the in-process
//! engine, the tests and the benches exercise exactly the code paths of the service:
//! every hash goes to [`shard_of`], every query is scattered, answered per shard and
//! [`merge`]d. Like the service's, its shards share one [`Budget`], so a worker's cap
//! is exact over all shards.

use super::answer::ShardAnswer;
use super::hashmix::{mix, shard_of, MAX_SHARD_BITS};
use super::holders::Holders;
use super::merge::{merge, MergeResult};
use super::shard::{IndexShard, QueryRing, ShardStats, StoreOutcome};
use super::Budget;
use crate::types::{Tier, WorkerSlot, MAX_WORKER_SLOTS};
use std::sync::Arc;

/// Every shard of the index, with hash routing. See the module docs.
#[derive(Debug)]
pub struct ShardedIndex {
    /// `1 << shard_bits` shards; shard `i` owns the hashes with `shard_of(h) == i`.
    pub shards: Vec<IndexShard>,
    pub shard_bits: u32,
    /// Per-shard scatter buffer of the mutating operations.
    buf: Vec<Vec<u64>>,
}

impl ShardedIndex {
    /// An empty index of `1 << shard_bits` shards (`shard_bits` clamped to
    /// [`MAX_SHARD_BITS`]).
    pub fn new(shard_bits: u32) -> Self {
        let shard_bits = shard_bits.min(MAX_SHARD_BITS);
        let n = 1usize << shard_bits;
        let mut idx = ShardedIndex {
            shards: (0..n).map(|_| IndexShard::new()).collect(),
            shard_bits,
            buf: vec![Vec::new(); n],
        };
        idx.attach_budget();
        idx
    }

    /// One [`Budget`] for every shard: exact per-worker caps, no global limit.
    fn attach_budget(&mut self) {
        let b = Arc::new(Budget::new(MAX_WORKER_SLOTS, u64::MAX));
        for s in &mut self.shards {
            s.attach_budget(b.clone());
        }
    }

    /// An empty index of `count` shards; `None` unless `count` is a power of two no
    /// larger than `1 << MAX_SHARD_BITS`.
    pub fn with_shards(count: usize) -> Option<Self> {
        if count.is_power_of_two() && count <= 1 << MAX_SHARD_BITS {
            Some(Self::new(count.trailing_zeros()))
        } else {
            None
        }
    }

    /// An index whose shards use test limits (see `IndexShard::with_limits`).
    #[cfg(test)]
    pub(crate) fn with_limits(shard_bits: u32, period: u32, floor: u64) -> Self {
        let mut s = Self::new(shard_bits);
        for sh in &mut s.shards {
            *sh = IndexShard::with_limits(period, floor);
        }
        s.attach_budget();
        s
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Caps worker `w` at exactly `total_cap` (block, tier) entries over all shards
    /// (the shards share one [`Budget`]; a store is applied shard by shard, so when the
    /// cap binds, the hashes of lower shards get in first).
    pub fn set_worker_cap(&mut self, w: WorkerSlot, total_cap: u64) {
        for s in &mut self.shards {
            s.set_worker_cap(w, total_cap);
        }
    }

    /// Groups `hashes` by owning shard into `self.buf` (order kept within a shard).
    fn scatter(&mut self, hashes: &[u64]) {
        for b in &mut self.buf {
            b.clear();
        }
        for &h in hashes {
            self.buf[shard_of(h, self.shard_bits)].push(h);
        }
    }

    /// Worker `w` now holds `hashes` in `tier`.
    pub fn stored(&mut self, w: WorkerSlot, tier: Tier, hashes: &[u64]) -> StoreOutcome {
        if self.shards.len() == 1 {
            return self.shards[0].stored(w, tier, hashes);
        }
        self.scatter(hashes);
        let mut out = StoreOutcome::default();
        for (s, b) in self.shards.iter_mut().zip(&self.buf) {
            out += s.stored(w, tier, b);
        }
        out
    }

    /// Worker `w` no longer holds `hashes` in `tier`; returns the entries removed.
    pub fn removed(&mut self, w: WorkerSlot, tier: Tier, hashes: &[u64]) -> u32 {
        if self.shards.len() == 1 {
            return self.shards[0].removed(w, tier, hashes);
        }
        self.scatter(hashes);
        let mut n = 0u32;
        for (s, b) in self.shards.iter_mut().zip(&self.buf) {
            n = n.saturating_add(s.removed(w, tier, b));
        }
        n
    }

    /// Drops every block of `w` in `tier` (O(shards)).
    pub fn clear_tier(&mut self, w: WorkerSlot, tier: Tier) {
        for s in &mut self.shards {
            s.clear_tier(w, tier);
        }
    }

    /// Drops every block of `w` (O(shards)); also to be called when a slot is freed.
    pub fn clear_worker(&mut self, w: WorkerSlot) {
        for s in &mut self.shards {
            s.clear_worker(w);
        }
    }

    /// Per-worker overlaps of the request with sequence hashes `hashes`, into `out`.
    /// Looks each position up in its shard (in position order, up to the first
    /// position nobody holds) and merges the shards' answers. Allocation-free once `out` has grown.
    pub fn query(
        &self,
        hashes: &[u64],
        is_shared: impl Fn(WorkerSlot) -> bool,
        out: &mut MergeResult,
    ) {
        let mut sc = std::mem::take(&mut out.scratch);
        let n = self.shards.len();
        sc.answers.resize_with(n, Default::default);
        if n == 1 {
            // One shard owns every position: no scatter.
            let a = &mut sc.answers[0];
            a.clear();
            self.shards[0].query_seq(hashes, a);
        } else {
            // One pass over the request, each position looked up in its own shard's
            // table: one prefetch pipeline over all positions (per-shard lists would
            // restart it cold in every shard), no `(position, key)` lists, and the
            // key is mixed once, for the shard (its top bits, `shard_of`) and the
            // lookup. The first position nobody holds ends the pass: no prefix can
            // extend past it. Positions are u32 in answers; a request longer than that
            // cannot be cached anyway, so positions past u32::MAX are not queried.
            let len = hashes.len().min(u32::MAX as usize);
            for a in &mut sc.answers {
                a.clear();
                a.reserve(len);
            }
            let shift = 64 - self.shard_bits.clamp(1, MAX_SHARD_BITS);
            let hashes = &hashes[..len];
            // Two and four shards (the service's usual layouts) with arrays, whose
            // masked indexing needs no bounds checks; any other count with slices.
            if let (Ok(sh), Ok(an)) = (
                <&[IndexShard; 2]>::try_from(&self.shards[..]),
                <&mut [ShardAnswer; 2]>::try_from(&mut sc.answers[..n]),
            ) {
                one_pass(sh, an, &mut [Holders::NONE; 2], hashes, shift);
            } else if let (Ok(sh), Ok(an)) = (
                <&[IndexShard; 4]>::try_from(&self.shards[..]),
                <&mut [ShardAnswer; 4]>::try_from(&mut sc.answers[..n]),
            ) {
                one_pass(sh, an, &mut [Holders::NONE; 4], hashes, shift);
            } else {
                sc.prevs.clear();
                sc.prevs.resize(n, Holders::NONE);
                one_pass(
                    &self.shards[..],
                    &mut sc.answers[..n],
                    &mut sc.prevs[..],
                    hashes,
                    shift,
                );
            }
        }
        merge(hashes.len(), &sc.answers[..n], is_shared, out);
        out.scratch = sc;
    }

    /// Live (block, tier) entries of worker `w`, over all shards.
    pub fn worker_blocks(&self, w: WorkerSlot) -> u64 {
        self.shards.iter().map(|s| s.worker_blocks(w)).sum()
    }

    /// Stats summed over shards.
    pub fn stats(&self) -> ShardStats {
        let mut st = ShardStats::default();
        for s in &self.shards {
            st += s.stats();
        }
        st
    }
}

/// The one pass of [`ShardedIndex::query`] over several shards: position `i` (key
/// `mix(hashes[i])`) is looked up in shard `key >> shift` and appended to that shard's
/// answer; `prevs` holds each shard's last raw holder set. `shards`, `answers` and
/// `prevs` have one entry per shard (arrays for a fixed count, so indexing them with a
/// masked shard number needs no bounds check).
#[inline(always)]
fn one_pass<S, A, P>(shards: &S, answers: &mut A, prevs: &mut P, hashes: &[u64], shift: u32)
where
    S: AsRef<[IndexShard]> + std::ops::Index<usize, Output = IndexShard> + ?Sized,
    A: AsMut<[ShardAnswer]> + std::ops::IndexMut<usize, Output = ShardAnswer> + ?Sized,
    P: AsMut<[Holders]> + std::ops::IndexMut<usize, Output = Holders> + ?Sized,
{
    let n = shards.as_ref().len();
    if n == 0 || answers.as_mut().len() < n || prevs.as_mut().len() < n || !n.is_power_of_two() {
        return;
    }
    let mask = n - 1;
    let lane = |k: u64| (k >> shift) as usize & mask;
    let key_of = |&h: &u64| mix(h);
    let prefetch = |k| shards[lane(k)].prefetch_lookup(k);
    let mut ring = QueryRing::new();
    ring.start(hashes, key_of, prefetch);
    for i in 0..hashes.len() {
        let k = ring.key(hashes, i, key_of, prefetch);
        let s = lane(k);
        if !shards[s].answer_one(i as u32, k, &mut prevs[s], &mut answers[s]) {
            answers[s].first_miss = i as u32;
            break;
        }
    }
    for a in answers.as_mut() {
        a.close();
    }
}
