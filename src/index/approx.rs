//! Approximate mode: a model of the KV cache of a worker that publishes no events.
//!
//! Many engines run without KV events (vLLM without `--kv-events-config`, TensorRT-LLM's
//! and TGI's OpenAI servers, llama.cpp, hosted endpoints). For such a worker the router
//! models its cache from the prompts it routed there: each routed prompt's blocks are
//! *touched* on the worker that prefills it, and the model keeps that worker's most
//! recently touched blocks, an LRU bounded by its cap (its declared `capacity_blocks`,
//! as for indexed blocks), whose entries also go when no request has touched them for
//! `ttl` (an idle TTL). Unlike speculative blocks ([`super::pending`]), entries outlive
//! the request that touched them: the engine keeps a prompt's blocks cached after it
//! ends. A query reports modelled blocks like pending ones: they continue the worker's
//! device run (`super::speculate`).
//!
//! [`ApproxShard`] holds the entries of one index shard (the service keeps one per core,
//! keyed by the same `shard_of` as the index, so a request's lookups go to the cores
//! they already go to). Guarantees:
//! - bounded memory: a worker's cap is split evenly over the `shards` sharing it (the
//!   hashes are), and each shard keeps at most its share of the worker's blocks, an LRU
//!   of its own: at its share it evicts its least recently touched entry of that
//!   worker. Entries also reserve from a [`Budget`] as index entries do (the service
//!   passes its index budget), so a worker's entries over every shard never pass its
//!   cap, and all entries, modelled and indexed, never pass the budget's global limit;
//!   at that limit a shard evicts its own oldest entry of the worker too, and when it
//!   holds none the block is left out (counted as refused). A worker's touch queue
//!   holds at most `2 × live + 64` records after each touch;
//! - an entry is never reported at or after `touched + ttl`; [`ApproxShard::expire`]
//!   reclaims expired entries (and their budget) in touch order;
//! - touching a modelled block again refreshes it (back of the LRU) and never counts it
//!   twice, also when one call repeats it; blocks of one call never evict each other
//!   (a prompt larger than the worker's share keeps its first blocks), and among them
//!   the deepest is the least recently used: engines free a request's blocks tail
//!   first (vLLM's free queue, SGLang's radix leaves), so a prefix outlives its tail,
//!   and a block evicted from the head would leave the rest of the prompt unmatchable;
//! - pure: no I/O, time is passed in (non-decreasing per shard); no method panics.

use super::pending::flat::{Probe, Table};
use super::Budget;
use crate::types::WorkerSlot;
use std::collections::VecDeque;
use std::sync::Arc;

/// Cap of a worker whose cap was never set (as the index's `DEFAULT_WORKER_CAP`).
const DEFAULT_CAP: u64 = super::DEFAULT_WORKER_CAP;

/// Touch-queue records tolerated beyond twice the live entries before a compaction.
const QUEUE_SLACK: usize = 64;

/// Tables at most this large (slots) are never shrunk.
const SHRINK_FLOOR: usize = 4096;

/// One modelled (block, worker) entry.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    /// The touch (a per-worker sequence number) that last refreshed it.
    seq: u64,
    touched_us: u64,
}

/// One worker's LRU: its touch records oldest first, `(hash, seq)`; a record is live
/// while its entry still carries its `seq` (a later touch supersedes it).
#[derive(Clone, Debug)]
struct Lane {
    queue: VecDeque<(u64, u64)>,
    next_seq: u64,
    live: u64,
    /// The worker's cap over every shard, and this shard's share of it.
    cap: u64,
    share: u64,
}

impl Lane {
    fn new(shards: u64) -> Lane {
        Lane {
            queue: VecDeque::new(),
            next_seq: 0,
            live: 0,
            cap: DEFAULT_CAP,
            share: (DEFAULT_CAP / shards).max(1),
        }
    }
}

/// What happened to modelled entries (for metrics): cumulative counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApproxStats {
    /// Entries created.
    pub added: u64,
    /// Entries touched again (refreshed).
    pub refreshed: u64,
    /// Entries evicted by the cap (least recently touched first).
    pub evicted: u64,
    /// Entries that reached their idle TTL.
    pub expired: u64,
    /// Entries dropped with their worker (first event, removal, new epoch).
    pub dropped: u64,
    /// Blocks left out: the budget was exhausted and nothing of the worker to evict.
    pub refused: u64,
}

/// The modelled entries of one shard. See the module docs.
#[derive(Clone, Debug)]
pub struct ApproxShard {
    ttl_us: u64,
    /// Shards a worker's blocks are spread over (its cap is split between them).
    shards: u64,
    table: Table<Entry>,
    lanes: Vec<Lane>,
    budget: Arc<Budget>,
    live: usize,
    /// Earliest time the next full sweep ([`ApproxShard::expire`]) may find work.
    next_sweep_us: u64,
    stats: ApproxStats,
    fresh: Vec<u64>,
}

