//! Engine events → kvroute index changes for one worker.
//!
//! The adapter recomputes kvroute's sequence hashes (DESIGN §1, salted as described in
//! the `engines` module docs) from each `BlockStored`'s `token_ids`, continuing the
//! chain from the kvroute hash of `parent_block_hash`, and keeps the engine-hash →
//! kvroute-hash map that lets `BlockRemoved` resolve.
//!
//! Guarantees:
//! - the map never holds more than `capacity` entries; when full, the least recently
//!   stored entry is evicted and a `Removed` for it is emitted first, so every block the
//!   index holds for this worker stays removable (index ⊆ map);
//! - a block is removed from the index per tier, and leaves the map once no tier holds it;
//! - an event whose parent is unknown (joined mid-stream, or evicted) stores nothing;
//!   blocks without complete tokens are not stored; all such cases are counted;
//! - a `BlockStored` whose block size (its own, else the endpoint's fallback) differs
//!   from the router's is refused and counted (`block_size_mismatch`): its blocks
//!   would be hashed over other token spans than routing requests are, so they could
//!   never match (overlap 0 for every request) and adapting is impossible.

use super::{lora_salt, medium_tier, salt_local, EngineEvent, EngineHash, Stored};
use crate::hash::{chain, local_block_hash, MAX_BLOCK_SIZE};
use crate::types::Tier;
use ahash::RandomState;
use hashbrown::HashMap;
use std::collections::VecDeque;

/// A change to this worker's part of the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Stored { tier: Tier, hashes: Vec<u64> },
    Removed { tier: Tier, hashes: Vec<u64> },
    Cleared { tier: Option<Tier> },
}

/// What the adapter dropped or could not resolve (monotonic counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdapterStats {
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    /// Stored events whose parent hash was not in the map.
    pub unknown_parent: u64,
    /// Removed hashes not in the map (never seen, or already evicted).
    pub unknown_removed: u64,
    /// Blocks of stored events without complete tokens.
    pub missing_tokens: u64,
    /// Entries evicted because the map was full.
    pub evicted: u64,
    /// Stored events with a block size kvroute cannot hash (0 or too large).
    pub bad_block_size: u64,
    /// Stored events refused: their block size differs from the router's.
    pub block_size_mismatch: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    seq: u64,
    /// Bit per tier (1 << tier).
    tiers: u8,
    stamp: u64,
}

/// Per-worker adapter state.
pub struct Adapter {
    block_size: u32,
    /// The block size the router hashes requests with; stored events must match it.
    router_block_size: u32,
    /// The block size of the last mismatched event (for the operator's log line).
    pub last_mismatch: u32,
    capacity: usize,
    default_lora: Option<String>,
    map: HashMap<EngineHash, Entry, RandomState>,
    /// Keys in store order with the stamp they had; stale pairs are skipped lazily.
    order: VecDeque<(EngineHash, u64)>,
    next_stamp: u64,
    pub stats: AdapterStats,
}

impl Adapter {
    /// `block_size`: used when an event carries none. `capacity`: map bound (>= 1).
    /// `default_lora`: LoRA name for events with a `lora_id` but no `lora_name`.
    pub fn new(block_size: u32, capacity: usize, default_lora: Option<String>) -> Adapter {
        Adapter {
            block_size,
            router_block_size: block_size,
            last_mismatch: 0,
            capacity: capacity.max(1),
            default_lora,
            map: HashMap::with_hasher(RandomState::new()),
            order: VecDeque::new(),
            next_stamp: 0,
            stats: AdapterStats::default(),
        }
    }

    /// Sets the router's block size when it differs from the fallback `block_size`
    /// given to [`Adapter::new`] (every stored event must then carry the router's).
    pub fn with_router_block_size(mut self, bs: u32) -> Adapter {
        self.router_block_size = bs;
        self
    }

    /// The block size stored events must have.
    pub fn router_block_size(&self) -> u32 {
        self.router_block_size
    }

