//! The worker registry: external ids ↔ dense slots, specs, epochs, and which door
//! registered each worker.
//!
//! Pure bookkeeping with no I/O. Both the in-process [`crate::engine`] and the service's
//! control plane use it. Guarantees:
//! - at most `max_workers` workers; slots are dense (`0..max_workers`) and reused after
//!   removal, so per-slot arrays stay small;
//! - re-registering an id keeps its slot; the returned [`Upsert`] says whether the
//!   caller must clear the worker's cached blocks (new epoch) or may keep them;
//! - a registration that would change the spec of a worker registered through another
//!   door ([`Origin`]), or of a worker whose event connection is open, is refused with
//!   [`RegistryError::Conflict`] and changes nothing; repeating the current spec is a
//!   no-op from any door;
//! - cloning is O(1) and every write O(log n): the maps are persistent (structurally
//!   shared, `rpds`), so the service can publish a fresh snapshot per write and
//!   registering n workers costs O(n log n), not the O(n²) of copying the registry
//!   (n specs of up to 64 taints each) on every write.

use crate::types::{WorkerSlot, WorkerSpec, MAX_WORKER_SLOTS};
use rpds::{HashTrieMapSync, StackSync, VectorSync};
use std::sync::Arc;

/// Through which door a worker was registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `POST /v1/workers` or the binary `Register` (admin / static workers).
    Admin,
    /// The event protocol's `Hello` (the worker speaks for itself; heartbeat-tracked).
    Events,
    /// A ZMQ engine subscription from the settings (`[[engines]]`).
    Engine,
    /// Restored from a snapshot and not yet claimed: the first registration through
    /// any door takes it over.
    Restored,
}

impl Origin {
    pub fn name(self) -> &'static str {
        match self {
            Origin::Admin => "the admin API",
            Origin::Events => "the event protocol",
            Origin::Engine => "a ZMQ engine subscription",
            Origin::Restored => "a snapshot",
        }
    }
}

/// A registered worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerEntry {
    pub slot: WorkerSlot,
    pub spec: WorkerSpec,
    pub origin: Origin,
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
    /// The registration conflicts with the worker's current owner (see [`Origin`]).
    #[error("conflict: {0}")]
    Conflict(String),
}

/// The registry. O(1) to clone (the service publishes clones as read-only snapshots).
#[derive(Clone, Debug)]
pub struct Registry {
    slots: VectorSync<Option<Arc<WorkerEntry>>>,
    by_id: HashTrieMapSync<String, WorkerSlot>,
    free: StackSync<WorkerSlot>,
    max_workers: usize,
}

impl Registry {
    /// An empty registry admitting at most `max_workers` workers (capped at 65,535).
    pub fn new(max_workers: usize) -> Registry {
        Registry {
            slots: VectorSync::new_sync(),
            by_id: HashTrieMapSync::new_sync(),
            free: StackSync::new_sync(),
            max_workers: max_workers.clamp(1, MAX_WORKER_SLOTS),
        }
    }

    /// Registers or updates a worker as the admin API does ([`Origin::Admin`], no event
    /// connection open).
    pub fn upsert(&mut self, spec: WorkerSpec) -> Result<Upsert, RegistryError> {
        self.upsert_as(spec, Origin::Admin, false)
    }

    /// Registers or updates a worker arriving through `origin`. `connected`: an event
    /// connection is currently bound to this id. Refused with `Conflict`, changing
    /// nothing, when:
    /// - `origin` is [`Origin::Events`] and a connection is open (one per worker);
    /// - the spec differs from the registered one and a connection is open, or the
    ///   worker was registered through another door (not [`Origin::Restored`]).
    ///
    /// The same spec again is [`Upsert::SameEpoch`] and changes nothing, except that an
    /// event-protocol `Hello` takes the worker over (it now speaks for itself), as does
    /// any registration of a restored worker.
    pub fn upsert_as(
        &mut self,
        spec: WorkerSpec,
        origin: Origin,
        connected: bool,
    ) -> Result<Upsert, RegistryError> {
        spec.validate().map_err(RegistryError::Invalid)?;
        if let Some(&slot) = self.by_id.get(&spec.id) {
            let entry = self
                .get(slot)
                .ok_or_else(|| RegistryError::Invalid("registry slot out of sync".into()))?;
            if origin == Origin::Events && connected {
                return Err(RegistryError::Conflict(format!(
                    "worker {:?} already has an event connection",
                    spec.id
                )));
            }
            if entry.spec == spec {
                if entry.origin != origin
                    && (origin == Origin::Events || entry.origin == Origin::Restored)
                {
                    let e = WorkerEntry {
                        origin,
                        ..entry.clone()
                    };
                    self.slots.set_mut(slot as usize, Some(Arc::new(e)));
                }
                return Ok(Upsert::SameEpoch(slot));
            }
            if connected {
                return Err(RegistryError::Conflict(format!(
                    "worker {:?} is connected over the event protocol with another spec",
                    spec.id
                )));
            }
            if entry.origin != origin && entry.origin != Origin::Restored {
                return Err(RegistryError::Conflict(format!(
                    "worker {:?} was registered through {} with another spec (remove it first)",
                    spec.id,
                    entry.origin.name()
                )));
            }
            let same = entry.spec.epoch == spec.epoch;
            let e = WorkerEntry { slot, spec, origin };
            self.slots.set_mut(slot as usize, Some(Arc::new(e)));
            return Ok(if same {
                Upsert::SameEpoch(slot)
            } else {
                Upsert::NewEpoch(slot)
            });
        }
        let slot = if let Some(&s) = self.free.peek() {
            self.free.pop_mut();
            s
        } else if self.slots.len() < self.max_workers {
            self.slots.push_back_mut(None);
            (self.slots.len() - 1) as WorkerSlot
        } else {
            return Err(RegistryError::Full(self.max_workers));
        };
        self.by_id.insert_mut(spec.id.clone(), slot);
        let e = WorkerEntry { slot, spec, origin };
        self.slots.set_mut(slot as usize, Some(Arc::new(e)));
        Ok(Upsert::New(slot))
    }

