//! One shard of the block index: sequence hash → the (worker, tier) entries holding it.
//!
//! Guarantees:
//! - one entry per (block, worker, tier): storing it again is a duplicate; tiers are
//!   independent (a block may be on a worker's device and host at once);
//! - per-worker live counts make [`IndexShard::worker_blocks`] and the cap check O(1);
//!   stores past a worker's cap are rejected, so memory is always bounded;
//! - clears are O(1): each (worker, tier) has a generation; clearing bumps it and every
//!   entry carrying an older generation becomes *stale*. Stale entries are invisible to
//!   queries, dropped when their block is touched, and reclaimed by a full compaction
//!   when `stale > live + floor`, checked before each store. Only stores add entries
//!   and clears never do, so entries never exceed `2 * peak live + floor + one batch`,
//!   and live entries are bounded by the caps. A compaction's cost is paid for by the
//!   stale entries it drops, so it is O(1) amortised per stored entry;
//! - generations are 14 bits: when one would wrap, the shard first drops every entry of
//!   that (worker, tier), so a stale entry can never become live again.

use super::hashmix::mix;
use super::holders::{gen_of, key_of, pack, slot_of, tier_idx, tier_of, Holders, Slab, GEN_PERIOD};
use super::table::{Probe, Table};
use super::Budget;
use crate::types::{Tier, WorkerSlot};
use std::sync::Arc;

/// Per-shard cap on a worker's indexed (block, tier) entries until
/// [`IndexShard::set_worker_cap`] says otherwise.
pub const DEFAULT_WORKER_CAP: u64 = 1 << 20;

/// Stale entries tolerated beyond the live count before a store triggers a compaction:
/// keeps small shards from compacting on every clear.
const COMPACT_FLOOR: u64 = 4096;

/// How many keys ahead of its use [`Ahead`] (stores and removes) prefetches a home slot
/// (a power of two; queries use `query::QUERY_AHEAD`).
pub(crate) const AHEAD: usize = 16;

/// The keys of a hash list in order, each key's home slot prefetched [`AHEAD`] keys
/// before its turn: a steady pipeline of misses in flight for stores and removes,
/// which (unlike a chunk prefetched at once) never waits a full memory latency at the
/// start of every chunk. The table may change between keys (stores and removes
/// shift slots) as long as it is not reallocated: a stale prefetch only wastes a load.
struct Ahead {
    ring: [u64; AHEAD],
}

impl Ahead {
    #[inline(always)]
    fn start(map: &Table, hashes: &[u64]) -> Ahead {
        let mut ring = [0u64; AHEAD];
        for (k, &h) in ring.iter_mut().zip(hashes) {
            *k = mix(h);
            map.prefetch(*k);
        }
        Ahead { ring }
    }

    /// The key of `hashes[i]`; call with `i = 0, 1, 2, …` in turn.
    #[inline(always)]
    fn key(&mut self, map: &Table, hashes: &[u64], i: usize) -> u64 {
        let r = &mut self.ring[i % AHEAD];
        let k = *r;
        if let Some(&h) = hashes.get(i + AHEAD) {
            *r = mix(h);
            map.prefetch(*r);
        }
        k
    }
}

/// What a [`IndexShard::stored`] call did with its hashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreOutcome {
    /// New (block, worker, tier) entries.
    pub added: u32,
    /// Entries that were already present and live.
    pub duplicate: u32,
    /// Stores refused because the worker is at its cap in this shard (or, attached to
    /// a [`Budget`], at its cap overall or the index at its global limit).
    pub rejected: u32,
    /// Of `rejected`, those refused by the [`Budget`]'s global limit while the worker
    /// itself still had room.
    pub over_budget: u32,
}

impl std::ops::AddAssign for StoreOutcome {
    fn add_assign(&mut self, o: StoreOutcome) {
        self.added = self.added.saturating_add(o.added);
        self.duplicate = self.duplicate.saturating_add(o.duplicate);
        self.rejected = self.rejected.saturating_add(o.rejected);
        self.over_budget = self.over_budget.saturating_add(o.over_budget);
    }
}

/// Size and health figures of a shard (sums over shards for a [`super::ShardedIndex`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Distinct block hashes present (including blocks with only stale entries).
    pub blocks: u64,
    /// Live (block, worker, tier) entries.
    pub live_entries: u64,
    /// Entries invalidated by a clear and not yet reclaimed.
    pub stale_entries: u64,
    /// Approximate heap bytes of the shard (map table, spill lists, worker table).
    pub heap_bytes: u64,
    /// Stores rejected by worker caps since the shard was created.
    pub rejected_total: u64,
    /// Full compactions run since the shard was created.
    pub compactions: u64,
}