    /// Engine hashes currently mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// kvroute hash of an engine hash, if mapped.
    pub fn lookup(&self, h: &EngineHash) -> Option<u64> {
        self.map.get(h).map(|e| e.seq)
    }

    /// Forgets everything (the caller clears the index).
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    /// Applies one event, appending the index changes to `out` in order.
    pub fn apply(&mut self, ev: &EngineEvent, out: &mut Vec<Change>) {
        match ev {
            EngineEvent::Stored(s) => self.stored(s, out),
            EngineEvent::Removed {
                block_hashes,
                medium,
            } => {
                let tier = medium_tier(medium.as_deref());
                let bit = 1u8 << tier.as_u8();
                let mut removed = Vec::new();
                for h in block_hashes {
                    match self.map.get_mut(h) {
                        Some(e) if e.tiers & bit != 0 => {
                            e.tiers &= !bit;
                            removed.push(e.seq);
                            if e.tiers == 0 {
                                self.map.remove(h);
                            }
                        }
                        _ => self.stats.unknown_removed += 1,
                    }
                }
                if !removed.is_empty() {
                    self.stats.removed_blocks += removed.len() as u64;
                    out.push(Change::Removed {
                        tier,
                        hashes: removed,
                    });
                }
                self.maybe_compact();
            }
            EngineEvent::AllCleared { medium } => match medium {
                None => {
                    self.clear();
                    out.push(Change::Cleared { tier: None });
                }
                Some(m) => {
                    let tier = medium_tier(Some(m));
                    let bit = 1u8 << tier.as_u8();
                    self.map.retain(|_, e| {
                        e.tiers &= !bit;
                        e.tiers != 0
                    });
                    out.push(Change::Cleared { tier: Some(tier) });
                    self.maybe_compact();
                }
            },
        }
    }

    fn stored(&mut self, s: &Stored, out: &mut Vec<Change>) {
        let bs = s.block_size.unwrap_or(self.block_size);
        if bs == 0 || bs as usize > MAX_BLOCK_SIZE {
            self.stats.bad_block_size += 1;
            return;
        }
        if bs != self.router_block_size {
            self.stats.block_size_mismatch += 1;
            self.last_mismatch = bs;
            return;
        }
        let bs = bs as usize;
        let mut prev = match &s.parent {
            Some(p) => match self.lookup(p) {
                Some(seq) => Some(seq),
                None => {
                    self.stats.unknown_parent += 1;
                    return;
                }
            },
            None => {
                let lora_id = s.lora_id.map(|i| i.to_string());
                let name = s.lora_name.as_deref().or(match s.lora_id {
                    Some(_) => self.default_lora.as_deref().or(lora_id.as_deref()),
                    None => None,
                });
                name.map(lora_salt)
            }
        };
        let n = s.block_hashes.len();
        let complete = (s.token_ids.len() / bs).min(n);
        self.stats.missing_tokens += (n - complete) as u64;
        let mut per_block = s
            .extra_keys
            .as_deref()
            .and_then(|raw| super::vllm::per_block_keys(raw, n));
        let whole = if per_block.is_none() {
            s.extra_keys.as_deref()
        } else {
            None
        };
        let tier = s.medium.as_deref();
        let tier = medium_tier(tier);
        let mut stored = Vec::with_capacity(complete);
        for i in 0..complete {
            let mut local = local_block_hash(&s.token_ids[i * bs..(i + 1) * bs]);
            let key = per_block.as_mut().and_then(|k| k.next());
            match (key, whole) {
                (Some(k), _) if k != [0xc0] => local = salt_local(local, k),
                (_, Some(w)) if i == 0 => local = salt_local(local, w),
                _ => {}
            }
            let seq = match prev {
                None => local,
                Some(p) => chain(p, local),
            };
            prev = Some(seq);
            self.insert(s.block_hashes[i].clone(), seq, tier, &mut stored, out);
            stored.push(seq);
        }
        flush_stored(tier, &mut stored, &mut self.stats, out);
    }

