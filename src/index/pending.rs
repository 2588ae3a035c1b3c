//! Speculative indexing (issue 15 item 5): blocks *pending* on a worker.
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
//!   when a new one would pass it), and the queue of insertion records is compacted
//!   once it holds more than `2 × live + 1024` records, so it stays O(cap);
//! - an entry is never reported after `added_at + ttl` (queries check the expiry;
//!   [`PendingShard::expire`] reclaims expired entries in insertion order, which is
//!   expiry order because the TTL is one constant and time does not go back);
//! - re-adding a pending (hash, worker) refreshes its expiry and does not count twice;
//! - `ttl == 0` or `cap == 0` disables it: nothing is stored, queries find nothing;
//! - pure: no I/O, time is passed in; no method panics.

use super::merge::MergeResult;
use crate::types::{Overlap, WorkerSlot};
use smallvec::SmallVec;
use std::collections::VecDeque;

/// One pending (hash, worker) entry.
#[derive(Clone, Copy, Debug)]
struct Entry {
    worker: WorkerSlot,
    /// Insertion stamp; a queue record naming another stamp is stale.
    seq: u64,
    expires_us: u64,
}

/// One insertion, in time order.
#[derive(Clone, Copy, Debug)]
struct Record {
    hash: u64,
    worker: WorkerSlot,
    seq: u64,
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

/// The pending blocks of one shard. See the module docs.
#[derive(Clone, Debug)]
pub struct PendingShard {
    ttl_us: u64,
    cap: usize,
    map: hashbrown::HashMap<u64, SmallVec<[Entry; 2]>>,
    queue: VecDeque<Record>,
    live: usize,
    next_seq: u64,
    stats: PendingStats,
}

impl PendingShard {
    /// A shard whose entries live `ttl_us` and of which at most `cap` are kept.
    pub fn new(ttl_us: u64, cap: usize) -> Self {
        PendingShard {
            ttl_us,
            cap,
            map: hashbrown::HashMap::new(),
            queue: VecDeque::new(),
            live: 0,
            next_seq: 0,
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

    /// `hashes` were routed to `worker` at `now_us`: they are pending there until
    /// `now_us + ttl`.
    pub fn add(&mut self, worker: WorkerSlot, hashes: &[u64], now_us: u64) {
        if !self.enabled() {
            return;
        }
        self.expire(now_us);
        let expires_us = now_us.saturating_add(self.ttl_us);
        for &hash in hashes {
            let seq = self.next_seq;
            self.next_seq += 1;
            let refreshed = match self.map.get_mut(&hash) {
                Some(v) => match v.iter_mut().find(|e| e.worker == worker) {
                    Some(e) => {
                        e.seq = seq;
                        e.expires_us = expires_us;
                        true
                    }
                    None => false,
                },
                None => false,
            };
            if !refreshed {
                while self.live >= self.cap {
                    if !self.pop_oldest(None) {
                        break;
                    }
                }
                self.map.entry(hash).or_default().push(Entry {
                    worker,
                    seq,
                    expires_us,
                });
                self.live += 1;
                self.stats.added += 1;
            }
            self.queue.push_back(Record { hash, worker, seq });
        }
        self.compact();
    }

    /// Reclaims every entry whose TTL has passed at `now_us`.
    pub fn expire(&mut self, now_us: u64) {
        while self.pop_oldest(Some(now_us)) {}
    }

    /// Removes the oldest live entry (only if expired at `now`, when given); skips
    /// stale records. True when an entry was removed.
    fn pop_oldest(&mut self, now: Option<u64>) -> bool {
        while let Some(r) = self.queue.front().copied() {
            let Some(v) = self.map.get_mut(&r.hash) else {
                self.queue.pop_front();
                continue;
            };
            let Some(i) = v
                .iter()
                .position(|e| e.worker == r.worker && e.seq == r.seq)
            else {
                self.queue.pop_front();
                continue;
            };
            if let Some(now) = now {
                if v[i].expires_us > now {
                    return false;
                }
                self.stats.expired += 1;
            } else {
                self.stats.evicted += 1;
            }
            v.swap_remove(i);
            if v.is_empty() {
                self.map.remove(&r.hash);
            }
            self.live -= 1;
            self.queue.pop_front();
            return true;
        }
        false
    }

    /// Drops stale queue records once they outnumber the live entries.
    fn compact(&mut self) {
        if self.queue.len() <= 2 * self.live + 1024 {
            return;
        }
        let map = &self.map;
        self.queue.retain(|r| {
            map.get(&r.hash)
                .is_some_and(|v| v.iter().any(|e| e.worker == r.worker && e.seq == r.seq))
        });
    }

    /// Removes `worker`'s entries for `hashes`; returns how many there were.
    fn remove(&mut self, worker: WorkerSlot, hashes: &[u64]) -> u64 {
        let mut n = 0;
        for h in hashes {
            if let Some(v) = self.map.get_mut(h) {
                if let Some(i) = v.iter().position(|e| e.worker == worker) {
                    v.swap_remove(i);
                    n += 1;
                    if v.is_empty() {
                        self.map.remove(h);
                    }
                }
            }
        }
        self.live -= n as usize;
        self.compact();
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
    /// epoch). O(live entries of the shard).
    pub fn clear_worker(&mut self, worker: WorkerSlot) {
        let mut n = 0usize;
        self.map.retain(|_, v| {
            let before = v.len();
            v.retain(|e| e.worker != worker);
            n += before - v.len();
            !v.is_empty()
        });
        self.live -= n;
        self.stats.dropped += n as u64;
        self.compact();
    }

    /// Appends `(position, worker)` for every item pending (unexpired at `now_us`).
    pub fn query(&self, items: &[(u32, u64)], now_us: u64, out: &mut Vec<(u32, WorkerSlot)>) {
        if self.live == 0 {
            return;
        }
        for &(pos, h) in items {
            if let Some(v) = self.map.get(&h) {
                out.extend(
                    v.iter()
                        .filter(|e| e.expires_us > now_us)
                        .map(|e| (pos, e.worker)),
                );
            }
        }
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
