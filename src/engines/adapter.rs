//! Engine events → kvroute index changes for one worker.
//!
//! The adapter recomputes kvroute's sequence hashes (DESIGN §1, salted as described in
//! the `engines` module docs, [`super::hashing`]) from each `BlockStored`'s
//! `token_ids`, continuing the chain from the kvroute hash of `parent_block_hash`, and
//! keeps one entry per engine hash with the copies the engine announced: a reference
//! count per (KV cache group, tier). Stores add one, removes take one away, as vLLM's
//! offloading connector asks consumers to do (it re-announces shared hashes once per
//! chunk). A block is in the index for a tier while it is *present* there
//! ([`super::groups`]): held by the full-attention groups, and by the windowed groups
//! or continued by a present block. So a removal in one group never removes a block
//! another group still makes reusable.
//!
//! Guarantees:
//! - the map never holds more than `capacity` entries; when full, the least recently
//!   stored entry is evicted and a `Removed` for it is emitted first, so every block the
//!   index holds for this worker stays removable (index ⊆ map);
//! - an event whose parent is unknown (joined mid-stream, or evicted) stores nothing;
//!   blocks without complete tokens are not stored; all such cases are counted;
//! - a `BlockStored` whose block size (its own, else the endpoint's fallback) differs
//!   from the router's is refused and counted (`block_size_mismatch`): its blocks
//!   would be hashed over other token spans than routing requests are, so they could
//!   never match; likewise one whose lookahead differs from `lookahead_tokens`;
//! - a medium neither engine defines is counted (`unknown_medium`) and credited to the
//!   configured tier (default disk; settings never allow device).

use super::groups::{Groups, MAX_GROUPS};
use super::hashing::{stored_hashes, Refused};
use super::output::push;
pub use super::output::{AdapterStats, Change};
use super::{medium_tier, EngineEvent, EngineHash, Stored};
use crate::hash::MAX_BLOCK_SIZE;
use crate::types::Tier;
use ahash::RandomState;
use hashbrown::HashMap;
use smallvec::SmallVec;
use std::collections::VecDeque;

/// Copies of a block one group announced in one tier.
#[derive(Clone, Copy, Debug)]
struct Hold {
    group: u8,
    tier: u8,
    count: u32,
}

#[derive(Clone, Debug)]
struct Entry {
    seq: u64,
    /// The engine hash this block continues (for the windowed-group rule).
    parent: Option<EngineHash>,
    holds: SmallVec<[Hold; 2]>,
    /// Bit per tier: present in the index.
    present: u8,
    stamp: u64,
}

impl Entry {
    fn new(seq: u64, parent: Option<EngineHash>, stamp: u64) -> Entry {
        Entry {
            seq,
            parent,
            holds: SmallVec::new(),
            present: 0,
            stamp,
        }
    }

    fn held(&self, tier: usize) -> u32 {
        self.holds
            .iter()
            .filter(|h| usize::from(h.tier) == tier && h.count > 0)
            .fold(0, |m, h| m | (1 << h.group))
    }

    fn idle(&self) -> bool {
        self.holds.is_empty()
    }
}

