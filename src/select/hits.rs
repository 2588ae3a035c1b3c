//! [`Hits`]: one request's prefix overlap and active-block reuse for every worker of
//! a [`Fleet`], by position, in the dense form the selection kernel reads
//! (DESIGN §1 "Cost").
//!
//! The caller (engine, service) writes the merge result straight in:
//! [`Hits::begin`] gives every worker the request's base overlap (the shared-cache
//! run from position 0) and no reuse, then [`Hits::set_overlap`] and
//! [`Hits::add_reuse`] write the workers the index merge and the active-block count
//! found. There is no intermediate list: each hit costs one position lookup and one
//! 16-byte store, which is what a request with a thousand hits pays before the kernel
//! runs.
//!
//! Overlaps are one [`Overlap`] per position (16 bytes, so one store per hit; the AVX2
//! kernel transposes four at a time). Reuse is a `u32` column materialised on the
//! first nonzero reuse; until then every position reads 0 from a column that is never
//! written.
//!
//! Every figure is saturated at [`MAX_BLOCKS`] (2^31 − 1 blocks, far beyond any
//! prompt), so the kernel converts them to `f64` with one signed instruction.
//!
//! Guarantees: after `begin(fleet, base)` and any sequence of writes, [`Hits::at`]
//! equals "base, then each write in order (a later overlap for a worker wins, reuse
//! adds up), each figure saturated at [`MAX_BLOCKS`]"; writes for slots not in the fleet are ignored; no method
//! panics; no allocation once the buffers have grown to the fleet size.

use super::fleet::Fleet;
use crate::types::{Overlap, WorkerSlot};

/// Largest overlap or reuse a [`Hits`] holds, in blocks; larger figures are cut to it.
pub const MAX_BLOCKS: u32 = i32::MAX as u32;

/// `o` with every figure saturated at [`MAX_BLOCKS`].
#[inline(always)]
fn saturated(o: &Overlap) -> Overlap {
    Overlap {
        device: o.device.min(MAX_BLOCKS),
        host: o.host.min(MAX_BLOCKS),
        disk: o.disk.min(MAX_BLOCKS),
        shared: o.shared.min(MAX_BLOCKS),
    }
}

/// One request's overlap and reuse of every worker. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Hits {
    n: usize,
    ov: Vec<Overlap>,
    reuse: Vec<u32>,
    /// `reuse` holds `n` valid entries.
    reuse_full: bool,
    /// Some position may have a disk or shared overlap (never cleared by a write).
    extra: bool,
    /// At least `n` zeros, never written otherwise.
    zeros: Vec<u32>,
    /// Position of the worker the request's prefix was last routed to
    /// ([`super::Affinity`]), preferred among near ties.
    affinity: Option<usize>,
    /// Where the affinity worker comes from.
    affinity_source: super::AffinitySource,
    /// Largest `Overlap::own` written (or the base's).
    max_own: u32,
}

/// The columns of one request (each `len()` long, or cut by [`Columns::slice`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Columns<'a> {
    pub ov: &'a [Overlap],
    pub reuse: &'a [u32],
    /// False: every disk and shared overlap is 0 (true promises nothing).
    pub extra: bool,
}

impl<'a> Columns<'a> {
    /// The columns restricted to `r` (empty where `r` is out of range).
    pub fn slice(&self, r: std::ops::Range<usize>) -> Columns<'a> {
        Columns {
            ov: self.ov.get(r.clone()).unwrap_or_default(),
            reuse: self.reuse.get(r).unwrap_or_default(),
            extra: self.extra,
        }
    }
}

impl Hits {
    /// Starts a request on `fleet`: every worker gets overlap `base` and no reuse.
    pub fn begin(&mut self, fleet: &Fleet, base: Overlap) {
        self.reset(fleet.len(), base);
    }

    /// The worker in `slot` has overlap `o` (ignored if `slot` is not in `fleet`).
    #[inline]
    pub fn set_overlap(&mut self, fleet: &Fleet, slot: WorkerSlot, o: &Overlap) {
        if let Some(p) = fleet.position(slot) {
            self.set_overlap_at(p, o);
        }
    }

