//! The worker registry: external ids ↔ dense slots, specs, epochs.
//!
//! Pure bookkeeping with no I/O. Both the in-process [`crate::engine`] and the service's
//! control plane use it. Guarantees:
//! - at most `max_workers` workers; slots are dense (`0..max_workers`) and reused after
//!   removal, so per-slot arrays stay small;
//! - re-registering an id keeps its slot; the returned [`Upsert`] says whether the
//!   caller must clear the worker's cached blocks (new epoch) or may keep them.

use crate::types::{WorkerSlot, WorkerSpec, MAX_WORKER_SLOTS};
use std::collections::HashMap;

/// A registered worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerEntry {
    pub slot: WorkerSlot,
    pub spec: WorkerSpec,
}

/// What a registration did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upsert {
    /// A new worker in a fresh slot (nothing to clear: a freed slot was already cleared).
    New(WorkerSlot),
    /// Known worker, same epoch: its index state is still valid.
    SameEpoch(WorkerSlot),
    /// Known worker with a different epoch (a restarted engine): the caller must clear
    /// its cached blocks, and its in-flight requests no longer exist.
    NewEpoch(WorkerSlot),
}

impl Upsert {
    pub fn slot(self) -> WorkerSlot {
        match self {
            Upsert::New(s) | Upsert::SameEpoch(s) | Upsert::NewEpoch(s) => s,
        }
    }
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid worker spec: {0}")]
    Invalid(String),
    #[error("worker limit reached ({0} workers)")]
    Full(usize),
}

/// The registry. Cheap to clone (the service publishes clones as read-only snapshots).
#[derive(Clone, Debug)]
pub struct Registry {
    slots: Vec<Option<WorkerEntry>>,
    by_id: HashMap<String, WorkerSlot>,
    free: Vec<WorkerSlot>,
    max_workers: usize,
}

impl Registry {
    /// An empty registry admitting at most `max_workers` workers (capped at 65,535).
    pub fn new(max_workers: usize) -> Registry {
        Registry {
            slots: Vec::new(),
            by_id: HashMap::new(),
            free: Vec::new(),
            max_workers: max_workers.clamp(1, MAX_WORKER_SLOTS),
        }
    }

    /// Registers or updates a worker.
    pub fn upsert(&mut self, spec: WorkerSpec) -> Result<Upsert, RegistryError> {
        spec.validate().map_err(RegistryError::Invalid)?;
        if let Some(&slot) = self.by_id.get(&spec.id) {
            let entry = self.slots[slot as usize]
                .as_mut()
                .ok_or_else(|| RegistryError::Invalid("registry slot out of sync".into()))?;
            let same = entry.spec.epoch == spec.epoch;
            entry.spec = spec;
            return Ok(if same {
                Upsert::SameEpoch(slot)
            } else {
                Upsert::NewEpoch(slot)
            });
        }
        let slot = if let Some(s) = self.free.pop() {
            s
        } else if self.slots.len() < self.max_workers {
            self.slots.push(None);
            (self.slots.len() - 1) as WorkerSlot
        } else {
            return Err(RegistryError::Full(self.max_workers));
        };
        self.by_id.insert(spec.id.clone(), slot);
        self.slots[slot as usize] = Some(WorkerEntry { slot, spec });
        Ok(Upsert::New(slot))
    }

    /// Removes a worker; returns its (now free) slot. The caller must clear every
    /// per-slot structure before the slot is handed out again.
    pub fn remove(&mut self, id: &str) -> Option<WorkerSlot> {
        let slot = self.by_id.remove(id)?;
        self.slots[slot as usize] = None;
        self.free.push(slot);
        Some(slot)
    }

    pub fn slot(&self, id: &str) -> Option<WorkerSlot> {
        self.by_id.get(id).copied()
    }

    pub fn get(&self, slot: WorkerSlot) -> Option<&WorkerEntry> {
        self.slots.get(slot as usize).and_then(|e| e.as_ref())
    }

    pub fn by_id(&self, id: &str) -> Option<&WorkerEntry> {
        self.slot(id).and_then(|s| self.get(s))
    }

    /// Registered workers in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.slots.iter().filter_map(|e| e.as_ref())
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// One past the highest slot ever handed out (size for per-slot arrays).
    pub fn slot_bound(&self) -> usize {
        self.slots.len()
    }

    pub fn max_workers(&self) -> usize {
        self.max_workers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsert_new_same_and_new_epoch() {
        let mut r = Registry::new(4);
        let a = r.upsert(WorkerSpec::new("a")).unwrap();
        assert_eq!(a, Upsert::New(0));
        assert_eq!(
            r.upsert(WorkerSpec::new("a")).unwrap(),
            Upsert::SameEpoch(0)
        );
        let mut s = WorkerSpec::new("a");
        s.epoch = 7;
        assert_eq!(r.upsert(s).unwrap(), Upsert::NewEpoch(0));
        assert_eq!(r.by_id("a").unwrap().spec.epoch, 7);
        assert_eq!(r.upsert(WorkerSpec::new("b")).unwrap(), Upsert::New(1));
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn slots_are_reused_and_limit_enforced() {
        let mut r = Registry::new(2);
        r.upsert(WorkerSpec::new("a")).unwrap();
        r.upsert(WorkerSpec::new("b")).unwrap();
        assert_eq!(r.upsert(WorkerSpec::new("c")), Err(RegistryError::Full(2)));
        assert_eq!(r.remove("a"), Some(0));
        assert_eq!(r.remove("a"), None);
        assert_eq!(r.upsert(WorkerSpec::new("c")).unwrap(), Upsert::New(0));
        assert_eq!(r.slot("c"), Some(0));
        assert!(r.get(1).is_some());
        assert_eq!(r.slot_bound(), 2);
    }

    #[test]
    fn invalid_specs_are_refused() {
        let mut r = Registry::new(2);
        assert!(matches!(
            r.upsert(WorkerSpec::new("")),
            Err(RegistryError::Invalid(_))
        ));
        assert!(matches!(
            r.upsert(WorkerSpec::new("a b")),
            Err(RegistryError::Invalid(_))
        ));
        let mut s = WorkerSpec::new("x");
        s.capacity_blocks = 0;
        assert!(r.upsert(s).is_err());
        assert!(r.is_empty());
    }
}
