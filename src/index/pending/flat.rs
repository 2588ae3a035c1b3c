//! A flat open-addressing multimap from block hash to per-worker entries: the table
//! under the speculative pending shard ([`super::PendingShard`]) and the active-block
//! shard ([`crate::load::ActiveBlocksShard`]).
//!
//! Why not a general map: both shards keep a small record per (hash, worker) and look
//! up all workers of a hash at once. A `HashMap<u64, SmallVec<…>>` pays a hasher, a
//! control-byte probe, an inline-or-heap vector and a second probe to delete an emptied
//! key, for every one of the ~64 hashes a decision adds and later removes (callgrind:
//! ~150–200 instructions per hash). Here a (hash, worker) pair is one 16–24-byte slot
//! in one array, found by linear probing from the slot the hash names, so every
//! worker of a hash sits in the same probe run and a lookup is one cache line in the
//! common case.
//!
//! Guarantees:
//! - at most one slot per (hash, worker); every slot is reachable from its home slot
//!   without crossing an empty one (deletion shifts the run back, no tombstones), so
//!   lookups stop at the first empty slot;
//! - the load stays at most 1/2 (the table doubles before an insert would pass it), so
//!   probe runs stay short; [`Table::shrink_if_sparse`] gives back the room of a burst
//!   (amortised O(1) per removal);
//! - pure and panic-free: capacities are powers of two, indices are masked.

use crate::index::shard::QueryRing;
use crate::types::WorkerSlot;

/// `worker` value of an empty slot (worker slots are `u16`, so it never names one).
const EMPTY: u32 = u32::MAX;

/// Tables larger than this (bytes) are read ahead of their probes: smaller ones stay
/// in the L1 cache.
const L1_BYTES: usize = 32 * 1024;

/// Smallest non-empty table (slots).
const MIN_SLOTS: usize = 16;

/// One slot: a (hash, worker) key and its value.
#[derive(Clone, Copy, Debug)]
struct Slot<V> {
    hash: u64,
    worker: u32,
    val: V,
}

/// What a probe for a (hash, worker) key found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The key is at this slot.
    Found(usize),
    /// The key is absent; this empty slot ends its probe run (insert it there).
    Vacant(usize),
}

/// The multimap. `V` is the per-(hash, worker) value.
#[derive(Clone, Debug)]
pub struct Table<V: Copy + Default> {
    slots: Vec<Slot<V>>,
    len: usize,
    /// `64 - log2(slots)` (64 while empty; never used then).
    shift: u32,
    /// Calls of [`Table::shrink_if_sparse`] in a row that found the table sparse.
    sparse_calls: u32,
}

/// A table shrinks only after this many calls of [`Table::shrink_if_sparse`] in a row
/// found it sparse: one long prompt's blocks come and go in far fewer.
pub const SHRINK_AFTER: u32 = 256;

impl<V: Copy + Default> Default for Table<V> {
    fn default() -> Self {
        Table {
            slots: Vec::new(),
            len: 0,
            shift: 64,
            sparse_calls: 0,
        }
    }
}