impl std::ops::AddAssign for ShardStats {
    fn add_assign(&mut self, o: ShardStats) {
        self.blocks += o.blocks;
        self.live_entries += o.live_entries;
        self.stale_entries += o.stale_entries;
        self.heap_bytes += o.heap_bytes;
        self.rejected_total += o.rejected_total;
        self.compactions += o.compactions;
    }
}

mod query;
pub(crate) use query::QueryRing;
#[cfg(test)]
pub(crate) use query::QUERY_AHEAD;
mod snapshot;

/// Per-worker counters of a shard (its generations are in `IndexShard::gens`).
#[derive(Clone, Copy, Debug)]
struct WorkerState {
    /// Live entries per tier.
    live: [u64; 3],
    /// Cap on `live` summed over tiers.
    cap: u64,
}

impl Default for WorkerState {
    fn default() -> Self {
        WorkerState {
            live: [0; 3],
            cap: DEFAULT_WORKER_CAP,
        }
    }
}

impl WorkerState {
    #[inline]
    fn total(&self) -> u64 {
        self.live.iter().sum()
    }
}

/// Generations of a fresh worker: tiers 0..=2 at 0; index 3 (no real tier) matches no
/// entry, as generations are below `GEN_PERIOD`.
const GENS0: [u16; 4] = [0, 0, 0, u16::MAX];

/// Is `e` live given the per-worker generations?
#[inline(always)]
fn is_live(gens: &[[u16; 4]], e: u32) -> bool {
    gens.get(slot_of(e) as usize)
        .is_some_and(|g| g[tier_idx(e) & 3] == gen_of(e))
}

/// One shard of the block index. See the module docs for its guarantees.
#[derive(Debug)]
pub struct IndexShard {
    /// `mix(hash)` → holders. Never holds an empty holder set.
    map: Table,
    /// Spilled holder lists (3+ entries).
    slab: Slab,
    /// Indexed by worker slot; grown on demand.
    workers: Vec<WorkerState>,
    /// Current generation per worker slot and tier index (same length as `workers`;
    /// kept apart, 8 bytes a worker, because queries read it for every entry):
    /// entries carrying another generation are stale.
    gens: Vec<[u16; 4]>,
    live: u64,
    stale: u64,
    rejected_total: u64,
    compactions: u64,
    /// Generations per (worker, tier) before a wrap; `GEN_PERIOD` except in tests.
    gen_period: u32,
    compact_floor: u64,
    /// Shared with the other shards: worker caps count over all of them, plus the
    /// global limit (see [`IndexShard::attach_budget`]).
    budget: Option<Arc<Budget>>,
}

impl Default for IndexShard {
    fn default() -> Self {
        Self::new()
    }
}

impl IndexShard {
    /// An empty shard.
    pub fn new() -> Self {
        IndexShard {
            map: Table::default(),
            slab: Slab::default(),
            workers: Vec::new(),
            gens: Vec::new(),
            live: 0,
            stale: 0,
            rejected_total: 0,
            compactions: 0,
            gen_period: GEN_PERIOD,
            compact_floor: COMPACT_FLOOR,
            budget: None,
        }
    }

    /// Attaches the shard to a [`Budget`] shared with the other shards: from now on a
    /// worker's cap ([`IndexShard::set_worker_cap`]) is its total over every attached
    /// shard, enforced exactly, and the budget's global limit bounds all their entries.
    /// Entries already present are counted (whatever the limits).
    pub fn attach_budget(&mut self, budget: Arc<Budget>) {
        for (w, ws) in self.workers.iter().enumerate() {
            budget.add_existing(w as WorkerSlot, ws.total());
        }
        self.budget = Some(budget);
    }

    /// A shard whose generations wrap after `period` clears (clamped to `2..=2^14`) and
    /// which compacts once stale entries exceed live ones by `floor`: makes wrap-around
    /// and compaction reachable in tests.
    #[cfg(test)]
    pub(crate) fn with_limits(period: u32, floor: u64) -> Self {
        let mut s = Self::new();
        s.gen_period = period.clamp(2, GEN_PERIOD);
        s.compact_floor = floor;
        s
    }

    fn worker_mut(&mut self, w: WorkerSlot) -> &mut WorkerState {
        let i = w as usize;
        if self.workers.len() <= i {
            self.workers.resize(i + 1, WorkerState::default());
            self.gens.resize(i + 1, GENS0);
        }
        &mut self.workers[i]
    }