impl ApproxShard {
    /// One of `shards` shards (at least 1) over which the workers' blocks are spread,
    /// whose entries expire `ttl_us` after their last touch (at least 1 µs), reserving
    /// its entries from `budget`.
    pub fn new(ttl_us: u64, budget: Arc<Budget>, shards: usize) -> Self {
        ApproxShard {
            ttl_us: ttl_us.max(1),
            shards: (shards as u64).max(1),
            table: Table::default(),
            lanes: Vec::new(),
            budget,
            live: 0,
            next_sweep_us: 0,
            stats: ApproxStats::default(),
            fresh: Vec::new(),
        }
    }

    /// Modelled entries in this shard.
    pub fn len(&self) -> usize {
        self.live
    }

    /// No modelled entry.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Modelled entries of worker `w` in this shard.
    pub fn worker_entries(&self, w: WorkerSlot) -> u64 {
        self.lanes.get(w as usize).map_or(0, |l| l.live)
    }

    /// Cumulative counts.
    pub fn stats(&self) -> ApproxStats {
        self.stats
    }

    /// Touch records queued for `w` (live or superseded; for the memory-bound tests).
    #[cfg(test)]
    pub(crate) fn queued(&self, w: WorkerSlot) -> usize {
        self.lanes.get(w as usize).map_or(0, |l| l.queue.len())
    }

    fn lane_mut(&mut self, w: WorkerSlot) -> &mut Lane {
        let i = w as usize;
        let shards = self.shards;
        if self.lanes.len() <= i {
            self.lanes.resize_with(i + 1, || Lane::new(shards));
        }
        &mut self.lanes[i]
    }

    /// Caps worker `w`'s entries over every shard at `cap` (this shard keeps at most
    /// `cap / shards`, at least 1, and the budget enforces `cap` exactly). Entries
    /// beyond a lowered cap stay until later touches evict them.
    pub fn set_worker_cap(&mut self, w: WorkerSlot, cap: u64) {
        let share = (cap / self.shards).max(1);
        let lane = self.lane_mut(w);
        lane.cap = cap;
        lane.share = share;
    }

    /// A request routed to `w` carries `hashes` (this shard's part of its prompt, in
    /// prefix order) at `now_us`: they are cached there now, most recently used, the
    /// first block last in eviction order.
    pub fn touch(&mut self, w: WorkerSlot, hashes: &[u64], now_us: u64) {
        self.expire_lane(w, now_us);
        if hashes.is_empty() {
            return;
        }
        let lane = self.lane_mut(w);
        let seq = lane.next_seq;
        lane.next_seq += 1;
        let mut fresh = std::mem::take(&mut self.fresh);
        fresh.clear();
        self.table.touch(hashes);
        for &h in hashes {
            match self.table.probe(h, w) {
                Probe::Found(i) => {
                    let Some(e) = self.table.val_mut(i) else {
                        continue;
                    };
                    if e.seq == seq {
                        continue; // repeated within this call
                    }
                    *e = Entry {
                        seq,
                        touched_us: now_us,
                    };
                    self.stats.refreshed += 1;
                }
                Probe::Vacant(_) => fresh.push(h),
            }
        }
        if !fresh.is_empty() {
            self.insert_fresh(w, &fresh, seq, now_us);
        }
        self.fresh = fresh;
        // LRU order: deepest block first. (A block repeated in the call gets a second
        // record of the same touch, which finds its entry gone once the first is used.)
        let Some(lane) = self.lanes.get_mut(w as usize) else {
            return;
        };
        for &h in hashes.iter().rev() {
            let Some(i) = self.table.find(h, w) else {
                continue; // left out
            };
            if self.table.val_mut(i).is_some_and(|e| e.seq == seq) {
                lane.queue.push_back((h, seq));
            }
        }
        self.compact_lane(w);
    }

    /// Inserts the blocks of touch `seq` that `w` did not hold, within its share and
    /// the budget, evicting its least recently touched entries of earlier touches when
    /// needed.
    fn insert_fresh(&mut self, w: WorkerSlot, fresh: &[u64], seq: u64, now_us: u64) {
        let lane = self.lane_mut(w);
        let (cap, free) = (lane.cap, lane.share.saturating_sub(lane.live));
        let want = (fresh.len() as u64).min(free);
        let mut room = self.budget.reserve(w, cap, want).granted;
        // No growth between a probe and its insert: evictions only shift slots.
        self.table.reserve(fresh.len());
        for (k, &h) in fresh.iter().enumerate() {
            let mut probe = self.table.probe(h, w);
            if let Probe::Found(_) = probe {
                continue; // repeated within this call
            }
            if room == 0 {
                if !self.evict_oldest(w, seq) {
                    self.stats.refused += (fresh.len() - k) as u64;
                    break;
                }
                // The evicted entry's unit of budget is this block's now.
                room = 1;
                probe = self.table.probe(h, w);
            }
            let Probe::Vacant(i) = probe else { continue };
            let e = Entry {
                seq,
                touched_us: now_us,
            };
            self.table.put(i, h, w, e);
            room -= 1;
            self.live += 1;
            self.stats.added += 1;
            self.lane_mut(w).live += 1;
        }
        self.budget.release(w, room);
    }