/// The home slot of `hash` in a table of `2^(64 - shift)` slots: the top bits of one
/// multiplication by 2⁶⁴/φ (Fibonacci hashing). Block hashes are already uniform, and
/// this also spreads structured keys (consecutive or sharing low bits) evenly, for 2
/// instructions instead of the full `mix` finaliser (which also picks the shard, so
/// the top bits of `mix` would be constant within a shard).
#[inline]
fn home(hash: u64, shift: u32) -> usize {
    (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

impl<V: Copy + Default> Table<V> {
    /// Occupied slots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No occupied slot.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allocated slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn empty_slots(n: usize) -> Vec<Slot<V>> {
        vec![
            Slot {
                hash: 0,
                worker: EMPTY,
                val: V::default(),
            };
            n
        ]
    }

    /// Makes room for `more` inserts without passing load 1/2 (so [`Probe::Vacant`]
    /// indices stay valid across them).
    pub fn reserve(&mut self, more: usize) {
        let need = self.len.saturating_add(more).saturating_mul(2);
        if need > self.slots.len() {
            self.rehash(need.max(MIN_SLOTS).next_power_of_two());
        }
    }

    /// Moves every entry into a table of `slots` slots (a power of two ≥ 2 × len).
    fn rehash(&mut self, slots: usize) {
        let old = std::mem::replace(&mut self.slots, Self::empty_slots(slots));
        self.len = 0;
        self.shift = 64 - slots.trailing_zeros();
        for s in old.into_iter().filter(|s| s.worker != EMPTY) {
            if let Probe::Vacant(i) = self.probe(s.hash, s.worker as WorkerSlot) {
                self.put(i, s.hash, s.worker as WorkerSlot, s.val);
            }
        }
    }

    /// Shrinks to 8 slots per entry (at least `floor` slots) once [`SHRINK_AFTER`] calls
    /// in a row found under 1/16 of the slots used in a table larger than `floor`: a
    /// burst's room is not kept (every later probe would land somewhere in it, a cache
    /// miss once it outgrows the cache). The margins keep a table whose live count
    /// swings with long prompts from growing and shrinking around each, in fresh
    /// memory the kernel must zero; the rehash is amortised over the calls.
    pub fn shrink_if_sparse(&mut self, floor: usize) {
        let cap = self.slots.len();
        if cap <= floor || self.len * 16 >= cap {
            self.sparse_calls = 0;
            return;
        }
        self.sparse_calls += 1;
        if self.sparse_calls >= SHRINK_AFTER {
            self.sparse_calls = 0;
            let want = (self.len * 8).max(floor).max(MIN_SLOTS).next_power_of_two();
            if want < cap {
                self.rehash(want);
            }
        }
    }

    /// Finds the slot of (hash, worker), or the empty slot where it would go.
    /// Call [`Self::reserve`] before inserting at a `Vacant` slot.
    #[inline]
    pub fn probe(&self, hash: u64, worker: WorkerSlot) -> Probe {
        let mask = self.slots.len().wrapping_sub(1);
        if self.slots.is_empty() {
            return Probe::Vacant(0);
        }
        let w = u32::from(worker);
        let mut i = home(hash, self.shift);
        loop {
            let s = &self.slots[i];
            if s.worker == EMPTY {
                return Probe::Vacant(i);
            }
            if s.hash == hash && s.worker == w {
                return Probe::Found(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot of (hash, worker), if present.
    #[inline]
    pub fn find(&self, hash: u64, worker: WorkerSlot) -> Option<usize> {
        match self.probe(hash, worker) {
            Probe::Found(i) => Some(i),
            Probe::Vacant(_) => None,
        }
    }

    /// Puts a new entry at `i`, a [`Probe::Vacant`] index of the same key (with room
    /// reserved). An index out of range is ignored.
    #[inline]
    pub fn put(&mut self, i: usize, hash: u64, worker: WorkerSlot, val: V) {
        if let Some(s) = self.slots.get_mut(i) {
            if s.worker == EMPTY {
                *s = Slot {
                    hash,
                    worker: u32::from(worker),
                    val,
                };
                self.len += 1;
            }
        }
    }

    /// The value at an occupied slot `i`.
    #[inline]
    pub fn val_mut(&mut self, i: usize) -> Option<&mut V> {
        self.slots
            .get_mut(i)
            .filter(|s| s.worker != EMPTY)
            .map(|s| &mut s.val)
    }

    /// Removes (hash, worker) and returns its value, if present: one probe.
    #[inline]
    pub fn take(&mut self, hash: u64, worker: WorkerSlot) -> Option<V> {
        let i = self.find(hash, worker)?;
        let v = self.slots[i].val;
        self.remove_at(i);
        Some(v)
    }

    /// Removes the entry at slot `i` and shifts the rest of its probe run back so no
    /// entry is cut off from its home (no tombstones).
    #[inline]
    pub fn remove_at(&mut self, mut i: usize) {
        let n = self.slots.len();
        if i >= n || self.slots[i].worker == EMPTY {
            return;
        }
        let mask = n - 1;
        self.len -= 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.worker == EMPTY {
                break;
            }
            // `s` may fill the hole at `i` when its home is not in the cyclic range
            // (i, j]: moving it back to `i` keeps it reachable from its home.
            let h = home(s.hash, self.shift);
            let dist_home = j.wrapping_sub(h) & mask;
            let dist_hole = j.wrapping_sub(i) & mask;
            if dist_home >= dist_hole {
                self.slots[i] = s;
                i = j;
            }
        }
        self.slots[i].worker = EMPTY;
    }

    /// Calls `f(worker, value)` for every entry of `hash`.
    #[inline]
    pub fn for_each_of(&self, hash: u64, mut f: impl FnMut(WorkerSlot, &V)) {
        if self.slots.is_empty() {
            return;
        }
        let mask = self.slots.len() - 1;
        let mut i = home(hash, self.shift);
        loop {
            let s = &self.slots[i];
            if s.worker == EMPTY {
                return;
            }
            if s.hash == hash {
                f(s.worker as WorkerSlot, &s.val);
            }
            i = (i + 1) & mask;
        }
    }

    /// Calls `f(position, worker, value)` for every entry of every `(position, hash)`
    /// item, in order. Once the table outgrows the L1 cache each item's home slot is
    /// prefetched ahead of its probe through the index query's ring
    /// ([`QueryRing`]), so a long prompt's misses overlap instead of stalling one
    /// after another (a query's items are only read, so the lines can be asked for
    /// early without a pass of their own, unlike [`Table::touch`]).
    #[inline]
    pub fn for_each_at(&self, items: &[(u32, u64)], mut f: impl FnMut(u32, WorkerSlot, &V)) {
        if self.slots.is_empty() {
            return;
        }
        let far = self.outgrows_l1();
        let key_of = |it: &(u32, u64)| it.1;
        let prefetch = |h| {
            if far {
                self.prefetch(h);
            }
        };
        let mut ring = QueryRing::new();
        ring.start(items, key_of, prefetch);
        for (i, &(pos, _)) in items.iter().enumerate() {
            let h = ring.key(items, i, key_of, prefetch);
            self.for_each_of(h, |w, v| f(pos, w, v));
        }
    }

    /// Whether the table is larger than the L1 cache: only then is reading ahead worth
    /// its instructions.
    #[inline(always)]
    fn outgrows_l1(&self) -> bool {
        self.slots.len() * std::mem::size_of::<Slot<V>>() > L1_BYTES
    }

    /// Starts loading the home slot of `hash` (a hint: no effect on contents).
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        if let Some(s) = self.slots.get(home(hash, self.shift)) {
            crate::mem::prefetch(s);
        }
    }

    /// Reads the home slot of every hash once, so a following pass over the same
    /// hashes finds their cache lines loaded: the loads are independent, so the core
    /// overlaps their misses instead of waiting for each in turn (a software prefetch
    /// without `unsafe`). Only worth it once the table outgrows the L1 cache.
    #[inline]
    pub fn touch(&self, hashes: &[u64]) {
        if hashes.len() < 8 || !self.outgrows_l1() {
            return;
        }
        let mut acc = 0u64;
        for &h in hashes {
            acc ^= self.slots[home(h, self.shift) & (self.slots.len() - 1)].hash;
        }
        std::hint::black_box(acc);
    }

    /// Keeps the entries for which `keep(hash, worker, value)` is true (rebuilds the
    /// table: O(capacity); for rare, fleet-wide changes).
    pub fn retain(&mut self, mut keep: impl FnMut(u64, WorkerSlot, &mut V) -> bool) {
        let n = self.slots.len();
        let mut old = std::mem::replace(&mut self.slots, Self::empty_slots(n));
        self.len = 0;
        for s in old.iter_mut().filter(|s| s.worker != EMPTY) {
            if keep(s.hash, s.worker as WorkerSlot, &mut s.val) {
                if let Probe::Vacant(i) = self.probe(s.hash, s.worker as WorkerSlot) {
                    self.put(i, s.hash, s.worker as WorkerSlot, s.val);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, WorkerSlot, u32),
        Remove(u64, WorkerSlot),
        Shrink,
        RetainOdd,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct hashes and workers, so probe runs collide and wrap.
        let h = 0u64..40;
        let w = 0u16..4;
        prop_oneof![
            6 => (h.clone(), w.clone(), any::<u32>()).prop_map(|(h, w, v)| Op::Insert(h, w, v)),
            5 => (h, w).prop_map(|(h, w)| Op::Remove(h, w)),
            1 => Just(Op::Shrink),
            1 => Just(Op::RetainOdd),
        ]
    }

    fn check(t: &Table<u32>, model: &BTreeMap<(u64, WorkerSlot), u32>) {
        assert_eq!(t.len(), model.len());
        assert!(t.capacity() == 0 || t.len() * 2 <= t.capacity());
        for h in 0..40u64 {
            let mut got = Vec::new();
            t.for_each_of(h, |w, v| got.push((w, *v)));
            got.sort_unstable();
            let want: Vec<(WorkerSlot, u32)> = model
                .range((h, 0)..=(h, WorkerSlot::MAX))
                .map(|(&(_, w), &v)| (w, v))
                .collect();
            assert_eq!(got, want, "hash {h}");
            for w in 0..4 {
                assert_eq!(t.find(h, w).is_some(), model.contains_key(&(h, w)));
            }
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec(op(), 0..300)) {
            let mut t = Table::<u32>::default();
            let mut model = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(h, w, v) => {
                        t.reserve(1);
                        match t.probe(h, w) {
                            Probe::Found(i) => *t.val_mut(i).unwrap() = v,
                            Probe::Vacant(i) => t.put(i, h, w, v),
                        }
                        model.insert((h, w), v);
                    }
                    Op::Remove(h, w) => {
                        if let Some(i) = t.find(h, w) {
                            t.remove_at(i);
                        }
                        model.remove(&(h, w));
                    }
                    Op::Shrink => t.shrink_if_sparse(16),
                    Op::RetainOdd => {
                        t.retain(|h, _, _| h % 2 == 1);
                        model.retain(|&(h, _), _| h % 2 == 1);
                    }
                }
                check(&t, &model);
            }
        }
    }

    #[test]
    fn wrapping_runs_survive_removal() {
        // Fill one table densely with keys whose homes crowd the end of the array, then
        // remove them in an order that forces back-shifts across the wrap.
        let mut t = Table::<u32>::default();
        t.reserve(8);
        let mask = t.capacity() - 1;
        let keys: Vec<u64> = (0..10_000u64)
            .filter(|&h| home(h, t.shift) >= mask - 1)
            .take(8)
            .collect();
        for (n, &h) in keys.iter().enumerate() {
            if let Probe::Vacant(i) = t.probe(h, 0) {
                t.put(i, h, 0, n as u32);
            }
        }
        for (n, &h) in keys.iter().enumerate() {
            let i = t.find(h, 0).unwrap();
            t.remove_at(i);
            for &k in &keys[n + 1..] {
                assert!(t.find(k, 0).is_some(), "{k} lost after removing {h}");
            }
        }
        assert!(t.is_empty());
    }

    #[test]
    fn for_each_at_visits_every_entry_of_every_item_in_order() {
        // Small (no read-ahead) and past the L1 cache (read-ahead), with repeated,
        // absent and multi-worker hashes, and lists shorter and longer than the lead.
        for n in [10u64, 20_000] {
            let mut t = Table::<u32>::default();
            t.reserve(n as usize * 2);
            for h in 0..n {
                for w in 0..(h % 3) as WorkerSlot {
                    if let Probe::Vacant(i) = t.probe(h, w) {
                        t.put(i, h, w, (h * 10) as u32 + u32::from(w));
                    }
                }
            }
            let ahead = crate::index::shard::QUERY_AHEAD;
            for len in [0usize, 1, ahead, ahead + 1, 500] {
                let items: Vec<(u32, u64)> = (0..len as u32)
                    .map(|p| (p * 2, u64::from(p) * 7 % (n + 5)))
                    .collect();
                let mut got = Vec::new();
                t.for_each_at(&items, |p, w, v| got.push((p, w, *v)));
                let mut want = Vec::new();
                for &(p, h) in &items {
                    t.for_each_of(h, |w, v| want.push((p, w, *v)));
                }
                assert_eq!(got, want, "table of {n}, {len} items");
            }
        }
    }

    #[test]
    fn shrinks_after_a_burst() {
        let mut t = Table::<u32>::default();
        t.reserve(100_000);
        for h in 0..100_000u64 {
            if let Probe::Vacant(i) = t.probe(h, 1) {
                t.put(i, h, 1, 0);
            }
        }
        let big = t.capacity();
        for h in 10..100_000u64 {
            let i = t.find(h, 1).unwrap();
            t.remove_at(i);
        }
        // Sparse, but not yet for long enough; then shrunk.
        for _ in 1..SHRINK_AFTER {
            t.shrink_if_sparse(4096);
        }
        assert_eq!(t.capacity(), big);
        t.shrink_if_sparse(4096);
        assert!(t.capacity() <= 4096, "{} of {big}", t.capacity());
        for h in 0..10u64 {
            assert!(t.find(h, 1).is_some());
        }
    }
}