    /// Maps `key` → `seq` in `tier`. `pending`: this event's stored hashes not yet in
    /// `out`; they are flushed before any eviction so removals never precede the store
    /// of the same block.
    fn insert(
        &mut self,
        key: EngineHash,
        seq: u64,
        tier: Tier,
        pending: &mut Vec<u64>,
        out: &mut Vec<Change>,
    ) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let bit = 1u8 << tier.as_u8();
        if let Some(e) = self.map.get_mut(&key) {
            if e.seq != seq {
                // Same engine hash, different content (e.g. other salt): the old kvroute
                // hash is gone from every tier it was in.
                flush_stored(tier, pending, &mut self.stats, out);
                for t in Tier::ALL {
                    if e.tiers & (1 << t.as_u8()) != 0 {
                        out.push(Change::Removed {
                            tier: t,
                            hashes: vec![e.seq],
                        });
                    }
                }
                e.tiers = 0;
                e.seq = seq;
            }
            e.tiers |= bit;
            e.stamp = stamp;
        } else {
            if self.map.len() >= self.capacity {
                flush_stored(tier, pending, &mut self.stats, out);
            }
            while self.map.len() >= self.capacity {
                self.evict_oldest(out);
            }
            self.map.insert(
                key.clone(),
                Entry {
                    seq,
                    tiers: bit,
                    stamp,
                },
            );
        }
        self.order.push_back((key, stamp));
        self.maybe_compact();
    }

    fn evict_oldest(&mut self, out: &mut Vec<Change>) {
        while let Some((k, stamp)) = self.order.pop_front() {
            let live = self.map.get(&k).is_some_and(|e| e.stamp == stamp);
            if !live {
                continue;
            }
            if let Some(e) = self.map.remove(&k) {
                self.stats.evicted += 1;
                for t in Tier::ALL {
                    if e.tiers & (1 << t.as_u8()) != 0 {
                        out.push(Change::Removed {
                            tier: t,
                            hashes: vec![e.seq],
                        });
                    }
                }
            }
            return;
        }
        // Order lost track (cannot happen while every live entry has its pair): drop
        // an arbitrary entry so the bound still holds.
        let any = self.map.iter().next().map(|(k, _)| k.clone());
        if let Some(k) = any {
            self.order
                .push_back((k.clone(), self.map.get(&k).map_or(0, |e| e.stamp)));
            self.evict_oldest(out);
        }
    }

    /// Keeps `order` within 2 × entries + slack by rebuilding it from the map.
    fn maybe_compact(&mut self) {
        if self.order.len() <= 2 * self.map.len() + 1024 {
            return;
        }
        let mut v: Vec<(EngineHash, u64)> =
            self.map.iter().map(|(k, e)| (k.clone(), e.stamp)).collect();
        v.sort_unstable_by_key(|(_, s)| *s);
        self.order = v.into();
    }

    /// Internal consistency (tests): every live entry has exactly one live order pair.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.map.len() > self.capacity {
            return Err(format!(
                "map {} > capacity {}",
                self.map.len(),
                self.capacity
            ));
        }
        let live = self
            .order
            .iter()
            .filter(|(k, s)| self.map.get(k).is_some_and(|e| e.stamp == *s))
            .count();
        if live != self.map.len() {
            return Err(format!(
                "{live} live order pairs for {} entries",
                self.map.len()
            ));
        }
        if self.map.values().any(|e| e.tiers == 0) {
            return Err("entry without a tier".into());
        }
        Ok(())
    }
}

fn flush_stored(
    tier: Tier,
    pending: &mut Vec<u64>,
    stats: &mut AdapterStats,
    out: &mut Vec<Change>,
) {
    if pending.is_empty() {
        return;
    }
    stats.stored_blocks += pending.len() as u64;
    out.push(Change::Stored {
        tier,
        hashes: std::mem::take(pending),
    });
}