    /// Caps the (block, tier) entries indexed for worker `w` in this shard (attached to
    /// a [`Budget`]: over all attached shards, exactly). Entries
    /// already present beyond a lowered cap stay; further stores are rejected until the
    /// worker is back under it. Never-set caps are [`DEFAULT_WORKER_CAP`]. The cap
    /// survives clears (a reused slot gets its new worker's cap set by the registry).
    pub fn set_worker_cap(&mut self, w: WorkerSlot, cap: u64) {
        self.worker_mut(w).cap = cap;
    }

    /// The cap of worker `w` in this shard.
    pub fn worker_cap(&self, w: WorkerSlot) -> u64 {
        self.workers
            .get(w as usize)
            .map_or(DEFAULT_WORKER_CAP, |ws| ws.cap)
    }

    /// Worker `w` now holds `hashes` in `tier`.
    pub fn stored(&mut self, w: WorkerSlot, tier: Tier, hashes: &[u64]) -> StoreOutcome {
        let mut out = StoreOutcome::default();
        if hashes.is_empty() {
            return out;
        }
        if self.stale > self.live.saturating_add(self.compact_floor) {
            self.compact(None);
        }
        self.worker_mut(w);
        self.map.reserve(hashes.len());
        let t = tier as usize;
        let (Some(&ws), Some(gens)) = (self.workers.get(w as usize), self.gens.get(w as usize))
        else {
            return out;
        };
        let entry = pack(w, tier, gens[t]);
        let key = key_of(entry);
        // Entries `w` may still add before its cap (counted down as they are added); with
        // a budget, reserved from the shared counters for this batch.
        let grant = self
            .budget
            .as_ref()
            .map(|b| b.reserve(w, ws.cap, hashes.len() as u64));
        let mut room = match grant {
            Some(g) => g.granted,
            None => ws.cap.saturating_sub(ws.total()),
        };
        let mut ahead = Ahead::start(&self.map, hashes);
        for i in 0..hashes.len() {
            let k = ahead.key(&self.map, hashes, i);
            match self.map.find_or_slot(k) {
                Probe::Vacant(pos) => {
                    if room == 0 {
                        out.rejected += 1;
                    } else {
                        self.map.insert_at(pos, k, Holders::single(entry));
                        room -= 1;
                        out.added += 1;
                    }
                }
                Probe::Found(i) => self.store_into(i, entry, key, &mut room, &mut out),
            }
        }
        if let Some(ws) = self.workers.get_mut(w as usize) {
            ws.live[t] += u64::from(out.added);
        }
        if let (Some(b), Some(g)) = (&self.budget, grant) {
            b.release(w, room);
            let cut = g.worker_room - g.granted;
            out.over_budget = out.rejected.min(u32::try_from(cut).unwrap_or(u32::MAX));
        }
        self.live += u64::from(out.added);
        self.rejected_total += u64::from(out.rejected);
        out
    }

    /// [`IndexShard::stored`] of one block already present (in slot `i`).
    #[inline]
    fn store_into(
        &mut self,
        i: usize,
        entry: u32,
        key: u32,
        room: &mut u64,
        out: &mut StoreOutcome,
    ) {
        let Self {
            map,
            slab,
            gens,
            stale,
            ..
        } = self;
        let Some(hs) = map.holders_mut(i) else {
            return;
        };
        if let Some(j) = hs.find(slab, key) {
            if hs.entries(slab).get(j) == Some(&entry) {
                out.duplicate += 1;
                return;
            }
            // Same worker and tier, older generation: a stale entry.
            *stale -= 1;
            if *room == 0 {
                hs.remove(slab, j);
                if hs.is_empty() {
                    map.remove_at(i);
                }
                out.rejected += 1;
            } else {
                hs.set(slab, j, entry);
                *room -= 1;
                out.added += 1;
            }
            return;
        }
        if *room == 0 {
            out.rejected += 1;
            return;
        }
        if hs.is_full_inline() {
            // Make room from stale entries rather than spilling.
            let mut dropped = 0;
            hs.retain(slab, |e| {
                let keep = is_live(gens, e);
                dropped += u64::from(!keep);
                keep
            });
            *stale -= dropped;
        }
        hs.insert(slab, entry);
        *room -= 1;
        out.added += 1;
    }