    /// Relabels a worker's origin (restore: the snapshot does not say which door).
    pub fn set_origin(&mut self, slot: WorkerSlot, origin: Origin) {
        if let Some(entry) = self.get(slot) {
            let e = WorkerEntry {
                origin,
                ..entry.clone()
            };
            self.slots.set_mut(slot as usize, Some(Arc::new(e)));
        }
    }

    /// Removes a worker; returns its (now free) slot. The caller must clear every
    /// per-slot structure before the slot is handed out again.
    pub fn remove(&mut self, id: &str) -> Option<WorkerSlot> {
        let slot = *self.by_id.get(id)?;
        self.by_id.remove_mut(id);
        self.slots.set_mut(slot as usize, None);
        self.free.push_mut(slot);
        Some(slot)
    }

    pub fn slot(&self, id: &str) -> Option<WorkerSlot> {
        self.by_id.get(id).copied()
    }

    pub fn get(&self, slot: WorkerSlot) -> Option<&WorkerEntry> {
        self.slots
            .get(slot as usize)
            .and_then(|e| e.as_ref())
            .map(|e| &**e)
    }

    pub fn by_id(&self, id: &str) -> Option<&WorkerEntry> {
        self.slot(id).and_then(|s| self.get(s))
    }

    /// Registered workers in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.slots.iter().filter_map(|e| e.as_deref())
    }

    pub fn len(&self) -> usize {
        self.by_id.size()
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
    fn conflicting_registrations_are_refused_and_change_nothing() {
        let mut r = Registry::new(4);
        let s = WorkerSpec::new("w");
        assert_eq!(
            r.upsert_as(s.clone(), Origin::Events, false),
            Ok(Upsert::New(0))
        );
        // Second connection for a connected worker, whatever the spec.
        assert!(matches!(
            r.upsert_as(s.clone(), Origin::Events, true),
            Err(RegistryError::Conflict(_))
        ));
        // Admin repeating the spec: a no-op that keeps the owner.
        assert_eq!(
            r.upsert_as(s.clone(), Origin::Admin, true),
            Ok(Upsert::SameEpoch(0))
        );
        assert_eq!(r.get(0).unwrap().origin, Origin::Events);
        let mut other = s.clone();
        other.capacity_blocks = 7;
        let mut epoch = s.clone();
        epoch.epoch = 9;
        for (spec, connected) in [(&other, true), (&other, false), (&epoch, false)] {
            assert!(matches!(
                r.upsert_as(spec.clone(), Origin::Admin, connected),
                Err(RegistryError::Conflict(_))
            ));
        }
        assert_eq!(r.get(0).unwrap().spec, s);
        // The worker itself, reconnecting with a new epoch, is fine.
        assert_eq!(
            r.upsert_as(epoch.clone(), Origin::Events, false),
            Ok(Upsert::NewEpoch(0))
        );
        // Restored entries are claimed by the first registration.
        r.set_origin(0, Origin::Restored);
        assert_eq!(
            r.upsert_as(other.clone(), Origin::Engine, false),
            Ok(Upsert::NewEpoch(0))
        );
        assert_eq!(r.get(0).unwrap().origin, Origin::Engine);
    }

    #[test]
    fn snapshots_are_independent_of_later_writes() {
        let mut r = Registry::new(8);
        r.upsert(WorkerSpec::new("a")).unwrap();
        let snap = r.clone();
        r.upsert(WorkerSpec::new("b")).unwrap();
        r.remove("a");
        assert_eq!(snap.len(), 1);
        assert!(snap.by_id("a").is_some() && snap.by_id("b").is_none());
        assert_eq!(
            r.iter().map(|e| e.spec.id.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
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
