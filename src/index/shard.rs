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

use super::holders::{
    gen_of, key_of, pack, slot_of, tier_idx, tier_of, BuildNoHash, Holders, Slab, GEN_PERIOD,
};
use super::merge::{Match, ShardAnswer};
use super::mix;
use crate::types::{Tier, WorkerSlot};
use hashbrown::hash_map::Entry as MapEntry;
use hashbrown::HashMap;

/// Per-shard cap on a worker's indexed (block, tier) entries until
/// [`IndexShard::set_worker_cap`] says otherwise.
pub const DEFAULT_WORKER_CAP: u64 = 1 << 20;

/// Stale entries tolerated beyond the live count before a store triggers a compaction:
/// keeps small shards from compacting on every clear.
const COMPACT_FLOOR: u64 = 4096;

/// What a [`IndexShard::stored`] call did with its hashes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreOutcome {
    /// New (block, worker, tier) entries.
    pub added: u32,
    /// Entries that were already present and live.
    pub duplicate: u32,
    /// Stores refused because the worker is at its cap in this shard.
    pub rejected: u32,
}

impl std::ops::AddAssign for StoreOutcome {
    fn add_assign(&mut self, o: StoreOutcome) {
        self.added = self.added.saturating_add(o.added);
        self.duplicate = self.duplicate.saturating_add(o.duplicate);
        self.rejected = self.rejected.saturating_add(o.rejected);
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

mod snapshot;

/// Per-worker state of a shard.
#[derive(Clone, Copy, Debug)]
struct WorkerState {
    /// Current generation per tier; entries with another generation are stale.
    gen: [u16; 3],
    /// Live entries per tier.
    live: [u64; 3],
    /// Cap on `live` summed over tiers.
    cap: u64,
}

impl Default for WorkerState {
    fn default() -> Self {
        WorkerState {
            gen: [0; 3],
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

/// Is `e` live given the worker table?
#[inline]
fn is_live(workers: &[WorkerState], e: u32) -> bool {
    workers
        .get(slot_of(e) as usize)
        .and_then(|ws| ws.gen.get(tier_idx(e)))
        .is_some_and(|&g| g == gen_of(e))
}

/// One shard of the block index. See the module docs for its guarantees.
#[derive(Debug)]
pub struct IndexShard {
    /// `mix(hash)` → holders. Never holds an empty holder set.
    map: HashMap<u64, Holders, BuildNoHash>,
    /// Spilled holder lists (3+ entries).
    slab: Slab,
    /// Indexed by worker slot; grown on demand.
    workers: Vec<WorkerState>,
    live: u64,
    stale: u64,
    rejected_total: u64,
    compactions: u64,
    /// Generations per (worker, tier) before a wrap; `GEN_PERIOD` except in tests.
    gen_period: u32,
    compact_floor: u64,
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
            map: HashMap::with_hasher(BuildNoHash),
            slab: Slab::default(),
            workers: Vec::new(),
            live: 0,
            stale: 0,
            rejected_total: 0,
            compactions: 0,
            gen_period: GEN_PERIOD,
            compact_floor: COMPACT_FLOOR,
        }
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
        }
        &mut self.workers[i]
    }

    /// Caps the (block, tier) entries indexed for worker `w` in this shard. Entries
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
        let t = tier as usize;
        let Self {
            map,
            slab,
            workers,
            live,
            stale,
            ..
        } = self;
        let entry = pack(w, tier, workers[w as usize].gen[t]);
        let key = key_of(entry);
        for &h in hashes {
            let at_cap = {
                let ws = &workers[w as usize];
                ws.total() >= ws.cap
            };
            match map.entry(mix(h)) {
                MapEntry::Occupied(mut o) => {
                    let hs = o.get_mut();
                    if let Some(i) = hs.find(slab, key) {
                        if hs.entries(slab)[i] == entry {
                            out.duplicate += 1;
                            continue;
                        }
                        // Same worker and tier, older generation: a stale entry.
                        *stale -= 1;
                        if at_cap {
                            hs.remove(slab, i);
                            if hs.is_empty() {
                                o.remove();
                            }
                            out.rejected += 1;
                        } else {
                            hs.set(slab, i, entry);
                            workers[w as usize].live[t] += 1;
                            *live += 1;
                            out.added += 1;
                        }
                        continue;
                    }
                    if at_cap {
                        out.rejected += 1;
                        continue;
                    }
                    if hs.is_full_inline() {
                        // Make room from stale entries rather than spilling.
                        let mut dropped = 0;
                        hs.retain(slab, |e| {
                            let keep = is_live(workers, e);
                            dropped += u64::from(!keep);
                            keep
                        });
                        *stale -= dropped;
                    }
                    hs.insert(slab, entry);
                    workers[w as usize].live[t] += 1;
                    *live += 1;
                    out.added += 1;
                }
                MapEntry::Vacant(v) => {
                    if at_cap {
                        out.rejected += 1;
                        continue;
                    }
                    v.insert(Holders::single(entry));
                    workers[w as usize].live[t] += 1;
                    *live += 1;
                    out.added += 1;
                }
            }
        }
        self.rejected_total += u64::from(out.rejected);
        out
    }

    /// Worker `w` no longer holds `hashes` in `tier`. Returns the live entries removed;
    /// hashes it did not hold are no-ops.
    pub fn removed(&mut self, w: WorkerSlot, tier: Tier, hashes: &[u64]) -> u32 {
        let t = tier as usize;
        let Some(gen) = self.workers.get(w as usize).map(|ws| ws.gen[t]) else {
            return 0;
        };
        let entry = pack(w, tier, gen);
        let key = key_of(entry);
        let mut removed = 0u32;
        for &h in hashes {
            let MapEntry::Occupied(mut o) = self.map.entry(mix(h)) else {
                continue;
            };
            let hs = o.get_mut();
            let Some(i) = hs.find(&self.slab, key) else {
                continue;
            };
            let was_live = hs.entries(&self.slab)[i] == entry;
            hs.remove(&mut self.slab, i);
            if hs.is_empty() {
                o.remove();
            }
            if was_live {
                self.workers[w as usize].live[t] -= 1;
                self.live -= 1;
                removed += 1;
            } else {
                self.stale -= 1;
            }
        }
        removed
    }

    /// Drops every block of `w` in `tier`: O(1) (a generation bump), except when the
    /// generation wraps (once per `2^14` effective clears of this worker and tier), when
    /// a full compaction removes all of this (worker, tier)'s entries first.
    pub fn clear_tier(&mut self, w: WorkerSlot, tier: Tier) {
        let t = tier as usize;
        let period = self.gen_period;
        let Some(ws) = self.workers.get_mut(w as usize) else {
            return;
        };
        let n = ws.live[t];
        if n == 0 {
            // No entry carries the current generation: nothing to invalidate.
            return;
        }
        ws.live[t] = 0;
        self.live -= n;
        self.stale += n;
        let next = u32::from(ws.gen[t]) + 1;
        if next >= period {
            ws.gen[t] = 0;
            // Entries of generation 0 may survive from the previous cycle: drop every
            // entry of this (worker, tier) regardless of generation.
            self.compact(Some(key_of(pack(w, tier, 0))));
        } else {
            ws.gen[t] = next as u16;
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
            map, slab, workers, ..
        } = self;
        map.retain(|_, hs| {
            hs.retain(slab, |e| is_live(workers, e) && Some(key_of(e)) != victim);
            !hs.is_empty()
        });
        self.stale = 0;
        self.compactions += 1;
        // Give memory back after large clears, with hysteresis against regrowth.
        let len = self.map.len();
        if self.map.capacity() > 4 * len + 1024 {
            self.map.shrink_to(2 * len);
        }
    }

    /// Live matches of `items` — (position, hash) pairs sorted by position, only the
    /// positions this shard owns — appended to `out.matches` (sorted by position, at
    /// most one per (position, worker): the worker's best tier). Sets `out.first_miss`
    /// to the first position with no live holder (scanning stops there: no prefix can
    /// extend past it), or `u32::MAX`. Does not allocate when `out` has capacity.
    pub fn query(&self, items: &[(u32, u64)], out: &mut ShardAnswer) {
        out.first_miss = u32::MAX;
        for &(pos, h) in items {
            let before = out.matches.len();
            if let Some(hs) = self.map.get(&mix(h)) {
                let mut last_slot = None;
                for &e in hs.entries(&self.slab) {
                    let slot = slot_of(e);
                    // Sorted by (slot, tier): the first live entry of a slot is its best.
                    if last_slot != Some(slot) && is_live(&self.workers, e) {
                        last_slot = Some(slot);
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
            + self.workers.capacity() * std::mem::size_of::<WorkerState>();
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
            .values()
            .map(|hs| hs.entries(&self.slab).len() as u64)
            .sum()
    }

    /// Spill lists in use.
    #[cfg(test)]
    pub(crate) fn spilled_lists(&self) -> usize {
        self.slab.in_use()
    }
}
