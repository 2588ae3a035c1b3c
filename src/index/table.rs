//! The hash table of a shard: `mix`ed block hash → [`Holders`].
//!
//! Open addressing with linear probing kept in Robin Hood order (each cluster sorted by
//! home slot), backward-shift deletion (no tombstones, so churn never degrades probes)
//! and 16-byte slots holding key and value together, without separate control bytes:
//! a lookup touches one cache line in the common case, and [`Table::prefetch`] can
//! request it (and the next one, for the shifts of inserts and removals) ahead of
//! time. An empty slot is one whose [`Holders`] is empty, which the index never
//! stores, so every `u64` is a valid key.
//!
//! Guarantees:
//! - keys are `mix`ed hashes (uniformly random): the home slot is the key's low 32 bits
//!   scaled to the capacity (`(lo32 · cap) >> 32`, Lemire's multiply-shift range
//!   reduction), independent of the top bits that choose the shard. Any capacity works,
//!   not only powers of two, so the table can grow in small steps;
//! - the load factor stays ≤ 13/20 (every probe ends at an empty slot, at the latest).
//!   Why so low: with linear probing an insert shifts the cluster up to the next free
//!   slot, ~`1 / (2 (1 − α)²)` slots on average: 4 at α = 0.65 but 9 at 0.76 and 13 at
//!   0.8, where the shifts cross cache lines no prefetch covers. Measured on a
//!   800k-entry shard, the 4/5 limit of the power-of-two table made store + remove
//!   3× slower. When a [`Table::reserve`] would exceed 13/20 the table grows ×1.3 to
//!   load 1/2, so slots cost 16 / 0.5 = 32 bytes per block right after a growth and
//!   25–32 bytes in general; [`Table::shrink_to`] gives memory back the same way;
//! - at most 2^32 slots (the reduction's range); no operation panics: slot accesses go
//!   through `get`, and positions stay below the capacity.

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

/// Largest capacity: the home slot is computed from 32 key bits.
const MAX_CAP: usize = 1 << 32;

