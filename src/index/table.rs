//! The hash table of a shard: `mix`ed block hash → [`Holders`].
//!
//! Open addressing with linear probing kept in Robin Hood order (each cluster sorted by
//! home slot), backward-shift deletion (no tombstones, so churn never degrades probes)
//! and 16-byte slots holding key and value together, without separate control bytes:
//! a lookup touches one cache line in the common case, and [`Table::prefetch`] can
//! request that line ahead of time. An empty slot is one whose [`Holders`] is empty,
//! which the index never stores, so every `u64` is a valid key.
//!
//! Guarantees:
//! - keys are `mix`ed hashes (uniformly random): the home slot is the key's low bits,
//!   independent of the top bits that choose the shard;
//! - the load factor stays ≤ 4/5 (every probe ends at an empty slot, at the latest);
//!   the table doubles when a [`Table::reserve`] would exceed it and halves its memory
//!   on [`Table::shrink_to`], so slots cost ≤ 16 / 0.4 = 40 bytes per block right after
//!   a doubling and 20–40 bytes in general;
//! - no operation panics: slot accesses go through `get`, positions are masked.

use super::holders::Holders;

/// One slot: a key and its holders (empty holders = free slot).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
struct Slot {
    key: u64,
    hs: Holders,
}

const FREE: Slot = Slot {
    key: 0,
    hs: Holders::NONE,
};

/// Smallest non-zero capacity.
const MIN_CAP: usize = 16;

/// Robin Hood hash table of the index. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// `0` or a power of two slots.
    slots: Vec<Slot>,
    /// `slots.len() - 1` (0 when unallocated).
    mask: usize,
    len: usize,
}

/// Where [`Table::find_or_slot`] found a key, or where it would be inserted.
pub(crate) enum Probe {
    Found(usize),
    Vacant(usize),
}

