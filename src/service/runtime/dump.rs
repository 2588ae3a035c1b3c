//! What the cores hand the snapshot thread: one core's dump ([`ShardDump`]: its
//! shard's live entries and its in-flight requests) and the gatherer the snapshot
//! thread waits on ([`Collect`]). A leaf of `runtime`: `Msg::Snapshot` carries a
//! `Collect`, each core fills it (`Core::dump`), `state::persist` writes the result.

use crate::snapshot::SavedRequest;
use crate::types::{Tier, WorkerSlot};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// One core's dump: (worker, tier, hash) for every live entry of its shard, and the
/// active requests it owns.
#[derive(Clone, Default)]
pub struct ShardDump {
    pub entries: Vec<(WorkerSlot, Tier, u64)>,
    pub requests: Vec<SavedRequest<WorkerSlot>>,
}

/// Gathers the dumps of all cores.
pub struct Collect {
    parts: Mutex<Vec<Option<ShardDump>>>,
    done: Condvar,
}

impl Collect {
    pub fn new(cores: usize) -> Collect {
        Collect {
            parts: Mutex::new((0..cores).map(|_| None).collect()),
            done: Condvar::new(),
        }
    }

    /// Called by core `core` with its dump.
    pub fn put(&self, core: usize, dump: ShardDump) {
        if let Ok(mut p) = self.parts.lock() {
            if let Some(slot) = p.get_mut(core) {
                *slot = Some(dump);
            }
            self.done.notify_all();
        }
    }

    /// Every core's dump, or `None` when one did not come within `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<Vec<ShardDump>> {
        let guard = self.parts.lock().ok()?;
        let (mut guard, _) = self
            .done
            .wait_timeout_while(guard, timeout, |p| p.iter().any(|x| x.is_none()))
            .ok()?;
        if guard.iter().any(|x| x.is_none()) {
            return None;
        }
        Some(
            guard
                .iter_mut()
                .map(|x| x.take().unwrap_or_default())
                .collect(),
        )
    }
}