/// Per-worker adapter state.
pub struct Adapter {
    block_size: u32,
    /// The block size the router hashes requests with; stored events must match it.
    router_block_size: u32,
    /// The block size of the last mismatched event (for the operator's log line).
    pub last_mismatch: u32,
    /// The router's `lookahead_tokens`; the engine's of the last refused event.
    lookahead: usize,
    pub last_lookahead: usize,
    capacity: usize,
    default_lora: Option<String>,
    unknown_tier: Tier,
    /// The first unknown medium seen (for the one warning per worker).
    pub unknown_medium: Option<String>,
    groups: Groups,
    map: HashMap<EngineHash, Entry, RandomState>,
    /// Per engine hash and tier: blocks continuing it that are present in the index.
    /// Kept apart from the entries, so a block evicted and stored again finds the
    /// continuations it has (never more entries than present blocks). Empty unless
    /// some group is windowed: only then do children decide presence.
    kids: HashMap<EngineHash, [u32; 3], RandomState>,
    /// Keys in store order with the stamp they had; stale pairs are skipped lazily.
    order: VecDeque<(EngineHash, u64)>,
    next_stamp: u64,
    /// Length of `out` when the current event began: changes merge only within one
    /// event (the index sees each event's changes as one operation per kind and tier).
    mark: usize,
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
            lookahead: 0,
            last_lookahead: 0,
            capacity: capacity.max(1),
            default_lora,
            unknown_tier: Tier::Disk,
            unknown_medium: None,
            groups: Groups::default(),
            map: HashMap::with_hasher(RandomState::new()),
            kids: HashMap::with_hasher(RandomState::new()),
            order: VecDeque::new(),
            next_stamp: 0,
            mark: 0,
            stats: AdapterStats::default(),
        }
    }

    /// Sets the router's block size when it differs from the fallback `block_size`
    /// given to [`Adapter::new`] (every stored event must then carry the router's).
    pub fn with_router_block_size(mut self, bs: u32) -> Adapter {
        self.router_block_size = bs;
        self
    }

    /// The tier credited for a medium neither engine defines (default disk).
    pub fn with_unknown_medium_tier(mut self, t: Tier) -> Adapter {
        self.unknown_tier = t;
        self
    }

    /// The router's `lookahead_tokens` (default 0).
    pub fn with_lookahead(mut self, l: usize) -> Adapter {
        self.lookahead = l;
        self
    }

    /// The block size stored events must have.
    pub fn router_block_size(&self) -> u32 {
        self.router_block_size
    }

    /// The tier credited for an unknown medium.
    pub fn unknown_tier(&self) -> Tier {
        self.unknown_tier
    }

    /// The lookahead stored events must have.
    pub fn lookahead(&self) -> usize {
        self.lookahead
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

    /// Forgets everything (the caller clears the index). Learned groups stay.
    pub fn clear(&mut self) {
        self.map.clear();
        self.kids.clear();
        self.order.clear();
    }

    fn tier(&mut self, medium: Option<&str>, locality: Option<&str>) -> Tier {
        match medium_tier(medium, locality) {
            Some(t) => t,
            None => {
                self.stats.unknown_medium += 1;
                if self.unknown_medium.is_none() {
                    self.unknown_medium =
                        Some(medium.unwrap_or_default().chars().take(64).collect());
                }
                self.unknown_tier
            }
        }
    }

    /// Applies one event, appending the index changes to `out` in order.
    pub fn apply(&mut self, ev: &EngineEvent, out: &mut Vec<Change>) {
        self.mark = out.len();
        match ev {
            EngineEvent::Stored(s) => self.stored(s, out),
            EngineEvent::Removed {
                block_hashes,
                medium,
                group,
                locality,
            } => {
                let tier = self.tier(medium.as_deref(), locality.as_deref());
                let Some(g) = self.group(*group) else {
                    return;
                };
                for h in block_hashes {
                    if !self.release(h, g, tier, out) {
                        self.stats.unknown_removed += 1;
                    }
                }
                self.maybe_compact();
            }
            EngineEvent::AllCleared { medium } => match medium {
                None => {
                    self.clear();
                    out.push(Change::Cleared { tier: None });
                }
                Some(m) => {
                    let tier = self.tier(Some(m), None);
                    let (t, bit) = (tier as usize, 1u8 << tier.as_u8());
                    self.map.retain(|_, e| {
                        e.holds.retain(|h| usize::from(h.tier) != t);
                        e.present &= !bit;
                        !e.idle()
                    });
                    self.kids.retain(|_, k| {
                        k[t] = 0;
                        *k != [0; 3]
                    });
                    out.push(Change::Cleared { tier: Some(tier) });
                    self.maybe_compact();
                }
            },
        }
    }

    fn group(&mut self, g: Option<u32>) -> Option<u8> {
        match g.unwrap_or(0) {
            g if (g as usize) < MAX_GROUPS => Some(g as u8),
            _ => {
                self.stats.bad_group += 1;
                None
            }
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
        let Some(g) = self.group(s.group) else {
            return;
        };
        let parent_seq = match &s.parent {
            Some(p) => match self.lookup(p) {
                Some(seq) => Some(seq),
                None => {
                    self.stats.unknown_parent += 1;
                    return;
                }
            },
            None => None,
        };
        let bs = bs as usize;
        let n = s.block_hashes.len();
        let complete = (s.token_ids.len() / bs).min(n);
        let seqs = match stored_hashes(
            s,
            bs,
            complete,
            parent_seq,
            self.default_lora.as_deref(),
            self.lookahead,
        ) {
            Ok(v) => v,
            Err(Refused::Lookahead { engine }) => {
                self.stats.lookahead_mismatch += 1;
                self.last_lookahead = engine;
                return;
            }
        };
        self.stats.missing_tokens += (n - complete) as u64;
        let tier = self.tier(s.medium.as_deref(), s.locality.as_deref());
        if self.groups.learn(g as usize, s.spec_kind.as_deref()) {
            self.reevaluate_all(out);
        }
        let mut parent = s.parent.clone();
        for (i, seq) in seqs.into_iter().enumerate() {
            let key = s.block_hashes[i].clone();
            self.hold(key.clone(), parent.take(), seq, g, tier, out);
            parent = Some(key);
        }
    }

    /// One more copy of `key` (kvroute hash `seq`, continuing `parent`) in group `g`,
    /// tier `tier`. The common cases (a known block stored again, a new block while the
    /// map has room) cost one lookup.
    fn hold(
        &mut self,
        key: EngineHash,
        parent: Option<EngineHash>,
        seq: u64,
        g: u8,
        tier: Tier,
        out: &mut Vec<Change>,
    ) {
        use hashbrown::hash_map::Entry as Slot;
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.order.push_back((key.clone(), stamp));
        let hybrid = self.groups.hybrid();
        let again = hybrid.then(|| key.clone());
        let room = self.map.len() < self.capacity;
        let e = match self.map.entry(key) {
            Slot::Occupied(o) if o.get().seq == seq => o.into_mut(),
            Slot::Vacant(v) if room => v.insert(Entry::new(seq, parent, stamp)),
            // Same engine hash, different content (e.g. another salt): the old block
            // is gone from every tier it was in. Or the map is full: make room first.
            slot => {
                let key = slot.key().clone();
                if self.map.contains_key(&key) {
                    self.drop_entry(&key, out);
                }
                self.make_room(out);
                self.map
                    .entry(key)
                    .or_insert_with(|| Entry::new(seq, parent, stamp))
            }
        };
        e.stamp = stamp;
        let t = tier.as_u8();
        match e.holds.iter_mut().find(|h| h.group == g && h.tier == t) {
            Some(h) => h.count = h.count.saturating_add(1),
            None => e.holds.push(Hold {
                group: g,
                tier: t,
                count: 1,
            }),
        }
        match again {
            Some(key) => self.update(&key, tier, out),
            // Not hybrid: presence depends on the entry alone, no second lookup.
            None => {
                if let Some(now) = flip(&self.groups, e, tier, false) {
                    push(out, self.mark, now, tier, e.seq);
                    self.stats.count(now);
                }
            }
        }
        self.maybe_compact();
    }

    /// Evicts until a new entry fits under the bound.
    fn make_room(&mut self, out: &mut Vec<Change>) {
        while self.map.len() >= self.capacity {
            if !self.evict_oldest(out) {
                break;
            }
        }
    }

    /// One copy fewer of `key` in group `g`, tier `tier`. False if none was held.
    fn release(&mut self, key: &EngineHash, g: u8, tier: Tier, out: &mut Vec<Change>) -> bool {
        use hashbrown::hash_map::EntryRef;
        let t = tier.as_u8();
        let hybrid = self.groups.hybrid();
        let EntryRef::Occupied(mut o) = self.map.entry_ref(key) else {
            return false;
        };
        let e = o.get_mut();
        let Some(i) = e.holds.iter().position(|h| h.group == g && h.tier == t) else {
            return false;
        };
        e.holds[i].count -= 1;
        if e.holds[i].count == 0 {
            e.holds.swap_remove(i);
        }
        if hybrid {
            self.update(key, tier, out);
            if self.map.get(key).is_some_and(Entry::idle) {
                self.map.remove(key);
            }
            return true;
        }
        // Not hybrid: presence depends on the entry alone, one lookup in all.
        if let Some(now) = flip(&self.groups, e, tier, false) {
            push(out, self.mark, now, tier, e.seq);
            self.stats.count(now);
        }
        if e.idle() {
            o.remove();
        }
        true
    }

    /// Recomputes whether `key` is present in `tier`; a change is pushed to `out` and
    /// propagated to its parent's child count (and on up while presence changes).
    fn update(&mut self, key: &EngineHash, tier: Tier, out: &mut Vec<Change>) {
        let t = tier as usize;
        if !self.groups.hybrid() {
            // Children never matter: no continuation counts to read or keep.
            if let Some(e) = self.map.get_mut(key) {
                if let Some(now) = flip(&self.groups, e, tier, false) {
                    push(out, self.mark, now, tier, e.seq);
                    self.stats.count(now);
                }
            }
            return;
        }
        let mut at = key.clone();
        loop {
            let child = self.kids.get(&at).is_some_and(|k| k[t] > 0);
            let Some(e) = self.map.get_mut(&at) else {
                return;
            };
            let Some(now) = flip(&self.groups, e, tier, child) else {
                return;
            };
            push(out, self.mark, now, tier, e.seq);
            self.stats.count(now);
            let Some(p) = e.parent.clone() else {
                return;
            };
            let k = self.kids.entry(p.clone()).or_insert([0; 3]);
            if now {
                k[t] += 1;
            } else {
                k[t] = k[t].saturating_sub(1);
                if *k == [0; 3] {
                    self.kids.remove(&p);
                }
            }
            at = p;
        }
    }

    /// Re-evaluates every block after the learned groups changed. Continuation counts
    /// are kept only while some group is windowed (else children never matter): they
    /// are rebuilt from the present blocks first, then kept by `update`.
    fn reevaluate_all(&mut self, out: &mut Vec<Change>) {
        self.kids = self.continuations();
        let keys: Vec<EngineHash> = self.map.keys().cloned().collect();
        for k in keys {
            for t in Tier::ALL {
                self.update(&k, t, out);
            }
        }
    }

    /// Removes `key` from the map, its present tiers from the index, and its presence
    /// from its parent's child counts.
    fn drop_entry(&mut self, key: &EngineHash, out: &mut Vec<Change>) {
        if let Some(e) = self.map.get_mut(key) {
            e.holds.clear();
        }
        for t in Tier::ALL {
            self.update(key, t, out);
        }
        self.map.remove(key);
    }

    /// Evicts the least recently stored entry. False if none was found.
    fn evict_oldest(&mut self, out: &mut Vec<Change>) -> bool {
        while let Some((k, stamp)) = self.order.pop_front() {
            if self.map.get(&k).is_some_and(|e| e.stamp == stamp) {
                self.stats.evicted += 1;
                self.drop_entry(&k, out);
                return true;
            }
        }
        // Order lost track (cannot happen while every live entry has its pair): drop
        // any entry so the bound still holds.
        match self.map.keys().next().cloned() {
            Some(k) => {
                self.stats.evicted += 1;
                self.drop_entry(&k, out);
                true
            }
            None => false,
        }
    }

    /// What `kids` holds, counted afresh from the present blocks: per engine hash and
    /// tier, the present blocks continuing it; nothing unless some group is windowed.
    fn continuations(&self) -> HashMap<EngineHash, [u32; 3], RandomState> {
        let mut kids = HashMap::with_hasher(RandomState::new());
        for e in self.map.values().filter(|_| self.groups.hybrid()) {
            let Some(p) = &e.parent else {
                continue;
            };
            for t in 0..3 {
                if e.present & (1 << t) != 0 {
                    kids.entry(p.clone()).or_insert([0; 3])[t] += 1;
                }
            }
        }
        kids
    }

    /// Keeps `order` within 2 × entries + slack by rebuilding it from the map, in its
    /// own buffer (over twice what the rebuild needs: no fresh memory to fault in).
    fn maybe_compact(&mut self) {
        if self.order.len() <= 2 * self.map.len() + 1024 {
            return;
        }
        let mut v: Vec<(EngineHash, u64)> = std::mem::take(&mut self.order).into();
        v.clear();
        v.extend(self.map.iter().map(|(k, e)| (k.clone(), e.stamp)));
        v.sort_unstable_by_key(|(_, s)| *s);
        self.order = v.into();
    }

    /// The (kvroute hash, tier) pairs the index should hold for this worker (tests).
    #[doc(hidden)]
    pub fn present(&self) -> Vec<(u64, Tier)> {
        let mut v: Vec<(u64, Tier)> = self
            .map
            .values()
            .flat_map(|e| {
                Tier::ALL
                    .into_iter()
                    .filter(|t| e.present & (1 << t.as_u8()) != 0)
                    .map(|t| (e.seq, t))
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Internal consistency (tests): the bound, live order pairs, presence and child
    /// counts as the groups rule says.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.map.len() > self.capacity {
            return Err(format!(
                "map {} > capacity {}",
                self.map.len(),
                self.capacity
            ));
        }
        if self.continuations() != self.kids {
            return Err("continuation counts out of date".into());
        }
        for (k, e) in &self.map {
            if e.idle() {
                return Err("idle entry kept".into());
            }
            for t in 0..3 {
                let child = self.kids.get(k).is_some_and(|c| c[t] > 0);
                let p = self.groups.present(e.held(t), child);
                if p != (e.present & (1 << t) != 0) {
                    return Err(format!("presence of tier {t} out of date"));
                }
            }
        }
        Ok(())
    }
}

/// Sets `e`'s presence bit for `tier` to what the groups rule says; the new presence
/// if it changed.
fn flip(groups: &Groups, e: &mut Entry, tier: Tier, child_present: bool) -> Option<bool> {
    let bit = 1u8 << tier.as_u8();
    let now = groups.present(e.held(tier as usize), child_present);
    if now == (e.present & bit != 0) {
        return None;
    }
    e.present ^= bit;
    Some(now)
}