    /// The worker in `slot` reuses `r` more active blocks (ignored if `slot` is not in
    /// `fleet`).
    #[inline]
    pub fn add_reuse(&mut self, fleet: &Fleet, slot: WorkerSlot, r: u32) {
        if let Some(p) = fleet.position(slot) {
            self.add_reuse_at(p, r);
        }
    }

    /// The request's prefix was last routed to the worker in `slot` (see
    /// [`super::Affinity`]); `None`, or a slot not in `fleet`, clears it. Call after
    /// [`Hits::begin`], which clears it too.
    ///
    /// A worker that holds more of the prompt than the affinity worker cancels it: the
    /// affinity stands for a cache the index cannot see (evicted, or not reported
    /// yet), not against one it sees elsewhere. Call after the overlaps are written.
    #[inline]
    pub fn set_affinity(&mut self, fleet: &Fleet, slot: Option<WorkerSlot>) {
        self.affinity = slot
            .and_then(|s| fleet.position(s))
            .filter(|&p| p < self.n)
            .filter(|&p| self.ov.get(p).is_some_and(|o| o.own() >= self.max_own));
        self.affinity_source = super::AffinitySource::Prefix;
    }

    /// The request's session last went to the worker in `slot` (see
    /// [`super::Sessions`]): it becomes the affinity worker, in place of any prefix
    /// affinity, whatever other workers hold of this prompt. `None`, or a slot not in
    /// `fleet`, leaves the affinity as it is. Call after [`Hits::set_affinity`].
    #[inline]
    pub fn set_session(&mut self, fleet: &Fleet, slot: Option<WorkerSlot>) {
        if let Some(p) = slot.and_then(|s| fleet.position(s)).filter(|&p| p < self.n) {
            self.affinity = Some(p);
            self.affinity_source = super::AffinitySource::Session;
        }
    }

    /// Position of the affinity worker, if any.
    #[inline]
    pub(crate) fn affinity(&self) -> Option<usize> {
        self.affinity
    }

    /// Where the affinity worker comes from (meaningful with an affinity).
    pub(crate) fn affinity_source(&self) -> super::AffinitySource {
        self.affinity_source
    }

    /// Number of positions.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True for a request on an empty fleet.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Every one of `n` positions gets overlap `base` and no reuse.
    pub(crate) fn reset(&mut self, n: usize, base: Overlap) {
        self.n = n;
        self.affinity = None;
        self.affinity_source = super::AffinitySource::Prefix;
        let base = saturated(&base);
        self.max_own = base.own();
        if self.zeros.len() < n {
            self.zeros.resize(n, 0);
        }
        self.ov.clear();
        self.ov.resize(n, base);
        self.reuse_full = false;
        self.extra = base.disk != 0 || base.shared != 0;
    }

    /// Position `p` has overlap `o` (ignored out of range).
    #[inline(always)]
    pub(crate) fn set_overlap_at(&mut self, p: usize, o: &Overlap) {
        if let Some(x) = self.ov.get_mut(p) {
            *x = saturated(o);
            self.extra |= o.disk != 0 || o.shared != 0;
            self.max_own = self.max_own.max(x.own());
        }
    }

    /// Position `p` reuses `r` more blocks (ignored out of range).
    #[inline(always)]
    pub(crate) fn add_reuse_at(&mut self, p: usize, r: u32) {
        if p >= self.n || r == 0 {
            return;
        }
        if !self.reuse_full {
            self.reuse.clear();
            self.reuse.resize(self.n, 0);
            self.reuse_full = true;
        }
        if let Some(x) = self.reuse.get_mut(p) {
            *x = x.saturating_add(r).min(MAX_BLOCKS);
        }
    }

