//! The engine's per-shard stores, driven synchronously: active-block reuse counts,
//! pending (speculative) blocks and the approximate-mode model, each split over the
//! index shards by `shard_of` exactly as the service splits them over its cores.
//!
//! Approximate mode (`index::approx`): a worker flagged approximate has every routed
//! prompt's blocks touched in the model on its prefill side, and the model's blocks
//! join the pending matches of a query (both continue the worker's device run). Its
//! first event switches it to exact and drops its modelled blocks.

use super::{Engine, EngineError};
use crate::index::{shard_of, speculate, ApproxShard, PendingShard};
use crate::types::WorkerSlot;
use std::collections::HashMap;

impl Engine {
    pub(super) fn reuse_counts(&self, hashes: &[u64]) -> HashMap<WorkerSlot, u32> {
        let mut per_shard: Vec<Vec<(u32, u64)>> = vec![Vec::new(); self.active.len()];
        for (i, &h) in hashes.iter().enumerate() {
            per_shard[shard_of(h, self.shard_bits)].push((i as u32, h));
        }
        let mut out = Vec::new();
        for (s, items) in per_shard.iter().enumerate() {
            self.active[s].count_reuse(items, &mut out);
        }
        let mut m = HashMap::new();
        for (w, c) in out {
            *m.entry(w).or_insert(0) += c;
        }
        m
    }

    /// The pending and modelled (approximate) matches of `hashes` at `now_us`, as
    /// speculative overlaps against the index merge just computed.
    pub(super) fn speculate(&mut self, hashes: &[u64], now_us: u64) {
        self.spec_matches.clear();
        self.spec.clear();
        if self.pending.iter().all(PendingShard::is_empty)
            && self.approx.iter().all(ApproxShard::is_empty)
        {
            return;
        }
        let bits = self.shard_bits;
        let mut per_shard: Vec<Vec<(u32, u64)>> = vec![Vec::new(); self.pending.len()];
        for (i, &h) in hashes.iter().enumerate().take(u32::MAX as usize) {
            per_shard[shard_of(h, bits)].push((i as u32, h));
        }
        for ((p, a), items) in self.pending.iter().zip(&self.approx).zip(&per_shard) {
            p.query(items, now_us, &mut self.spec_matches);
            a.query(items, now_us, &mut self.spec_matches);
        }
        speculate(&self.merge, &mut self.spec_matches, &mut self.spec);
    }

    /// A request on `w` ended: it was prefilled, so `w`'s events have confirmed its
    /// blocks by now or never will; they stop being pending (as in the service).
    pub(super) fn end_pending(&mut self, w: WorkerSlot, hashes: &[u64]) {
        self.each_pending(hashes, |p, h| p.drop_hashes(w, h));
    }

    /// Runs `f` on each pending shard with the part of `hashes` it owns.
    pub(super) fn each_pending(
        &mut self,
        hashes: &[u64],
        mut f: impl FnMut(&mut PendingShard, &[u64]),
    ) {
        let bits = self.shard_bits;
        let mut mine = Vec::new();
        for (s, p) in self.pending.iter_mut().enumerate() {
            if p.is_empty() {
                continue;
            }
            mine.clear();
            mine.extend(hashes.iter().copied().filter(|&h| shard_of(h, bits) == s));
            f(p, &mine);
        }
    }

    pub(super) fn add_active(&mut self, w: WorkerSlot, hashes: &[u64]) {
        self.update_active(w, hashes, true);
    }

    pub(super) fn remove_active(&mut self, w: WorkerSlot, hashes: &[u64]) {
        self.update_active(w, hashes, false);
    }

    /// Adds or removes a request's hashes in the active-block shard owning each.
    pub(super) fn update_active(&mut self, w: WorkerSlot, hashes: &[u64], add: bool) {
        self.dirty.push(w);
        let bits = self.shard_bits;
        let mut mine = Vec::with_capacity(hashes.len());
        for (s, a) in self.active.iter_mut().enumerate() {
            mine.clear();
            mine.extend(hashes.iter().copied().filter(|&h| shard_of(h, bits) == s));
            if add {
                a.add(w, &mine);
            } else {
                a.remove(w, &mine);
            }
        }
    }

    /// Flags worker `id` approximate (its cache modelled from the prompts routed to
    /// it) or exact; switching to exact drops its modelled blocks.
    pub fn set_approximate(&mut self, id: &str, on: bool) -> Result<(), EngineError> {
        let slot = self.slot(id)?;
        self.flag_approximate(slot, on);
        Ok(())
    }

    pub(super) fn flag_approximate(&mut self, slot: WorkerSlot, on: bool) {
        let i = slot as usize;
        if self.approximate.len() <= i {
            self.approximate.resize(i + 1, false);
        }
        self.approximate[i] = on;
        if !on {
            for a in &mut self.approx {
                a.clear_worker(slot);
            }
        }
    }

    /// Whether worker `slot`'s cache is modelled (approximate mode).
    pub(super) fn is_approximate(&self, slot: WorkerSlot) -> bool {
        self.approximate
            .get(slot as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Modelled blocks of worker `slot` over every shard.
    pub(super) fn approx_entries(&self, slot: WorkerSlot) -> u64 {
        self.approx.iter().map(|a| a.worker_entries(slot)).sum()
    }

    /// A request prefilled on `w` carries `hashes`: an approximate worker caches them.
    pub(super) fn touch_approx(&mut self, w: WorkerSlot, hashes: &[u64], now_us: u64) {
        if !self.is_approximate(w) {
            return;
        }
        let bits = self.shard_bits;
        let mut mine = Vec::with_capacity(hashes.len());
        for (s, a) in self.approx.iter_mut().enumerate() {
            mine.clear();
            mine.extend(hashes.iter().copied().filter(|&h| shard_of(h, bits) == s));
            a.touch(w, &mine, now_us);
            a.expire(now_us);
        }
    }
}
