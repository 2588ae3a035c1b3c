//! Compact storage of the (worker, tier) entries holding one block.
//!
//! An entry is packed in a `u32`: `slot (16 bits) | tier (2 bits) | generation (14 bits)`.
//! The top 18 bits (slot, tier) are the entry's *key*; a holder set contains at most one
//! entry per key, and keeps its entries sorted by value — hence by (slot, tier), so the
//! entries of one worker are adjacent and its best tier comes first.
//!
//! [`Holders`] is 8 bytes: one or two entries inline (the common case: a block cached by
//! one or two workers), or a tag plus the index of a sorted `Vec<u32>` in a side [`Slab`]
//! for three or more. Tier value 3 never occurs in a real entry, which makes the `EMPTY`
//! and `SPILL` tags unambiguous.

use crate::types::{Tier, WorkerSlot};

/// Bits of the generation field of a packed entry.
pub(crate) const GEN_BITS: u32 = 14;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
/// Number of distinct generations a packed entry can carry.
pub(crate) const GEN_PERIOD: u32 = 1 << GEN_BITS;

/// "No entry" marker (tier bits 3: never a real entry).
const EMPTY: u32 = u32::MAX;
/// First word of a spilled holder set; the second word is the slab index.
const SPILL: u32 = u32::MAX - 1;

/// Packs (slot, tier, generation) into an entry.
#[inline]
pub(crate) fn pack(slot: WorkerSlot, tier: Tier, gen: u16) -> u32 {
    ((slot as u32) << 16) | ((tier.as_u8() as u32) << GEN_BITS) | (gen as u32 & GEN_MASK)
}

/// Worker slot of an entry.
#[inline]
pub(crate) fn slot_of(e: u32) -> WorkerSlot {
    (e >> 16) as WorkerSlot
}

/// Tier index (0..=2) of an entry.
#[inline]
pub(crate) fn tier_idx(e: u32) -> usize {
    ((e >> GEN_BITS) & 3) as usize
}

/// Tier of an entry (entries are only ever built from a real [`Tier`]; index 3 would
/// read as disk). A table lookup: the `match` compiled to a branch chain.
#[inline(always)]
pub(crate) fn tier_of(e: u32) -> Tier {
    const TIERS: [Tier; 4] = [Tier::Device, Tier::Host, Tier::Disk, Tier::Disk];
    TIERS[tier_idx(e) & 3]
}

/// Generation of an entry.
#[inline]
pub(crate) fn gen_of(e: u32) -> u16 {
    (e & GEN_MASK) as u16
}

/// (slot, tier) key of an entry: equal keys = same worker and tier.
#[inline]
pub(crate) fn key_of(e: u32) -> u32 {
    e >> GEN_BITS
}

/// Side storage for holder sets of three or more entries: sorted `Vec<u32>`s addressed
/// by a `u32` index, with a free list so indices are reused.
#[derive(Default, Debug)]
pub(crate) struct Slab {
    lists: Vec<Vec<u32>>,
    free: Vec<u32>,
}

impl Slab {
    fn alloc(&mut self, list: Vec<u32>) -> u32 {
        if let Some(i) = self.free.pop() {
            self.lists[i as usize] = list;
            i
        } else {
            // A u32 index covers 4 billion spilled blocks, far beyond what the per-worker
            // caps let a shard hold in memory.
            debug_assert!(self.lists.len() < SPILL as usize);
            self.lists.push(list);
            (self.lists.len() - 1) as u32
        }
    }

    /// Releases list `i` (its memory too) and returns its contents.
    fn release(&mut self, i: u32) -> Vec<u32> {
        self.free.push(i);
        std::mem::take(&mut self.lists[i as usize])
    }

    /// Heap bytes held by the slab (list headers, list contents, free list).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.lists.capacity() * std::mem::size_of::<Vec<u32>>()
            + self.lists.iter().map(|l| l.capacity() * 4).sum::<usize>()
            + self.free.capacity() * 4
    }

    /// Number of lists currently in use.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.lists.len() - self.free.len()
    }
}

/// The set of entries holding one block (8 bytes). Never empty while in the index map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holders {
    w: [u32; 2],
}

impl Holders {
    /// The empty set (marks a free slot of the index table).
    pub(crate) const NONE: Holders = Holders { w: [EMPTY, EMPTY] };

    /// A set holding exactly `e`.
    #[inline]
    pub(crate) fn single(e: u32) -> Holders {
        Holders { w: [e, EMPTY] }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.w[0] == EMPTY
    }

    #[inline]
    fn is_spilled(&self) -> bool {
        self.w[0] == SPILL
    }