/// Robin Hood hash table of the index. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// `0` or at least [`MIN_CAP`] slots (at most [`MAX_CAP`]).
    slots: Vec<Slot>,
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

    /// Asks the CPU to start loading `key`'s home slot and the cache line after it (a
    /// no-op off x86-64). Why two lines: an insert or a removal shifts the cluster
    /// from the key's slot onwards, which crosses into the next line about half the
    /// time; prefetching it too took a 800k-entry shard from 11 to 16 M events/s.
    #[inline(always)]
    pub(crate) fn prefetch(&self, key: u64) {
        prefetch_home_and(&self.slots, key, 64);
    }

    /// The slots, read-only, for a query's loop (see [`Reader`]).
    #[inline(always)]
    pub(crate) fn reader(&self) -> Reader<'_> {
        Reader { slots: &self.slots }
    }

    /// Home slot of `key`: below the capacity (0 when unallocated).
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        home(&self.slots, key)
    }

    /// The slot after `i`, wrapping at the end.
    #[inline(always)]
    fn next(&self, i: usize) -> usize {
        let n = i + 1;
        if n >= self.slots.len() {
            0
        } else {
            n
        }
    }

    /// Distance of the key in slot `i` from its home slot.
    #[inline(always)]
    fn dist(&self, i: usize, key: u64) -> usize {
        let h = self.home(key);
        if i >= h {
            i - h
        } else {
            i + self.slots.len() - h
        }
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
        let mut i = self.home(key);
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
            i = self.next(i);
        }
    }

    /// Holders in slot `i` (empty for a free or out-of-range slot).
    #[cfg(test)]
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
        if need.saturating_mul(20) > self.slots.len().saturating_mul(13)
            && self.slots.len() < MAX_CAP
        {
            self.rebuild(Self::cap_for(need));
        }
    }

    /// Capacity for `n` keys at load 1/2 (see the module docs), within the bounds.
    fn cap_for(n: usize) -> usize {
        n.saturating_mul(2).clamp(MIN_CAP, MAX_CAP)
    }

    /// Inserts `key` (absent) with `hs` (non-empty) at `pos`, the vacant position just
    /// returned by [`Table::find_or_slot`], shifting the rest of the cluster by one.
    /// The caller must have reserved room.
    #[inline]
    pub(crate) fn insert_at(&mut self, pos: usize, key: u64, hs: Holders) {
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
            i = self.next(i);
        }
    }

    /// Removes the key in slot `i`, a slot found occupied since the last modification
    /// (the caller may have emptied its holders in between), shifting its cluster's
    /// followers back.
    #[inline]
    pub(crate) fn remove_at(&mut self, i: usize) {
        let mut hole = i;
        if i >= self.slots.len() {
            return;
        }
        for _ in 0..self.slots.len() {
            let next = self.next(hole);
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
        let mut i = self.next(start);
        while left > 0 {
            let keep = match self.slots.get_mut(i) {
                Some(s) if !s.hs.is_empty() => f(&mut s.hs),
                _ => true,
            };
            if keep {
                i = self.next(i);
                left -= 1;
            } else {
                // The follower (if any) moves into `i`: visit it there.
                self.remove_at(i);
                if !matches!(self.slots.get(i), Some(s) if !s.hs.is_empty()) {
                    i = self.next(i);
                    left -= 1;
                }
            }
        }
    }

    /// Shrinks the slot array to fit `n` keys at load 1/2 (never below the current
    /// length), if it is at least twice that.
    pub(crate) fn shrink_to(&mut self, n: usize) {
        let cap = Self::cap_for(n.max(self.len));
        if cap.saturating_mul(2) <= self.slots.len() {
            self.rebuild(cap);
        }
    }

    /// Re-inserts every key into a new array of `cap` slots.
    fn rebuild(&mut self, cap: usize) {
        let mut slots = Vec::with_capacity(cap);
        crate::mem::advise_huge_pages(&mut slots);
        slots.resize(cap, FREE);
        let old = std::mem::replace(&mut self.slots, slots);
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

/// Home slot of `key` in `slots`: below the capacity, 0 when unallocated.
#[inline(always)]
fn home(slots: &[Slot], key: u64) -> usize {
    // cap ≤ 2^32, so the product fits in 64 bits and the result is < cap.
    (((key as u32 as u64) * slots.len() as u64) >> 32) as usize
}

/// Prefetches the line of `key`'s home slot and the line `then` bytes past that
/// slot's start (the same line when they coincide). A no-op off x86-64.
#[inline(always)]
fn prefetch_home_and(slots: &[Slot], key: u64, then: usize) {
    // The address is in (or, for an unallocated table, at) the slot array.
    let p = slots.as_ptr().wrapping_add(home(slots, key)).cast::<u8>();
    crate::mem::prefetch(p);
    crate::mem::prefetch(p.wrapping_add(then));
}

/// A [`Table`]'s slots borrowed for the read path: what a query's loop keeps in
/// registers (the slice's pointer and length) instead of reloading them through the
/// table for every block.
///
/// Why a lookup needs no Robin Hood distance check: linear probing alone guarantees
/// that a present key lies between its home slot and the first free slot after it
/// (inserts and backward-shift removals keep clusters contiguous); the distance check
/// only shortens unsuccessful probes, which a query meets at most once (its first
/// miss ends it), while it costs a multiply and a compare on every displaced slot of
/// every hit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reader<'a> {
    slots: &'a [Slot],
}

impl Reader<'_> {
    /// Home slot of `key` (as `Table::home`): below the capacity, 0 when unallocated.
    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        home(self.slots, key)
    }

    /// Asks the CPU to start loading what a lookup of `key` reads: the cache lines of
    /// its home slot and of the slot after it (the same line three times in four).
    /// Why not [`Table::prefetch`]'s two lines: a lookup shifts nothing, and every
    /// useless line in flight takes a miss slot from the next keys' lookups. A no-op
    /// off x86-64.
    #[inline(always)]
    pub(crate) fn prefetch_lookup(&self, key: u64) {
        prefetch_home_and(self.slots, key, std::mem::size_of::<Slot>());
    }

    /// Holders of `key`, if present. Scans from the home slot to the key or the first
    /// free slot (see the type's docs). The home slot, where about half the hits are,
    /// is checked inline; the rest of the cluster by [`Reader::lookup_after`].
    #[inline(always)]
    pub(crate) fn lookup(&self, key: u64) -> Option<Holders> {
        let home = self.home(key);
        let s = self.slots.get(home)?;
        if s.key == key {
            // A free slot (whatever its key) ends the cluster: the key is absent.
            return if s.hs.is_empty() { None } else { Some(s.hs) };
        }
        if s.hs.is_empty() {
            return None;
        }
        self.lookup_after(home, key)
    }

    /// [`Reader::lookup`] past the home slot `home`, the end of the array wrapping to
    /// slot 0. Terminates: the load factor leaves a free slot, and the scan visits
    /// each slot at most once.
    #[inline]
    fn lookup_after(&self, home: usize, key: u64) -> Option<Holders> {
        let n = self.slots.len();
        let mut i = home;
        for _ in 1..n {
            i = if i + 1 < n { i + 1 } else { 0 };
            let s = self.slots.get(i)?;
            if s.key == key {
                return if s.hs.is_empty() { None } else { Some(s.hs) };
            }
            if s.hs.is_empty() {
                return None;
            }
        }
        None
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
        let r = t.reader();
        for (k, v) in model {
            let i = t.find(*k).expect("key present");
            assert_eq!(t.holders(i), Holders::single(*v));
            // The query's probe (no distance check, wrap off the hot path) agrees.
            r.prefetch_lookup(*k);
            assert_eq!(r.lookup(*k), Some(Holders::single(*v)));
        }
        // Absent keys, including 0 (the key of a free slot) and keys whose home is
        // at either end of the array, are not found.
        for k in [0u64, 1, 0xFFFF_FFFF, 0xFFFF_FFF8, 5 << 40, (31 << 40) | 7] {
            if !model.contains_key(&k) {
                assert_eq!(r.lookup(k), None, "{k:#x}");
            }
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
            // Low 32 bits near 0 or near 2^32 give homes at both ends, so clusters also
            // wrap around the table's end.
            let lo = if rng.random_bool(0.5) { 0 } else { 0xFFFF_FFF8 };
            let k = (rng.random_range(0..32u64) << 40) | lo | rng.random_range(0..8u64);
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
            // The full check walks every key: after every step at first, then every
            // 16th (the length after each), which keeps the test quick in debug builds.
            if round < 2_000 || round % 16 == 0 {
                check(&t, &model);
            } else {
                assert_eq!(t.len(), model.len());
            }
            assert!(t.len() * 20 <= t.slots.len() * 13 || t.len() <= 1);
        }
    }

    #[test]
    fn empty_table_finds_nothing() {
        let mut t = Table::default();
        assert!(t.find(7).is_none());
        t.reader().prefetch_lookup(7);
        assert_eq!(t.reader().lookup(7), None);
        assert_eq!(t.reader().lookup(0), None);
        t.remove_at(0);
        t.retain(|_| false);
        t.shrink_to(0);
        assert_eq!(t.len(), 0);
    }
}
