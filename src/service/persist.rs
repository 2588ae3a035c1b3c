//! Warm restart for the service: periodic and shutdown snapshots of the registry and
//! every shard's live index entries (`--state-dir`), and the restore at start.
//!
//! Taking a snapshot never stops routing: a snapshot thread asks every core (through
//! its mailbox, like any other message) to dump its shard and the requests it owns
//! into a collector, waits for all of them, then encodes and writes the file off the
//! cores.
//!
//! In-flight requests: each core dumps its tracker's active requests (and the re-route
//! inputs of disaggregated ones). At start every core re-adds the active blocks of
//! every restored request to its shard of the active-block index, and the request's
//! owner under the new core count (`Shared::owner_of`) re-admits it into its tracker,
//! so a restart with another `--cores` works; the load board is then republished.

use super::core::Core;
use super::msg::{Msg, Retained};
use super::shared::Shared;
use crate::engine::Prepared;
use crate::index::IndexShard;
use crate::load::CarriedRequest;
use crate::registry::Registry;
use crate::snapshot::{self, SavedRequest, SavedReroute, SavedWorker, Snapshot};
use crate::types::{Tier, WorkerSlot};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// One core's dump: (worker, tier, hash) for every live entry of its shard, and the
/// active requests it owns.
#[derive(Clone, Default)]
pub struct ShardDump {
    pub entries: Vec<(WorkerSlot, Tier, u64)>,
    pub requests: Vec<(CarriedRequest, Option<SavedReroute>)>,
}

/// A restored request, workers mapped to the new registry's slots.
pub type Restored = (CarriedRequest, Option<SavedReroute>);

/// Dumps `core`'s shard and requests (runs on the core, for `Msg::Snapshot`).
pub fn dump(core: &Core) -> ShardDump {
    let st = core.st.borrow();
    let mut entries = Vec::new();
    st.index.for_each_live(|h, w, t| entries.push((w, t, h)));
    let requests = st
        .tracker
        .carry(core.shared.now_us())
        .into_iter()
        .map(|c| {
            let reroute = st.retained.get(&c.id).map(|r| SavedReroute {
                filters: r.prepared.filters.clone(),
                mode: r.mode,
            });
            (c, reroute)
        })
        .collect();
    ShardDump { entries, requests }
}

/// Re-admits restored requests on `core` before it serves anything: active blocks of
/// every request (this core's shard of them), tracker state of the requests it owns.
pub fn restore_requests(core: &Core, restored: &[Restored]) {
    let sh = &core.shared;
    let now = sh.now_us();
    let mut st = core.st.borrow_mut();
    let mut mine = Vec::new();
    for (c, reroute) in restored {
        mine.clear();
        mine.extend(
            c.hashes
                .iter()
                .copied()
                .filter(|&h| sh.shard_of(h) == core.id),
        );
        st.active.add(c.decode_worker, &mine);
        st.mark(c.decode_worker);
        if let Some(p) = c.prefill_worker {
            st.mark(p);
        }
        if sh.owner_of(&c.id) != core.id {
            continue;
        }
        if st.tracker.restore(c.clone(), now).is_err() {
            continue; // a duplicate id in a corrupt-but-decodable file: keep the first
        }
        if let Some(r) = reroute {
            let retained = Retained {
                prepared: Prepared {
                    hashes: c.hashes.clone(),
                    input_tokens: c.input_tokens,
                    prompt_blocks: c.prompt_blocks,
                    filters: r.filters.clone(),
                },
                mode: r.mode,
                expected_output_tokens: c.expected_output_tokens,
            };
            st.retained.insert(c.id.clone(), retained);
        }
    }
}

/// Gathers the dumps of all cores.
pub struct Collect {
    parts: Mutex<Vec<Option<ShardDump>>>,
    done: Condvar,
}

impl Collect {
    fn new(cores: usize) -> Collect {
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
pub fn take(sh: &Shared, dir: &Path) -> Result<Taken, String> {
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
        for (slot, tier, h) in dump.entries {
            if let Some(&i) = index_of.get(&slot) {
                snap.entries[i].push((tier, h));
                n += 1;
            }
        }
        for (c, reroute) in dump.requests {
            let index = |s: WorkerSlot| index_of.get(&s).map(|&i| i as u32);
            let (Some(decode), Some(prefill)) = (
                index(c.decode_worker),
                c.prefill_worker.map(index).unwrap_or(Some(u32::MAX)),
            ) else {
                continue; // its worker left the registry meanwhile
            };
            snap.requests.push(SavedRequest {
                id: c.id,
                decode,
                prefill: (prefill != u32::MAX).then_some(prefill),
                input_tokens: c.input_tokens,
                cached_tokens: c.cached_tokens,
                prompt_blocks: c.prompt_blocks,
                hashes: c.hashes,
                expected_output_tokens: c.expected_output_tokens,
                in_prefill: c.in_prefill,
                output_tokens: c.output_tokens,
                age_us: c.age_us,
                first_token_age_us: c.first_token_age_us,
                reroute,
            });
        }
    }
    let requests = snap.requests.len();
    snapshot::write(dir, &snap).map_err(|e| e.to_string())?;
    Ok(Taken {
        entries: n,
        requests,
    })
}

/// What a snapshot held.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    pub entries: usize,
    pub requests: usize,
}

/// A snapshot restored into the state the cores start from.
pub struct RestoredState {
    pub registry: Registry,
    pub shards: Vec<IndexShard>,
    /// The saved workers (for their cells).
    pub saved: Vec<(WorkerSlot, SavedWorker)>,
    /// In-flight requests whose workers were restored.
    pub requests: Vec<Restored>,
}

/// Restores a snapshot into a registry and per-core shards (before the cores start).
pub fn restore(
    snap: Snapshot,
    max_workers: usize,
    cores: usize,
    shard_bits: u32,
    cap_of: impl Fn(u64) -> u64,
) -> RestoredState {
    let mut reg = Registry::new(max_workers);
    let mut shards: Vec<IndexShard> = (0..cores).map(|_| IndexShard::new()).collect();
    let mut saved = Vec::new();
    let mut slot_of: Vec<Option<WorkerSlot>> = Vec::with_capacity(snap.workers.len());
    let mut per: Vec<Vec<u64>> = vec![Vec::new(); cores];
    for (w, entries) in snap.workers.into_iter().zip(snap.entries) {
        let Ok(up) = reg.upsert(w.spec.clone()) else {
            slot_of.push(None);
            continue;
        };
        let slot = up.slot();
        slot_of.push(Some(slot));
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
    let slot = |i: u32| slot_of.get(i as usize).copied().flatten();
    let requests = snap
        .requests
        .into_iter()
        .filter_map(|r| {
            let decode_worker = slot(r.decode)?;
            let prefill_worker = match r.prefill {
                Some(p) => Some(slot(p)?),
                None => None,
            };
            let c = CarriedRequest {
                id: r.id,
                decode_worker,
                prefill_worker,
                input_tokens: r.input_tokens,
                cached_tokens: r.cached_tokens,
                prompt_blocks: r.prompt_blocks,
                hashes: r.hashes,
                expected_output_tokens: r.expected_output_tokens,
                in_prefill: r.in_prefill,
                output_tokens: r.output_tokens,
                age_us: r.age_us,
                first_token_age_us: r.first_token_age_us,
            };
            Some((c, r.reroute))
        })
        .collect();
    RestoredState {
        registry: reg,
        shards,
        saved,
        requests,
    }
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