    /// The entries, sorted by value.
    #[inline]
    pub(crate) fn entries<'a>(&'a self, slab: &'a Slab) -> &'a [u32] {
        if self.is_spilled() {
            slab.lists
                .get(self.w[1] as usize)
                .map_or(&[][..], |l| l.as_slice())
        } else if self.w[0] == EMPTY {
            &[]
        } else if self.w[1] == EMPTY {
            &self.w[..1]
        } else {
            &self.w[..]
        }
    }

    /// Index (in [`Holders::entries`]) of the entry with key `key`, if any.
    #[inline]
    pub(crate) fn find(&self, slab: &Slab, key: u32) -> Option<usize> {
        let es = self.entries(slab);
        if es.len() <= 2 {
            es.iter().position(|&e| key_of(e) == key)
        } else {
            es.binary_search_by_key(&key, |&e| key_of(e)).ok()
        }
    }

    /// Replaces entry `i` by `e`, which must have the same key (order is preserved).
    pub(crate) fn set(&mut self, slab: &mut Slab, i: usize, e: u32) {
        if self.is_spilled() {
            if let Some(slot) = slab
                .lists
                .get_mut(self.w[1] as usize)
                .and_then(|l| l.get_mut(i))
            {
                *slot = e;
            }
        } else if let Some(slot) = self.w.get_mut(i) {
            *slot = e;
        }
    }

    /// Inserts `e`, whose key must not be present yet.
    #[inline]
    pub(crate) fn insert(&mut self, slab: &mut Slab, e: u32) {
        if self.is_spilled() {
            self.insert_spilled(slab, e);
        } else if self.w[0] == EMPTY {
            self.w = [e, EMPTY];
        } else if self.w[1] == EMPTY {
            self.w = if e < self.w[0] {
                [e, self.w[0]]
            } else {
                [self.w[0], e]
            };
        } else {
            self.spill(slab, e);
        }
    }

    #[inline(never)]
    fn insert_spilled(&self, slab: &mut Slab, e: u32) {
        if let Some(list) = slab.lists.get_mut(self.w[1] as usize) {
            let at = list.partition_point(|&x| x < e);
            list.insert(at, e);
        }
    }

    /// Moves a full inline set plus `e` to the slab.
    #[inline(never)]
    fn spill(&mut self, slab: &mut Slab, e: u32) {
        let mut list = Vec::with_capacity(4);
        list.extend_from_slice(&self.w);
        let at = list.partition_point(|&x| x < e);
        list.insert(at, e);
        self.w = [SPILL, slab.alloc(list)];
    }

    /// Removes entry `i`; a spilled set that drops to two entries moves back inline.
    #[inline]
    pub(crate) fn remove(&mut self, slab: &mut Slab, i: usize) {
        if self.is_spilled() {
            self.remove_spilled(slab, i);
        } else {
            match i {
                0 => self.w = [self.w[1], EMPTY],
                1 => self.w[1] = EMPTY,
                _ => {}
            }
        }
    }

    #[inline(never)]
    fn remove_spilled(&mut self, slab: &mut Slab, i: usize) {
        let idx = self.w[1];
        let Some(list) = slab.lists.get_mut(idx as usize) else {
            return;
        };
        if i < list.len() {
            list.remove(i);
        }
        if list.len() <= 2 {
            let list = slab.release(idx);
            self.w = [
                list.first().copied().unwrap_or(EMPTY),
                list.get(1).copied().unwrap_or(EMPTY),
            ];
        }
    }

    /// Keeps the entries for which `keep` is true (calling `keep` exactly once per
    /// entry); a spilled set that drops to two entries or fewer moves back inline.
    pub(crate) fn retain(&mut self, slab: &mut Slab, mut keep: impl FnMut(u32) -> bool) {
        if self.is_spilled() {
            let idx = self.w[1];
            let Some(list) = slab.lists.get_mut(idx as usize) else {
                self.w = [EMPTY, EMPTY];
                return;
            };
            list.retain(|&e| keep(e));
            if list.len() <= 2 {
                let list = slab.release(idx);
                self.w = [
                    list.first().copied().unwrap_or(EMPTY),
                    list.get(1).copied().unwrap_or(EMPTY),
                ];
            } else if list.capacity() > 2 * list.len() + 4 {
                list.shrink_to(list.len() + list.len() / 4);
            }
        } else {
            let keep0 = self.w[0] != EMPTY && keep(self.w[0]);
            let keep1 = self.w[1] != EMPTY && keep(self.w[1]);
            self.w = match (keep0, keep1) {
                (true, true) => self.w,
                (true, false) => [self.w[0], EMPTY],
                (false, true) => [self.w[1], EMPTY],
                (false, false) => [EMPTY, EMPTY],
            };
        }
    }

    /// True when both inline words are used: the next insert would spill, so the shard
    /// first purges stale entries.
    #[inline]
    pub(crate) fn is_full_inline(&self) -> bool {
        !self.is_spilled() && self.w[1] != EMPTY
    }
}
