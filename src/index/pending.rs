//! Speculative indexing (docs/ROUTING.md "Speculative indexing"): blocks *pending* on a worker.
//!
//! A worker announces a prompt's blocks (`BlockStored`) only once it has computed them,
//! which is a queue wait plus a prefill after the request was routed. Requests sharing
//! a new prefix that arrive in that window would all see overlap 0 and scatter. So once
//! a request is routed, its prompt blocks count as *pending-cached* on the worker doing
//! its prefill, until that worker's events confirm them (`Stored` of the hash), drop
//! them (`Removed` of the hash, any `Cleared`, worker removal) or a TTL
//! (`speculative_ttl_ms`) expires.
//!
//! [`PendingShard`] holds the pending (hash, worker) entries of one index shard (the
//! service keeps one per core, keyed by the same [`shard_of`](super::shard_of) as the
//! index and the active blocks, so a request's lookups go to the same cores).
//! [`speculate`] turns the pending matches of a request into per-worker overlaps: a
//! worker's device run is extended by the pending blocks that continue it.
//!
//! Guarantees:
//! - bounded memory: at most `cap` live entries per shard (the oldest is evicted first
//!   when a new one would pass it), and the queue of insertion batches is compacted
//!   once it holds more than `2 × live + 1024` hashes or `live + 1024` batches, so it
//!   stays O(cap); the table shrinks again after a burst;
//! - an entry is never reported after `added_at + ttl` (queries check the expiry;
//!   [`PendingShard::expire`] reclaims expired entries in insertion order, which is
//!   expiry order because the TTL is one constant and time does not go back);
//! - re-adding a pending (hash, worker) refreshes its expiry and does not count twice
//!   (a hash repeated within one `add` counts once, at its first position);
//! - `ttl == 0` or `cap == 0` disables it: nothing is stored, queries find nothing;
//! - pure: no I/O, time is passed in; no method panics.

use super::merge::MergeResult;
use crate::types::{Overlap, WorkerSlot};
use flat::{Probe, Table};
use std::collections::VecDeque;

pub(crate) mod flat;

/// The value of one pending (hash, worker) entry.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    /// The batch (one `add` call) that inserted or last refreshed it.
    seq: u32,
    expires_us: u64,
}

/// The hashes of one `add` call, in the order they were added. All its entries share
/// one expiry, so batches expire in queue order.
#[derive(Clone, Copy, Debug)]
struct Batch {
    worker: WorkerSlot,
    expires_us: u64,
    /// Its hashes still in `ring` (the batch's segment, in queue order).
    len: u32,
    /// Live entries whose `seq` names this batch. A batch whose entries were all
    /// confirmed, dropped or refreshed is discarded without looking its hashes up.
    live: u32,
}

/// What happened to pending entries (for metrics): cumulative counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingStats {
    /// Entries created (refreshes not counted).
    pub added: u64,
    /// Entries a `Stored` event of their worker confirmed.
    pub confirmed: u64,
    /// Entries that reached their TTL unconfirmed.
    pub expired: u64,
    /// Entries evicted by the cap before their TTL.
    pub evicted: u64,
    /// Entries dropped by a `Removed`/`Cleared` event or the worker's removal.
    pub dropped: u64,
}

/// Tables at most this large (slots) are never shrunk: 2 MiB, room for 32k pending
/// blocks (four of the longest prompts at once: a 120k-token prompt is 7.5k blocks of
/// 16). A smaller floor had the table grow and shrink again with long prompts, each
/// time in fresh memory the kernel must fault in and zero.
const SHRINK_FLOOR: usize = 65536;

/// The pending blocks of one shard. See the module docs.
///
/// Layout: one flat table of (hash, worker) entries ([`flat::Table`]), and a FIFO of
/// batches (one per `add`) whose hashes sit back to back in `ring`. An entry names its
/// batch by a sequence number (`seq - base` is the batch's queue index), so removing
/// an entry keeps its batch's live count right, and expiry or eviction only looks up
/// the hashes of batches that still have live entries: a routed request's batch that
/// its finish dropped costs nothing more.
#[derive(Clone, Debug)]
pub struct PendingShard {
    ttl_us: u64,
    cap: usize,
    table: Table<Entry>,
    batches: VecDeque<Batch>,
    ring: VecDeque<u64>,
    /// `seq` of `batches[0]` (wrapping; far fewer than 2³² batches are ever queued).
    base: u32,
    live: usize,
    stats: PendingStats,
}