impl Table {
    /// Number of keys.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes of the slot array.
    pub(crate) fn allocation_size(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// Asks the CPU to start loading `key`'s home slot (a no-op off x86-64).
    #[inline(always)]
    pub(crate) fn prefetch(&self, key: u64) {
        #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.slots.as_ptr().wrapping_add(key as usize & self.mask);
            // SAFETY: a prefetch never faults and reads nothing architecturally; the
            // address is in (or, for an unallocated table, at) the slot array.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) };
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
        let _ = key;
    }

    /// Distance of the key in slot `i` from its home slot.
    #[inline(always)]
    fn dist(&self, i: usize, key: u64) -> usize {
        i.wrapping_sub(key as usize) & self.mask
    }

    /// Slot of `key`, if present.
    #[inline]
    pub(crate) fn find(&self, key: u64) -> Option<usize> {
        match self.find_or_slot(key) {
            Probe::Found(i) => Some(i),
            Probe::Vacant(_) => None,
        }
    }

    /// Slot of `key`, or the slot where [`Table::insert_at`] must put it. The vacant
    /// position is only valid until the table is next modified.
    #[inline]
    pub(crate) fn find_or_slot(&self, key: u64) -> Probe {
        let mask = self.mask;
        let mut i = key as usize & mask;
        let mut d = 0usize;
        loop {
            let Some(s) = self.slots.get(i) else {
                return Probe::Vacant(i); // unallocated table
            };
            if s.hs.is_empty() {
                return Probe::Vacant(i);
            }
            if s.key == key {
                return Probe::Found(i);
            }
            if self.dist(i, s.key) < d {
                return Probe::Vacant(i);
            }
            d += 1;
            i = (i + 1) & mask;
        }
    }

    /// Holders in slot `i` (empty for a free or out-of-range slot).
    #[inline]
    pub(crate) fn holders(&self, i: usize) -> Holders {
        self.slots.get(i).map_or(Holders::NONE, |s| s.hs)
    }

    /// Holders in slot `i` for update; `None` out of range.
    #[inline]
    pub(crate) fn holders_mut(&mut self, i: usize) -> Option<&mut Holders> {
        self.slots.get_mut(i).map(|s| &mut s.hs)
    }

    /// Makes room for `additional` more keys without exceeding the load factor, so that
    /// positions from [`Table::find_or_slot`] stay valid across that many inserts.
    pub(crate) fn reserve(&mut self, additional: usize) {
        let need = self.len.saturating_add(additional);
        if need.saturating_mul(5) > self.slots.len().saturating_mul(4) {
            self.rebuild(Self::cap_for(need.max(self.len.saturating_mul(2))));
        }
    }

    /// Smallest capacity holding `n` keys within the load factor.
    fn cap_for(n: usize) -> usize {
        let min = n.saturating_mul(5) / 4 + 1;
        min.max(MIN_CAP)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1))
    }

    /// Inserts `key` (absent) with `hs` (non-empty) at `pos`, the vacant position just
    /// returned by [`Table::find_or_slot`], shifting the rest of the cluster by one.
    /// The caller must have reserved room.
    #[inline]
    pub(crate) fn insert_at(&mut self, pos: usize, key: u64, hs: Holders) {
        let mask = self.mask;
        let mut carry = Slot { key, hs };
        let mut i = pos;
        // Terminates: the load factor leaves a free slot, which ends the carry.
        for _ in 0..self.slots.len() {
            let Some(s) = self.slots.get_mut(i) else {
                return;
            };
            std::mem::swap(s, &mut carry);
            if carry.hs.is_empty() {
                self.len += 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes the key in slot `i`, a slot found occupied since the last modification
    /// (the caller may have emptied its holders in between), shifting its cluster's
    /// followers back.
    #[inline]
    pub(crate) fn remove_at(&mut self, i: usize) {
        let mask = self.mask;
        let mut hole = i;
        if i >= self.slots.len() {
            return;
        }
        for _ in 0..self.slots.len() {
            let next = (hole + 1) & mask;
            let moved = match self.slots.get(next) {
                Some(s) if !s.hs.is_empty() && self.dist(next, s.key) != 0 => *s,
                _ => break,
            };
            if let Some(h) = self.slots.get_mut(hole) {
                *h = moved;
            }
            hole = next;
        }
        if let Some(h) = self.slots.get_mut(hole) {
            *h = FREE;
        }
        self.len = self.len.saturating_sub(1);
    }

    /// Calls `f` once on every key's holders; removes the keys for which it returns
    /// false (in place, no allocation).
    pub(crate) fn retain(&mut self, mut f: impl FnMut(&mut Holders) -> bool) {
        let n = self.slots.len();
        // Start right after a free slot: no cluster crosses it, so shifting never moves
        // an unvisited key before the cursor or a visited one after it.
        let Some(start) = self.slots.iter().position(|s| s.hs.is_empty()) else {
            return;
        };
        let mut left = n - 1;
        let mut i = (start + 1) & self.mask;
        while left > 0 {
            let keep = match self.slots.get_mut(i) {
                Some(s) if !s.hs.is_empty() => f(&mut s.hs),
                _ => true,
            };
            if keep {
                i = (i + 1) & self.mask;
                left -= 1;
            } else {
                // The follower (if any) moves into `i`: visit it there.
                self.remove_at(i);
                if !matches!(self.slots.get(i), Some(s) if !s.hs.is_empty()) {
                    i = (i + 1) & self.mask;
                    left -= 1;
                }
            }
        }
    }

    /// Shrinks the slot array to fit `n` keys (never below the current length).
    pub(crate) fn shrink_to(&mut self, n: usize) {
        let cap = Self::cap_for(n.max(self.len));
        if cap < self.slots.len() {
            self.rebuild(cap);
        }
    }

    /// Re-inserts every key into a new array of `cap` slots.
    fn rebuild(&mut self, cap: usize) {
        let old = std::mem::replace(&mut self.slots, vec![FREE; cap]);
        self.mask = cap - 1;
        self.len = 0;
        for s in old.into_iter().filter(|s| !s.hs.is_empty()) {
            if let Probe::Vacant(pos) = self.find_or_slot(s.key) {
                self.insert_at(pos, s.key, s.hs);
            }
        }
    }

    /// Every (key, holders) pair, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Holders)> {
        self.slots
            .iter()
            .filter(|s| !s.hs.is_empty())
            .map(|s| (s.key, &s.hs))
    }
}

#[cfg(test)]
mod tests {
    use super::{Probe, Table};
    use crate::index::holders::Holders;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    /// Robin Hood order: every key is reachable from its home without a free slot or a
    /// less displaced key in between, and `len` counts the keys.
    fn check(t: &Table, model: &HashMap<u64, u32>) {
        assert_eq!(t.len(), model.len());
        assert_eq!(t.iter().count(), model.len());
        for (k, v) in model {
            let i = t.find(*k).expect("key present");
            assert_eq!(t.holders(i), Holders::single(*v));
        }
    }

    #[test]
    fn random_ops_match_a_hashmap() {
        let mut rng = SmallRng::seed_from_u64(3);
        let mut t = Table::default();
        let mut model = HashMap::new();
        // Small key space with colliding low bits (the home slot) forces long clusters,
        // wrap-around at the table's end and every shift path.
        for round in 0..20_000u32 {
            let k = (rng.random_range(0..64u64) << 40) | rng.random_range(0..8u64);
            match rng.random_range(0..4) {
                0 | 1 => {
                    t.reserve(1);
                    match t.find_or_slot(k) {
                        Probe::Found(i) => {
                            *t.holders_mut(i).expect("slot") = Holders::single(round);
                        }
                        Probe::Vacant(pos) => t.insert_at(pos, k, Holders::single(round)),
                    }
                    model.insert(k, round);
                }
                2 => {
                    if let Some(i) = t.find(k) {
                        t.remove_at(i);
                    }
                    model.remove(&k);
                }
                _ => {
                    if round % 500 == 0 {
                        let odd = |hs: &Holders| hs.entries(&Default::default())[0] % 2 == 1;
                        let mut seen = 0;
                        t.retain(|hs| {
                            seen += 1;
                            odd(hs)
                        });
                        assert_eq!(seen, model.len(), "retain visits each key once");
                        model.retain(|_, v| *v % 2 == 1);
                        t.shrink_to(0);
                    }
                }
            }
            check(&t, &model);
            assert!(t.len() * 5 <= t.slots.len() * 4);
        }
    }

    #[test]
    fn empty_table_finds_nothing() {
        let mut t = Table::default();
        assert!(t.find(7).is_none());
        t.remove_at(0);
        t.retain(|_| false);
        t.shrink_to(0);
        assert_eq!(t.len(), 0);
    }
}
