//! [`Fleet`]: the static, per-registry part of every worker's filter data, laid out as
//! a struct of arrays so the selection loop reads a few contiguous integers per worker
//! instead of chasing `WorkerRow::spec` (DESIGN §1 "Selection").
//!
//! Strings (model, worker id, taints, topology) are interned to small integers once,
//! when the fleet is built; a request's filters are resolved against the interner once
//! per decision ([`Fleet::model_id`], [`Fleet::id_of`], [`Fleet::tolerations`]), so the
//! per-worker checks are integer compares and a bitmask test.
//!
//! For the `kv` kernel (`kernel.rs`) the fleet also fixes a *position* order: rows
//! stably sorted by (model, role) with roles ordered Prefill, Aggregated, Decode,
//! Shared, so every stage pool (prefill, aggregated, decode, aggregated + decode) of a
//! model is one contiguous range of positions, and per-worker arrays laid out by
//! position ([`super::Loads`]) are scanned densely.
//!
//! Guarantees:
//! - built from the worker specs in row order; `decide` uses it only when its length
//!   equals the number of rows (otherwise it builds its own, allocating);
//! - filter outcomes equal the string-based definitions exactly: taints beyond the 63
//!   first distinct ones share an overflow bit whose workers fall back to comparing
//!   strings, and unknown names (a model, pin or toleration no worker has) map to ids
//!   that match nothing.

use crate::types::{DeviceClass, Role, WorkerSlot, WorkerSpec};
use std::collections::HashMap;
use std::ops::Range;

/// Bit of a role in a pool mask.
pub(crate) const fn role_bit(r: Role) -> u8 {
    1 << (r as u8)
}

/// Id of a name that no worker carries: matches nothing.
pub(crate) const UNKNOWN: u32 = u32::MAX;

/// Bit of a taint that has no bit of its own (the 64th and later distinct taints).
const OVERFLOW_BIT: u64 = 1 << 63;

/// Interns strings to dense ids.
///
/// The empty string (the default model) is answered without a map lookup: finding it
/// in the map compares two empty strings, whose pointers are dangling, and glibc's
/// AVX-512 `memcmp` of a dangling pointer takes a fault-suppression assist even for
/// 0 bytes — ~220 ns per comparison on the bench machine (AMD EPYC, KVM), which was
/// most of a 2-worker decision (`benches/vs_dynamo`, docs/PERFORMANCE.md).
#[derive(Clone, Debug, Default)]
struct Interner {
    ids: HashMap<String, u32>,
    /// Id of the empty string, once interned (it is in `ids` too).
    empty: Option<u32>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        let next = self.ids.len() as u32;
        if s.is_empty() {
            if let Some(id) = self.empty {
                return id;
            }
            // No equal key is present, so the insert compares no two empty strings.
            self.ids.insert(String::new(), next);
            self.empty = Some(next);
            return next;
        }
        *self.ids.entry(s.to_owned()).or_insert(next)
    }

    fn get(&self, s: &str) -> u32 {
        if s.is_empty() {
            return self.empty.unwrap_or(UNKNOWN);
        }
        self.ids.get(s).copied().unwrap_or(UNKNOWN)
    }
}

/// Static filter data of every worker, in row order. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    pub(crate) model: Vec<u32>,
    /// `role_bit(spec.role)`.
    pub(crate) role: Vec<u8>,
    pub(crate) cpu: Vec<bool>,
    pub(crate) dp_lo: Vec<u32>,
    pub(crate) dp_hi: Vec<u32>,
    /// One bit per interned taint; [`OVERFLOW_BIT`] for the rest.
    pub(crate) taints: Vec<u64>,
    pub(crate) topology: Vec<u32>,
    pub(crate) capacity: Vec<f64>,
    /// Interned worker id (pin).
    pub(crate) id: Vec<u32>,
    /// Worker ids and taint names, for the allow-list and overflow-taint slow paths.
    pub(crate) names: Vec<String>,
    pub(crate) taint_names: Vec<Vec<String>>,
    /// Registry slot of each row.
    pub(crate) slot: Vec<WorkerSlot>,
    /// Topology name of each interned topology id.
    topology_names: Vec<String>,
    /// Union of every worker's taint bits.
    pub(crate) all_taints: u64,
    /// Position → row, and row → position (see the module docs).
    pub(crate) order: Vec<u32>,
    pub(crate) pos: Vec<u32>,
    /// Slot → position (`u32::MAX`: no such worker).
    pub(crate) pos_of_slot: Vec<u32>,
    /// Per model id: position bounds `[prefill, aggregated, decode, shared, end)`.
    bounds: Vec<[u32; 5]>,
    /// Capacity and topology id by position.
    pub(crate) cap_pos: Vec<f64>,
    pub(crate) topology_pos: Vec<u32>,
    /// Declared `throughput_weight` by row (0: none declared).
    pub(crate) throughput: Vec<f64>,
    /// CPU flag and declared throughput by position, and all ones (the slowness of a
    /// fleet whose workers all run at GPU speed).
    pub(crate) cpu_pos: Vec<bool>,
    pub(crate) throughput_pos: Vec<f64>,
    pub(crate) ones: Vec<f64>,
    /// Every worker is a GPU worker without a declared throughput: the cost needs no
    /// per-worker speed (`weigh_by_throughput` changes nothing).
    pub(crate) uniform_speed: bool,
    models: Interner,
    ids: Interner,
    taint_ids: Interner,
    topologies: Interner,
}