impl PendingShard {
    /// A shard whose entries live `ttl_us` and of which at most `cap` are kept.
    pub fn new(ttl_us: u64, cap: usize) -> Self {
        PendingShard {
            ttl_us,
            cap,
            table: Table::default(),
            batches: VecDeque::new(),
            ring: VecDeque::new(),
            base: 0,
            live: 0,
            stats: PendingStats::default(),
        }
    }

    /// False when the TTL or the cap is 0 (speculative indexing off).
    pub fn enabled(&self) -> bool {
        self.ttl_us > 0 && self.cap > 0
    }

    /// Live entries (some may be past their TTL until the next [`Self::expire`]).
    pub fn len(&self) -> usize {
        self.live
    }

    /// No live entry.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Cumulative counts.
    pub fn stats(&self) -> PendingStats {
        self.stats
    }

    /// Hashes held in the batch queue (live or stale; for the memory-bound tests).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.ring.len()
    }

    /// Queue index of batch `seq`.
    #[inline]
    fn batch_index(&self, seq: u32) -> usize {
        seq.wrapping_sub(self.base) as usize
    }

    /// One live entry of batch `seq` is gone.
    #[inline]
    fn unlive(&mut self, seq: u32) {
        let i = self.batch_index(seq);
        if let Some(b) = self.batches.get_mut(i) {
            b.live = b.live.saturating_sub(1);
        }
    }

    /// `hashes` were routed to `worker` at `now_us`: they are pending there until
    /// `now_us + ttl`.
    pub fn add(&mut self, worker: WorkerSlot, hashes: &[u64], now_us: u64) {
        if !self.enabled() {
            return;
        }
        self.expire(now_us);
        if hashes.is_empty() {
            return;
        }
        let expires_us = now_us.saturating_add(self.ttl_us);
        let seq = self.base.wrapping_add(self.batches.len() as u32);
        self.batches.push_back(Batch {
            worker,
            expires_us,
            len: 0,
            live: 0,
        });
        // Room for every hash up front (the live entries never pass the cap), so the
        // table does not grow between a probe and its insert.
        self.table.reserve(hashes.len().min(self.cap));
        self.table.touch(hashes);
        for &hash in hashes {
            match self.table.probe(hash, worker) {
                Probe::Found(i) => {
                    let Some(e) = self.table.val_mut(i) else {
                        continue;
                    };
                    if e.seq == seq {
                        continue; // repeated within this call
                    }
                    let old = e.seq;
                    *e = Entry { seq, expires_us };
                    self.unlive(old);
                }
                Probe::Vacant(mut i) => {
                    // An eviction shifts probe runs and a growth moves everything:
                    // probe again only then.
                    let mut moved = false;
                    while self.live >= self.cap {
                        if !self.evict_oldest() {
                            break;
                        }
                        moved = true;
                    }
                    let slots = self.table.capacity();
                    self.table.reserve(1);
                    if moved || slots != self.table.capacity() {
                        match self.table.probe(hash, worker) {
                            Probe::Vacant(j) => i = j,
                            Probe::Found(_) => continue, // an eviction cannot add it
                        }
                    }
                    self.table.put(i, hash, worker, Entry { seq, expires_us });
                    self.live += 1;
                    self.stats.added += 1;
                }
            }
            if let Some(b) = self.batches.back_mut() {
                b.live += 1;
                b.len += 1;
            }
            self.ring.push_back(hash);
        }
        self.compact();
    }

    /// Reclaims every entry whose TTL has passed at `now_us`.
    pub fn expire(&mut self, now_us: u64) {
        while let Some(b) = self.batches.front().copied() {
            if b.live > 0 {
                if b.expires_us > now_us {
                    return;
                }
                let seq = self.base;
                for k in 0..b.len as usize {
                    let Some(&h) = self.ring.get(k) else { break };
                    if self.remove_of_batch(h, b.worker, seq) {
                        self.stats.expired += 1;
                    }
                }
            }
            self.pop_front_batch();
        }
        self.table.shrink_if_sparse(SHRINK_FLOOR);
    }

    /// Removes `worker`'s entry for `hash` if batch `seq` still owns it (a later batch
    /// that refreshed it owns it now); true when removed. The caller counts why.
    fn remove_of_batch(&mut self, hash: u64, worker: WorkerSlot, seq: u32) -> bool {
        let Some(i) = self.table.find(hash, worker) else {
            return false;
        };
        if self.table.val_mut(i).is_none_or(|e| e.seq != seq) {
            return false;
        }
        self.table.remove_at(i);
        self.live -= 1;
        true
    }

    /// Discards the front batch and its queued hashes (its live entries must be gone).
    fn pop_front_batch(&mut self) {
        if let Some(b) = self.batches.pop_front() {
            let n = (b.len as usize).min(self.ring.len());
            self.ring.drain(..n);
            self.base = self.base.wrapping_add(1);
        }
    }

    /// Removes the oldest live entry (for the cap). True when an entry was removed.
    /// The batch being added (the back) is never discarded, only its entries evicted.
    fn evict_oldest(&mut self) -> bool {
        loop {
            let Some(b) = self.batches.front().copied() else {
                return false;
            };
            if b.live == 0 || b.len == 0 {
                if self.batches.len() == 1 {
                    return false;
                }
                self.pop_front_batch();
                continue;
            }
            let seq = self.base;
            let Some(h) = self.ring.pop_front() else {
                return false;
            };
            if let Some(front) = self.batches.front_mut() {
                front.len -= 1;
            }
            if self.remove_of_batch(h, b.worker, seq) {
                self.unlive(seq);
                self.stats.evicted += 1;
                return true;
            }
        }
    }

    /// Drops stale queued hashes and emptied batches once the queue outgrows the live
    /// entries (`2 × live + 1024` hashes or `live + 1024` batches), renumbering the
    /// batches that stay: O(queue), amortised O(1) per added hash.
    fn compact(&mut self) {
        if self.ring.len() <= 2 * self.live + 1024 && self.batches.len() <= self.live + 1024 {
            return;
        }
        let old_batches = std::mem::take(&mut self.batches);
        let old_ring = std::mem::take(&mut self.ring);
        let mut at = 0usize;
        // The kept batches are renumbered from the same base.
        let new_base = self.base;
        for (k, b) in old_batches.iter().enumerate() {
            let seq = self.base.wrapping_add(k as u32);
            let segment = old_ring.range(at..(at + b.len as usize).min(old_ring.len()));
            at += b.len as usize;
            if b.live == 0 {
                continue;
            }
            let new_seq = new_base.wrapping_add(self.batches.len() as u32);
            let mut kept = Batch {
                len: 0,
                live: 0,
                ..*b
            };
            for &h in segment {
                let Some(i) = self.table.find(h, b.worker) else {
                    continue;
                };
                if let Some(e) = self.table.val_mut(i).filter(|e| e.seq == seq) {
                    e.seq = new_seq;
                    kept.len += 1;
                    kept.live += 1;
                    self.ring.push_back(h);
                }
            }
            if kept.live > 0 {
                self.batches.push_back(kept);
            }
        }
    }

    /// Removes `worker`'s entries for `hashes`; returns how many there were.
    fn remove(&mut self, worker: WorkerSlot, hashes: &[u64]) -> u64 {
        if self.live == 0 {
            return 0;
        }
        self.table.touch(hashes);
        let mut n = 0;
        for &h in hashes {
            if let Some(e) = self.table.take(h, worker) {
                self.unlive(e.seq);
                n += 1;
            }
        }
        self.live -= n as usize;
        self.compact();
        // Batches emptied at the front go now (their hashes need no lookup).
        while self.batches.front().is_some_and(|b| b.live == 0) {
            self.pop_front_batch();
        }
        self.table.shrink_if_sparse(SHRINK_FLOOR);
        n
    }

    /// `worker` stored `hashes` (any tier): they are cached for real now.
    pub fn confirm(&mut self, worker: WorkerSlot, hashes: &[u64]) {
        let n = self.remove(worker, hashes);
        self.stats.confirmed += n;
    }

    /// `worker` removed `hashes`: they are not pending there any more.
    pub fn drop_hashes(&mut self, worker: WorkerSlot, hashes: &[u64]) {
        let n = self.remove(worker, hashes);
        self.stats.dropped += n;
    }

    /// Drops every entry of `worker` (a `Cleared` event, the worker's removal or a new
    /// epoch). O(table size).
    pub fn clear_worker(&mut self, worker: WorkerSlot) {
        if self.live == 0 {
            return;
        }
        let mut gone = Vec::new();
        self.table.retain(|_, w, e| {
            if w == worker {
                gone.push(e.seq);
                false
            } else {
                true
            }
        });
        for &seq in &gone {
            self.unlive(seq);
        }
        self.live -= gone.len();
        self.stats.dropped += gone.len() as u64;
        while self.batches.front().is_some_and(|b| b.live == 0) {
            self.pop_front_batch();
        }
        self.compact();
    }

    /// Appends `(position, worker)` for every item pending (unexpired at `now_us`).
    pub fn query(&self, items: &[(u32, u64)], now_us: u64, out: &mut Vec<(u32, WorkerSlot)>) {
        if self.live == 0 {
            return;
        }
        self.table.for_each_at(items, |pos, w, e| {
            if e.expires_us > now_us {
                out.push((pos, w));
            }
        });
    }
}

