//! Warm restart for the service: periodic and shutdown snapshots of the registry and
//! every shard's live index entries (`--state-dir`), and the restore at start.
//!
//! Taking a snapshot never stops routing: a snapshot thread asks every core (through
//! its mailbox, like any other message) to dump its shard into a collector, waits for
//! all of them, then encodes and writes the file off the cores.

use super::msg::Msg;
use super::shared::Shared;
use crate::index::IndexShard;
use crate::registry::Registry;
use crate::snapshot::{self, SavedWorker, Snapshot};
use crate::types::{Tier, WorkerSlot};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One core's dump: (worker, tier, hash) for every live entry of its shard.
pub type ShardDump = Vec<(WorkerSlot, Tier, u64)>;

/// Gathers the dumps of all cores.
pub struct Collect {
    parts: Mutex<Vec<Option<ShardDump>>>,
    done: Condvar,
}

impl Collect {
    fn new(cores: usize) -> Collect {
        Collect {
            parts: Mutex::new(vec![None; cores]),
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

    fn wait(&self, timeout: Duration) -> Option<Vec<ShardDump>> {
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

/// Takes a snapshot of the running service and writes it to `dir`.
pub fn take(sh: &Shared, dir: &Path) -> Result<usize, String> {
    let reg = sh.registry.load_full();
    let collect = Arc::new(Collect::new(sh.cores));
    for core in 0..sh.cores {
        let mut msg = Msg::Snapshot(collect.clone());
        let mut tries = 0;
        while let Err(m) = sh.try_send(core, msg) {
            msg = m;
            tries += 1;
            if tries > 10_000 {
                return Err("cores too busy to snapshot".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let dumps = collect
        .wait(Duration::from_secs(30))
        .ok_or("cores did not answer the snapshot request")?;
    let mut index_of: HashMap<WorkerSlot, usize> = HashMap::new();
    let mut snap = Snapshot::default();
    for e in reg.iter() {
        let c = sh.cells(e.slot);
        index_of.insert(e.slot, snap.workers.len());
        snap.workers.push(SavedWorker {
            spec: e.spec.clone(),
            heartbeat: c.is_some_and(|c| c.heartbeat.load(Ordering::Acquire)),
            next_seq: c.map(|c| c.next_seq.load(Ordering::Acquire)).unwrap_or(0),
        });
        snap.entries.push(Vec::new());
    }
    let mut n = 0;
    for dump in dumps {
        for (slot, tier, h) in dump {
            if let Some(&i) = index_of.get(&slot) {
                snap.entries[i].push((tier, h));
                n += 1;
            }
        }
    }
    snapshot::write(dir, &snap).map_err(|e| e.to_string())?;
    Ok(n)
}

/// Restores a snapshot into a registry and per-core shards (before the cores start).
/// Returns the registry, the shards, and the saved workers (for their cells).
pub fn restore(
    snap: Snapshot,
    max_workers: usize,
    cores: usize,
    shard_bits: u32,
    cap_of: impl Fn(u64) -> u64,
) -> (Registry, Vec<IndexShard>, Vec<(WorkerSlot, SavedWorker)>) {
    let mut reg = Registry::new(max_workers);
    let mut shards: Vec<IndexShard> = (0..cores).map(|_| IndexShard::new()).collect();
    let mut saved = Vec::new();
    let mut per: Vec<Vec<u64>> = vec![Vec::new(); cores];
    for (w, entries) in snap.workers.into_iter().zip(snap.entries) {
        let Ok(up) = reg.upsert(w.spec.clone()) else {
            continue;
        };
        let slot = up.slot();
        let cap = cap_of(w.spec.capacity_blocks);
        for s in &mut shards {
            s.set_worker_cap(slot, cap);
        }
        for tier in Tier::ALL {
            for v in &mut per {
                v.clear();
            }
            for &(t, h) in &entries {
                if t == tier {
                    per[crate::index::shard_of(h, shard_bits)].push(h);
                }
            }
            for (s, hashes) in shards.iter_mut().zip(&per) {
                if !hashes.is_empty() {
                    s.stored(slot, tier, hashes);
                }
            }
        }
        saved.push((slot, w));
    }
    (reg, shards, saved)
}

/// The periodic snapshot thread (runs until shutdown).
pub fn spawn_periodic(
    sh: Arc<Shared>,
    dir: std::path::PathBuf,
    every: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let tick = Duration::from_millis(50);
        let mut waited = Duration::ZERO;
        while !sh.stopping.load(Ordering::Acquire) {
            std::thread::sleep(tick);
            waited += tick;
            if waited >= every {
                waited = Duration::ZERO;
                if let Err(e) = take(&sh, &dir) {
                    eprintln!("kvroute: snapshot failed: {e}");
                }
            }
        }
    })
}