impl Fleet {
    /// Fleet of `specs`, in the order of the rows it will be used with; row `i` is
    /// taken to be slot `i`.
    pub fn new<'a>(specs: impl IntoIterator<Item = &'a WorkerSpec>) -> Fleet {
        Fleet::with_slots(
            specs
                .into_iter()
                .enumerate()
                .map(|(i, s)| (i as WorkerSlot, s)),
        )
    }

    /// Fleet of `(slot, spec)` pairs, in the order of the rows it will be used with.
    pub fn with_slots<'a>(
        workers: impl IntoIterator<Item = (WorkerSlot, &'a WorkerSpec)>,
    ) -> Fleet {
        let mut f = Fleet::default();
        for (slot, s) in workers {
            f.slot.push(slot);
            let m = f.models.intern(&s.model);
            f.model.push(m);
            f.role.push(role_bit(s.role));
            f.cpu.push(s.device == DeviceClass::Cpu);
            f.dp_lo.push(s.dp_ranks.lo);
            f.dp_hi.push(s.dp_ranks.hi);
            let mut mask = 0u64;
            for t in &s.taints {
                let id = f.taint_ids.intern(t);
                mask |= if id < 63 { 1 << id } else { OVERFLOW_BIT };
            }
            f.taints.push(mask);
            f.taint_names.push(if mask & OVERFLOW_BIT != 0 {
                s.taints.clone()
            } else {
                Vec::new()
            });
            f.all_taints |= mask;
            let t = f.topologies.intern(&s.topology);
            if t as usize == f.topology_names.len() {
                f.topology_names.push(s.topology.clone());
            }
            f.topology.push(t);
            f.capacity.push(s.capacity_blocks as f64);
            f.throughput.push(s.throughput_weight.unwrap_or(0.0));
            let id = f.ids.intern(&s.id);
            f.id.push(id);
            f.names.push(s.id.clone());
        }
        f.layout();
        f
    }

    /// Fixes the position order, the pool bounds and the by-position arrays.
    fn layout(&mut self) {
        let n = self.len();
        let rank = |r: u8| match r {
            x if x == role_bit(Role::Prefill) => 0usize,
            x if x == role_bit(Role::Aggregated) => 1,
            x if x == role_bit(Role::Decode) => 2,
            _ => 3,
        };
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by_key(|&i| (self.model[i as usize], rank(self.role[i as usize])));
        let mut pos = vec![0u32; n];
        for (p, &i) in order.iter().enumerate() {
            pos[i as usize] = p as u32;
        }
        let models = self.models.ids.len();
        let mut counts = vec![[0u32; 4]; models];
        for i in 0..n {
            if let Some(c) = counts.get_mut(self.model[i] as usize) {
                c[rank(self.role[i])] += 1;
            }
        }
        let mut start = 0u32;
        self.bounds = counts
            .iter()
            .map(|c| {
                let mut b = [start; 5];
                for r in 0..4 {
                    b[r + 1] = b[r] + c[r];
                }
                start = b[4];
                b
            })
            .collect();
        let max_slot = self.slot.iter().map(|&s| s as usize + 1).max().unwrap_or(0);
        self.pos_of_slot = vec![u32::MAX; max_slot];
        for (i, &s) in self.slot.iter().enumerate() {
            self.pos_of_slot[s as usize] = pos[i];
        }
        self.cap_pos = order.iter().map(|&i| self.capacity[i as usize]).collect();
        self.topology_pos = order.iter().map(|&i| self.topology[i as usize]).collect();
        self.cpu_pos = order.iter().map(|&i| self.cpu[i as usize]).collect();
        self.throughput_pos = order.iter().map(|&i| self.throughput[i as usize]).collect();
        self.ones = vec![1.0; n];
        self.uniform_speed =
            !self.cpu.iter().any(|&c| c) && self.throughput.iter().all(|&t| t == 0.0);
        self.order = order;
        self.pos = pos;
    }

    /// Positions of the workers of model `model` whose role is in `pool` (role bits),
    /// when that set is one contiguous range (every pool `decide` uses is).
    pub(crate) fn pool_range(&self, model: u32, pool: u8) -> Option<Range<usize>> {
        const P: u8 = role_bit(Role::Prefill);
        const A: u8 = role_bit(Role::Aggregated);
        const D: u8 = role_bit(Role::Decode);
        let Some(b) = self.bounds.get(model as usize) else {
            return Some(0..0);
        };
        let (lo, hi) = match pool {
            P => (0, 1),
            A => (1, 2),
            D => (2, 3),
            x if x == A | D => (1, 3),
            _ => return None,
        };
        Some(b[lo] as usize..b[hi] as usize)
    }

    /// Does model `model` have Prefill or Decode workers (a disaggregated fleet)?
    pub(crate) fn is_split(&self, model: u32) -> bool {
        self.bounds
            .get(model as usize)
            .is_some_and(|b| b[0] != b[1] || b[2] != b[3])
    }

    /// Name of topology id `id` (empty if unknown).
    pub(crate) fn topology_name(&self, id: u32) -> &str {
        self.topology_names
            .get(id as usize)
            .map_or("", String::as_str)
    }

    /// Position of the worker in `slot`, if it is in the fleet.
    pub fn position(&self, slot: WorkerSlot) -> Option<usize> {
        match self.pos_of_slot.get(slot as usize) {
            Some(&p) if p != u32::MAX => Some(p as usize),
            _ => None,
        }
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.model.len()
    }

    /// True without workers.
    pub fn is_empty(&self) -> bool {
        self.model.is_empty()
    }

    /// Id of a model name ([`UNKNOWN`] if no worker serves it).
    pub(crate) fn model_id(&self, model: &str) -> u32 {
        self.models.get(model)
    }

    /// Id of a worker id ([`UNKNOWN`] if no worker has it).
    pub(crate) fn id_of(&self, id: &str) -> u32 {
        self.ids.get(id)
    }

    /// Bitmask of the tolerated taints (unknown tolerations tolerate nothing).
    pub(crate) fn tolerations(&self, tolerations: &[String]) -> u64 {
        tolerations
            .iter()
            .map(|t| match self.taint_ids.get(t) {
                id if id < 63 => 1u64 << id,
                _ => 0,
            })
            .fold(0, |a, b| a | b)
    }

    /// Does worker `i` carry a taint outside `tolerated` (bitmask) / `tolerations`?
    #[inline(always)]
    pub(crate) fn untolerated(&self, i: usize, tolerated: u64, tolerations: &[String]) -> bool {
        let m = self.taints[i];
        if m == 0 {
            return false;
        }
        if m & OVERFLOW_BIT == 0 {
            return m & !tolerated != 0;
        }
        !self.taint_names[i].iter().all(|t| tolerations.contains(t))
    }

    /// Role of worker `i` as its pool bit.
    #[inline(always)]
    pub(crate) fn role_bit(&self, i: usize) -> u8 {
        self.role[i]
    }
}

#[cfg(test)]
mod interner_tests {
    use super::{Interner, UNKNOWN};

    /// The empty string's shortcut gives the ids the map alone gave: dense, in first
    /// appearance order, stable on re-interning, unknown before it is interned.
    #[test]
    fn empty_string_shortcut_keeps_dense_ids() {
        let mut i = Interner::default();
        assert_eq!(i.get(""), UNKNOWN);
        assert_eq!(i.intern("a"), 0);
        assert_eq!(i.intern(""), 1);
        assert_eq!(i.intern("a"), 0);
        assert_eq!(i.intern(""), 1);
        assert_eq!(i.intern("b"), 2);
        assert_eq!(
            (i.get(""), i.get("a"), i.get("b"), i.get("c")),
            (1, 0, 2, UNKNOWN)
        );
        assert_eq!(i.ids.len(), 3);
    }
}