    /// Worker `w` no longer holds `hashes` in `tier`. Returns the live entries removed;
    /// hashes it did not hold are no-ops.
    pub fn removed(&mut self, w: WorkerSlot, tier: Tier, hashes: &[u64]) -> u32 {
        let t = tier as usize;
        let Some(gen) = self.gens.get(w as usize).map(|g| g[t]) else {
            return 0;
        };
        let entry = pack(w, tier, gen);
        let key = key_of(entry);
        let mut removed = 0u32;
        let mut stale_dropped = 0u64;
        let mut ahead = Ahead::start(&self.map, hashes);
        for n in 0..hashes.len() {
            let k = ahead.key(&self.map, hashes, n);
            let Some(i) = self.map.find(k) else {
                continue;
            };
            let Some(hs) = self.map.holders_mut(i) else {
                continue;
            };
            let Some(j) = hs.find(&self.slab, key) else {
                continue;
            };
            let was_live = hs.entries(&self.slab).get(j) == Some(&entry);
            hs.remove(&mut self.slab, j);
            if hs.is_empty() {
                self.map.remove_at(i);
            }
            if was_live {
                removed += 1;
            } else {
                stale_dropped += 1;
            }
        }
        if let Some(ws) = self.workers.get_mut(w as usize) {
            ws.live[t] -= u64::from(removed);
        }
        if let Some(b) = &self.budget {
            b.release(w, u64::from(removed));
        }
        self.live -= u64::from(removed);
        self.stale -= stale_dropped;
        removed
    }

    /// Drops every block of `w` in `tier`: O(1) (a generation bump), except when the
    /// generation wraps (once per `2^14` effective clears of this worker and tier), when
    /// a full compaction removes all of this (worker, tier)'s entries first.
    pub fn clear_tier(&mut self, w: WorkerSlot, tier: Tier) {
        let t = tier as usize;
        let period = self.gen_period;
        let (Some(ws), Some(gen)) = (
            self.workers.get_mut(w as usize),
            self.gens.get_mut(w as usize).and_then(|g| g.get_mut(t)),
        ) else {
            return;
        };
        let n = ws.live[t];
        if n == 0 {
            // No entry carries the current generation: nothing to invalidate.
            return;
        }
        ws.live[t] = 0;
        if let Some(b) = &self.budget {
            b.release(w, n);
        }
        self.live -= n;
        self.stale += n;
        let next = u32::from(*gen) + 1;
        if next >= period {
            *gen = 0;
            // Entries of generation 0 may survive from the previous cycle: drop every
            // entry of this (worker, tier) regardless of generation.
            self.compact(Some(key_of(pack(w, tier, 0))));
        } else {
            *gen = next as u16;
        }
    }

    /// Drops every block of `w` in all tiers: O(1) like [`IndexShard::clear_tier`]. Used
    /// when a worker restarts and when a slot is freed for reuse.
    pub fn clear_worker(&mut self, w: WorkerSlot) {
        for tier in Tier::ALL {
            self.clear_tier(w, tier);
        }
    }

    /// Reclaims every stale entry now (also runs automatically, amortised, on stores).
    pub fn compact_now(&mut self) {
        self.compact(None);
    }

    /// Full compaction: drops stale entries, and every entry whose key is `victim`.
    fn compact(&mut self, victim: Option<u32>) {
        let Self {
            map, slab, gens, ..
        } = self;
        map.retain(|hs| {
            hs.retain(slab, |e| is_live(gens, e) && Some(key_of(e)) != victim);
            !hs.is_empty()
        });
        self.stale = 0;
        self.compactions += 1;
        // Give memory back after large clears, with hysteresis against regrowth.
        self.map.shrink_to(2 * self.map.len());
    }

    /// Live (block, tier) entries of worker `w` in this shard.
    pub fn worker_blocks(&self, w: WorkerSlot) -> u64 {
        self.workers.get(w as usize).map_or(0, |ws| ws.total())
    }

    /// Live entries of worker `w` in `tier` in this shard.
    pub fn worker_tier_blocks(&self, w: WorkerSlot, tier: Tier) -> u64 {
        self.workers
            .get(w as usize)
            .map_or(0, |ws| ws.live[tier as usize])
    }

    /// Size and health figures.
    pub fn stats(&self) -> ShardStats {
        let heap = self.map.allocation_size()
            + self.slab.heap_bytes()
            + self.workers.capacity() * std::mem::size_of::<WorkerState>()
            + self.gens.capacity() * std::mem::size_of::<[u16; 4]>();
        ShardStats {
            blocks: self.map.len() as u64,
            live_entries: self.live,
            stale_entries: self.stale,
            heap_bytes: heap as u64,
            rejected_total: self.rejected_total,
            compactions: self.compactions,
        }
    }

    /// Entries physically present (live + stale), recounted from the map.
    #[cfg(test)]
    pub(crate) fn physical_entries(&self) -> u64 {
        self.map
            .iter()
            .map(|(_, hs)| hs.entries(&self.slab).len() as u64)
            .sum()
    }

    /// Spill lists in use.
    #[cfg(test)]
    pub(crate) fn spilled_lists(&self) -> usize {
        self.slab.in_use()
    }
}
