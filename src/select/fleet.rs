//! [`Fleet`]: the static, per-registry part of every worker's filter data, laid out as
//! a struct of arrays so the selection loop reads a few contiguous integers per worker
//! instead of chasing `WorkerRow::spec` (DESIGN §1 "Selection").
//!
//! Strings (model, worker id, taints, topology) are interned to small integers once,
//! when the fleet is built; a request's filters are resolved against the interner once
//! per decision ([`Fleet::model_id`], [`Fleet::id_of`], [`Fleet::tolerations`]), so the
//! per-worker checks are integer compares and a bitmask test.
//!
//! Guarantees:
//! - built from the worker specs in row order; `decide` uses it only when its length
//!   equals the number of rows (otherwise it builds its own, allocating);
//! - filter outcomes equal the string-based definitions exactly: taints beyond the 63
//!   first distinct ones share an overflow bit whose workers fall back to comparing
//!   strings, and unknown names (a model, pin or toleration no worker has) map to ids
//!   that match nothing.

use crate::types::{DeviceClass, WorkerSpec};
use std::collections::HashMap;

/// Id of a name that no worker carries: matches nothing.
pub(crate) const UNKNOWN: u32 = u32::MAX;

/// Bit of a taint that has no bit of its own (the 64th and later distinct taints).
const OVERFLOW_BIT: u64 = 1 << 63;

/// Interns strings to dense ids.
#[derive(Clone, Debug, Default)]
struct Interner {
    ids: HashMap<String, u32>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(s.to_owned()).or_insert(next)
    }

    fn get(&self, s: &str) -> u32 {
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
    models: Interner,
    ids: Interner,
    taint_ids: Interner,
    topologies: Interner,
}

impl Fleet {
    /// Fleet of `specs`, in the order of the rows it will be used with.
    pub fn new<'a>(specs: impl IntoIterator<Item = &'a WorkerSpec>) -> Fleet {
        let mut f = Fleet::default();
        for s in specs {
            let m = f.models.intern(&s.model);
            f.model.push(m);
            f.role.push(super::filter::role_bit(s.role));
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
            let t = f.topologies.intern(&s.topology);
            f.topology.push(t);
            f.capacity.push(s.capacity_blocks as f64);
            let id = f.ids.intern(&s.id);
            f.id.push(id);
            f.names.push(s.id.clone());
        }
        f
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

    /// Id of a topology domain ([`UNKNOWN`] if no worker is in it).
    pub(crate) fn topology_id(&self, domain: &str) -> u32 {
        self.topologies.get(domain)
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