/// One worker's overlap with the pending blocks counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speculated {
    pub worker: WorkerSlot,
    /// The overlap to score: the device run extended by `speculative` blocks.
    pub overlap: Overlap,
    /// Blocks of `overlap.device` that are only pending (not yet confirmed).
    pub speculative: u32,
}

/// `o` with its device run `spec` blocks longer: the host, disk and shared runs lose
/// the positions the longer device run now covers.
pub fn extend_device(o: Overlap, spec: u32) -> Overlap {
    let dev = o.device.saturating_add(spec);
    let host_end = o.device.saturating_add(o.host);
    let own_end = host_end.saturating_add(o.disk);
    let shared_end = own_end.saturating_add(o.shared);
    let new_own_end = own_end.max(dev);
    Overlap {
        device: dev,
        host: host_end.saturating_sub(dev),
        disk: own_end.saturating_sub(dev.max(host_end)),
        shared: shared_end.saturating_sub(new_own_end),
    }
}

/// Per-worker overlaps with pending blocks: for each worker with pending matches, the
/// pending positions that continue its device run from `merged` (consecutively from
/// its end) become speculative device blocks. `matches` (any order, duplicates
/// allowed) is sorted in place; workers gaining nothing are left out of `out`.
pub fn speculate(
    merged: &MergeResult,
    matches: &mut [(u32, WorkerSlot)],
    out: &mut Vec<Speculated>,
) {
    out.clear();
    matches.sort_unstable_by_key(|&(p, w)| (w, p));
    let mut i = 0;
    while i < matches.len() {
        let w = matches[i].1;
        let j = i + matches[i..].partition_point(|&(_, x)| x == w);
        let group = &matches[i..j];
        let base = merged.get(w);
        let start = base.device;
        if let Ok(k) = group.binary_search_by_key(&start, |&(p, _)| p) {
            let mut next = start;
            for &(p, _) in &group[k..] {
                if p == next {
                    next += 1;
                } else if p > next {
                    break;
                }
            }
            let spec = next - start;
            if spec > 0 {
                out.push(Speculated {
                    worker: w,
                    overlap: extend_device(base, spec),
                    speculative: spec,
                });
            }
        }
        i = j;
    }
}

#[cfg(test)]
mod tests;