    /// Both columns, `len()` long.
    pub(crate) fn columns(&self) -> Columns<'_> {
        let reuse = if self.reuse_full {
            &self.reuse
        } else {
            &self.zeros
        };
        Columns {
            ov: self.ov.get(..self.n).unwrap_or_default(),
            reuse: reuse.get(..self.n).unwrap_or_default(),
            extra: self.extra,
        }
    }

    /// Overlap and reuse of position `p` (zero out of range).
    pub(crate) fn at(&self, p: usize) -> (Overlap, u32) {
        let c = self.columns();
        (
            c.ov.get(p).copied().unwrap_or_default(),
            c.reuse.get(p).copied().unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::WorkerSpec;
    use proptest::prelude::*;

    fn ov(d: u32, h: u32, k: u32, s: u32) -> Overlap {
        Overlap {
            device: d,
            host: h,
            disk: k,
            shared: s,
        }
    }

    fn fleet(n: usize) -> Fleet {
        let specs: Vec<WorkerSpec> = (0..n).map(|i| WorkerSpec::new(format!("w{i}"))).collect();
        Fleet::new(&specs)
    }

    #[test]
    fn base_everywhere_then_hits() {
        let f = fleet(4);
        let mut h = Hits::default();
        h.begin(&f, ov(0, 0, 0, 3));
        assert_eq!(h.len(), 4);
        let p1 = f.position(1).unwrap_or(usize::MAX);
        assert_eq!(h.at(p1), (ov(0, 0, 0, 3), 0));
        h.set_overlap(&f, 1, &ov(5, 2, 0, 0));
        h.add_reuse(&f, 1, 4);
        h.add_reuse(&f, 1, 1);
        assert_eq!(h.at(p1), (ov(5, 2, 0, 0), 5));
        // Figures saturate at MAX_BLOCKS.
        h.add_reuse(&f, 1, u32::MAX);
        h.set_overlap(&f, 2, &ov(u32::MAX, 1, u32::MAX, 0));
        let p2 = f.position(2).unwrap_or(usize::MAX);
        assert_eq!(h.at(p1).1, MAX_BLOCKS);
        assert_eq!(h.at(p2).0, ov(MAX_BLOCKS, 1, MAX_BLOCKS, 0));
        // Unknown slots and positions are ignored.
        h.set_overlap(&f, 9, &ov(1, 1, 1, 1));
        h.add_reuse(&f, 9, 1);
        assert_eq!(h.at(9), (Overlap::default(), 0));
        assert_eq!(h.columns().ov.len(), 4);
        assert_eq!(h.columns().reuse.len(), 4);
    }

    #[test]
    fn begin_forgets_the_previous_request() {
        let f = fleet(3);
        let mut h = Hits::default();
        h.begin(&f, Overlap::default());
        h.set_overlap(&f, 2, &ov(1, 2, 3, 4));
        h.add_reuse(&f, 2, 7);
        h.begin(&f, Overlap::default());
        let c = h.columns();
        assert!(c.ov.iter().all(|o| *o == Overlap::default()));
        assert!(c.reuse.iter().all(|&x| x == 0));
    }

    proptest! {
        /// Against the obvious model: a vector of (overlap, reuse) per position.
        #[test]
        fn matches_a_plain_model(
            n in 0usize..40,
            base in (0u32..3, 0u32..3, 0u32..3, 0u32..3),
            ops in prop::collection::vec(
                (0usize..45, any::<bool>(), 0u32..4, 0u32..4, 0u32..4, 0u32..4), 0..60),
            rounds in 1usize..3,
        ) {
            let mut h = Hits::default();
            for _ in 0..rounds {
                let b = ov(base.0, base.1, base.2, base.3);
                h.reset(n, b);
                let mut model = vec![(b, 0u32); n];
                for &(p, is_reuse, a, x, k, s) in &ops {
                    if is_reuse {
                        h.add_reuse_at(p, a);
                        if let Some(m) = model.get_mut(p) {
                            m.1 += a;
                        }
                    } else {
                        h.set_overlap_at(p, &ov(a, x, k, s));
                        if let Some(m) = model.get_mut(p) {
                            m.0 = ov(a, x, k, s);
                        }
                    }
                }
                for (p, m) in model.iter().enumerate() {
                    prop_assert_eq!(h.at(p), *m);
                }
                let c = h.columns();
                if !c.extra {
                    prop_assert!(c.ov.iter().all(|o| o.disk == 0 && o.shared == 0));
                }
                prop_assert_eq!(c.ov.len(), n);
                prop_assert_eq!(c.reuse.len(), n);
            }
        }
    }
}