    /// Removes `w`'s least recently touched entry from a touch before `seq`, keeping
    /// its budget unit for the caller. False when there is none.
    fn evict_oldest(&mut self, w: WorkerSlot, seq: u64) -> bool {
        loop {
            let Some(&(h, s)) = self.lanes.get(w as usize).and_then(|l| l.queue.front()) else {
                return false;
            };
            if s >= seq {
                return false; // only this call's blocks are left
            }
            self.lane_mut(w).queue.pop_front();
            if self.remove_if_current(h, w, s) {
                self.stats.evicted += 1;
                return true;
            }
        }
    }

    /// Removes (h, w) if touch `s` is still its latest; true when removed. The caller
    /// accounts the budget and says why.
    fn remove_if_current(&mut self, h: u64, w: WorkerSlot, s: u64) -> bool {
        let Some(i) = self.table.find(h, w) else {
            return false;
        };
        if self.table.val_mut(i).is_none_or(|e| e.seq != s) {
            return false;
        }
        self.table.remove_at(i);
        self.live -= 1;
        let lane = self.lane_mut(w);
        lane.live = lane.live.saturating_sub(1);
        true
    }

    /// Reclaims `w`'s entries whose TTL has passed at `now_us` (touch order is expiry
    /// order: time does not go back).
    fn expire_lane(&mut self, w: WorkerSlot, now_us: u64) {
        let mut gone = 0;
        while let Some(&(h, s)) = self.lanes.get(w as usize).and_then(|l| l.queue.front()) {
            if let Some(i) = self.table.find(h, w) {
                let touched = self.table.val_mut(i).filter(|e| e.seq == s);
                match touched.map(|e| e.touched_us) {
                    Some(t) if t.saturating_add(self.ttl_us) > now_us => break,
                    Some(_) => {
                        self.table.remove_at(i);
                        self.live -= 1;
                        gone += 1;
                    }
                    None => {} // superseded by a later touch
                }
            }
            self.lane_mut(w).queue.pop_front();
        }
        if gone > 0 {
            let lane = self.lane_mut(w);
            lane.live = lane.live.saturating_sub(gone);
            self.budget.release(w, gone);
            self.stats.expired += gone;
        }
    }

    /// Reclaims every entry whose TTL has passed at `now_us`. A sweep visits every
    /// worker; it runs at most once per eighth of the TTL (otherwise returns at once).
    pub fn expire(&mut self, now_us: u64) {
        if now_us < self.next_sweep_us || self.live == 0 {
            return;
        }
        self.next_sweep_us = now_us.saturating_add((self.ttl_us / 8).max(1));
        for w in 0..self.lanes.len() {
            self.expire_lane(w as WorkerSlot, now_us);
        }
        self.table.shrink_if_sparse(SHRINK_FLOOR);
    }

    /// Drops superseded records of `w` once its queue outgrows `2 × live + 64`:
    /// O(queue), amortised O(1) per touched block.
    fn compact_lane(&mut self, w: WorkerSlot) {
        let Some(lane) = self.lanes.get_mut(w as usize) else {
            return;
        };
        if lane.queue.len() <= 2 * lane.live as usize + QUEUE_SLACK {
            return;
        }
        let old = std::mem::take(&mut lane.queue);
        let table = &mut self.table;
        lane.queue = old
            .into_iter()
            .filter(|&(h, s)| {
                table
                    .find(h, w)
                    .and_then(|i| table.val_mut(i))
                    .is_some_and(|e| e.seq == s)
            })
            .collect();
    }

    /// Drops every entry of `w` (its first real event, its removal or a new epoch),
    /// giving their budget back. Its cap stays. O(table) when it has entries.
    pub fn clear_worker(&mut self, w: WorkerSlot) {
        let Some(lane) = self.lanes.get_mut(w as usize) else {
            return;
        };
        let n = lane.live;
        lane.queue = VecDeque::new();
        lane.live = 0;
        if n == 0 {
            return;
        }
        self.table.retain(|_, x, _| x != w);
        self.live = self.live.saturating_sub(n as usize);
        self.budget.release(w, n);
        self.stats.dropped += n;
        self.table.shrink_if_sparse(SHRINK_FLOOR);
    }

    /// Appends `(position, worker)` for every item modelled (unexpired at `now_us`).
    pub fn query(&self, items: &[(u32, u64)], now_us: u64, out: &mut Vec<(u32, WorkerSlot)>) {
        if self.live == 0 {
            return;
        }
        self.table.for_each_at(items, |pos, w, e| {
            if e.touched_us.saturating_add(self.ttl_us) > now_us {
                out.push((pos, w));
            }
        });
    }
}

#[cfg(test)]
mod tests;
