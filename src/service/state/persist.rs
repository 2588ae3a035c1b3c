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
//! Requests the previous process's own proxy was serving are not re-admitted
//! ([`drop_orphans`]): their connections died with it. The others' TTL
//! (`request_ttl_ms`) starts again at the restore.
//!
//! Restore is all or nothing (`snapshot::check` first, then every entry must land in
//! its shard): any problem stops the start with a message naming it. Snapshot outcomes
//! are exposed, not only logged: `kvroute_snapshot_*` metrics and the `snapshot` part
//! of `/healthz` (`degraded` while the last attempt failed); the shutdown snapshot's
//! failure makes `kvroute serve` exit non-zero.

use crate::engine::Prepared;
use crate::index::IndexShard;
use crate::registry::Registry;
use crate::service::runtime::core::Core;
use crate::service::runtime::dump::Collect;
use crate::service::runtime::msg::{Msg, Retained};
use crate::service::runtime::shared::Shared;
use crate::snapshot::{self, Expect, RestoreError, SavedRequest, SavedWorker, Snapshot};
use crate::types::{Tier, WorkerSlot};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A restored request, workers mapped to the new registry's slots.
pub type Restored = SavedRequest<WorkerSlot>;

/// Splits the restored requests: those the previous process's own proxy was serving
/// (`SavedRequest::proxied_here`) are orphans, since their client and upstream
/// connections ended with that process and nobody will ever finish them; they are
/// not re-admitted but counted (`kvroute_requests_expired_total{reason="restart"}`)
/// and logged, and their ids returned (with `--cluster` the peers, which hold them
/// too, are told they finished). The rest is re-admitted.
pub fn drop_orphans(sh: &Shared, restored: Vec<Restored>) -> (Vec<Restored>, Vec<String>) {
    let (orphans, kept): (Vec<Restored>, Vec<Restored>) =
        restored.into_iter().partition(|r| r.proxied_here);
    let ids: Vec<String> = orphans.into_iter().map(|r| r.request.id).collect();
    if let Some(first) = ids.first() {
        sh.metrics.expired("restart", ids.len() as u64);
        eprintln!(
            "kvroute: {} restored in-flight request(s) of the previous process's proxy \
             not re-admitted (their streams ended with it; e.g. {first:?}); their load is released",
            ids.len()
        );
    }
    (kept, ids)
}

/// Re-admits restored requests on `core` before it serves anything: active blocks of
/// every request (this core's shard of them), tracker state of the requests it owns.
pub fn restore_requests(core: &Core, restored: &[Restored]) {
    let sh = &core.shared;
    let now = sh.now_us();
    let mut st = core.st.borrow_mut();
    let mut mine = Vec::new();
    for saved in restored {
        let c = &saved.request;
        mine.clear();
        mine.extend(
            c.hashes
                .iter()
                .copied()
                .filter(|&h| sh.shard_of(h) == sh.shard_index(core.id)),
        );
        st.active.add(c.decode_worker, &mine);
        st.mark(c.decode_worker);
        if let Some(p) = c.prefill_worker {
            st.mark(p);
        }
        if sh.owner_of(&c.id) != core.id {
            continue;
        }
        // Replicated: the service-wide register learns the id too (`claims`).
        if !core.register(&c.id) {
            eprintln!(
                "kvroute: restored request {:?} not re-admitted: duplicate",
                c.id
            );
            continue;
        }
        if let Err(e) = st.tracker.restore(c.clone(), now) {
            core.unregister(&c.id);
            // `snapshot::check` refused bad and repeated ids already: never expected.
            eprintln!(
                "kvroute: restored request {:?} not re-admitted: {e:?}",
                c.id
            );
            continue;
        }
        if let Some(r) = &saved.reroute {
            let retained = Retained {
                prepared: Prepared {
                    hashes: c.hashes.clone(),
                    input_tokens: c.input_tokens,
                    prompt_blocks: c.prompt_blocks,
                    filters: r.filters.clone(),
                    session: None,
                },
                mode: r.mode,
                expected_output_tokens: c.expected_output_tokens,
            };
            st.retained.insert(c.id.clone(), retained);
        }
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
    let mut snap = Snapshot {
        params: Some(snapshot::HashParams::current(sh.settings.router.block_size)),
        ..Snapshot::default()
    };
    for e in reg.iter() {
        let c = sh.cells(e.slot);
        index_of.insert(e.slot, snap.workers.len());
        snap.workers.push(SavedWorker {
            spec: e.spec.clone(),
            heartbeat: c.is_some_and(|c| c.heartbeat.load(Ordering::Acquire)),
            next_seq: c.map(|c| c.next_seq.load(Ordering::Acquire)).unwrap_or(0),
            approximate: c.is_some_and(|c| c.approximate.load(Ordering::Acquire)),
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
        let index = |s: &WorkerSlot| index_of.get(s).map(|&i| i as u32);
        // `None`: its worker left the registry meanwhile.
        let saved = dump
            .requests
            .into_iter()
            .filter_map(|r| r.map_workers(index));
        snap.requests.extend(saved);
    }
    let requests = snap.requests.len();
    let bytes = snapshot::write(dir, &snap).map_err(|e| e.to_string())?;
    Ok(Taken {
        entries: n,
        requests,
        bytes,
    })
}

/// [`take`], with its outcome recorded in the metrics (and so in `/healthz`).
pub fn take_recorded(sh: &Shared, dir: &Path) -> Result<Taken, String> {
    let cluster_seq = crate::service::cluster::bridge::seq_before_snapshot(sh);
    let mut r = take(sh, dir);
    if let (Ok(_), Some(seq)) = (&r, cluster_seq) {
        if let Err(e) = crate::service::cluster::bridge::save_seq(dir, seq) {
            r = Err(e);
        }
    }
    let m = &sh.metrics;
    match &r {
        Ok(t) => {
            m.snapshots.inc();
            m.snapshot_consecutive_failures.set(0);
            m.snapshot_bytes.set(t.bytes as i64);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            m.snapshot_last_success.set(now as i64);
        }
        Err(_) => {
            m.snapshot_failures.inc();
            m.snapshot_consecutive_failures.inc();
        }
    }
    r
}

/// The `snapshot` part of `/healthz` and whether it makes the router `degraded`
/// (`None` without `state_dir`). Liveness is unaffected: `/healthz` stays 200.
pub fn health(sh: &Shared) -> Option<(bool, serde_json::Value)> {
    sh.settings.state_dir.as_ref()?;
    let m = &sh.metrics;
    let failing = m.snapshot_consecutive_failures.get();
    let last = m.snapshot_last_success.get();
    let v = serde_json::json!({
        "state": if failing > 0 { "failing" } else { "ok" },
        "consecutive_failures": failing,
        "failures_total": m.snapshot_failures.get(),
        "last_success_unix_seconds": (last > 0).then_some(last),
    });
    Some((failing > 0, v))
}

/// `/healthz` body: `{"status": "ok" | "degraded"}`, plus `snapshot` with a state dir.
pub fn healthz(sh: &Shared) -> serde_json::Value {
    match health(sh) {
        None => serde_json::json!({"status": "ok"}),
        Some((degraded, snap)) => serde_json::json!({
            "status": if degraded { "degraded" } else { "ok" },
            "snapshot": snap,
        }),
    }
}

/// What a snapshot held.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    pub entries: usize,
    pub requests: usize,
    /// Size of the file written.
    pub bytes: usize,
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

/// Restores a snapshot into a registry and per-core shards (before the cores start):
/// all of it, or an error naming what does not fit `expect`. `replicated`: every
/// core's shard gets every entry (`shard_bits` is then 0).
pub fn restore(
    snap: Snapshot,
    expect: &Expect,
    cores: usize,
    shard_bits: u32,
    replicated: bool,
    cap_of: impl Fn(u64) -> u64,
) -> Result<RestoredState, RestoreError> {
    snapshot::check(&snap, expect)?;
    let mut reg = Registry::new(expect.max_workers);
    let mut shards: Vec<IndexShard> = (0..cores).map(|_| IndexShard::new()).collect();
    let mut saved = Vec::new();
    let mut slot_of: Vec<Option<WorkerSlot>> = Vec::with_capacity(snap.workers.len());
    let mut per: Vec<Vec<u64>> = vec![Vec::new(); cores];
    for (index, (w, entries)) in snap.workers.into_iter().zip(snap.entries).enumerate() {
        let up = reg
            .upsert(w.spec.clone())
            .map_err(|e| RestoreError::InvalidWorker {
                index,
                id: w.spec.id.clone(),
                reason: e.to_string(),
            })?;
        let slot = up.slot();
        slot_of.push(Some(slot));
        let cap = cap_of(w.spec.capacity_blocks);
        let mut lost = 0u64;
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
            for (i, s) in shards.iter_mut().enumerate() {
                let hashes = if replicated { &per[0] } else { &per[i] };
                if !hashes.is_empty() {
                    let out = s.stored(slot, tier, hashes);
                    // A copy loses what the first copy lost: count it once.
                    if !replicated || i == 0 {
                        lost += u64::from(out.rejected) + u64::from(out.duplicate);
                    }
                }
            }
        }
        if lost > 0 {
            return Err(RestoreError::NotRestored {
                id: w.spec.id,
                entries: entries.len() as u64,
                lost,
                capacity: w.spec.capacity_blocks,
                max_blocks_per_worker: expect.max_blocks_per_worker,
                cores,
            });
        }
        saved.push((slot, w));
    }
    let slot = |i: u32| slot_of.get(i as usize).copied().flatten();
    let mut requests = Vec::with_capacity(snap.requests.len());
    for (index, r) in snap.requests.into_iter().enumerate() {
        let id = r.request.id.clone();
        // `check` verified every worker index; a miss here would be a bug, not data.
        let Some(restored) = r.map_workers(|&i| slot(i)) else {
            return Err(RestoreError::InvalidRequest {
                index,
                id,
                reason: "names a worker the snapshot does not hold".into(),
            });
        };
        requests.push(restored);
    }
    Ok(RestoredState {
        registry: reg,
        shards,
        saved,
        requests,
    })
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
                let before = sh.metrics.snapshot_consecutive_failures.get();
                match take_recorded(&sh, &dir) {
                    // Logged at the first failure and then at 2, 4, 8, ... in a row, so a
                    // lasting failure does not flood the log (the metrics count each).
                    Err(e) if (before + 1).count_ones() == 1 => eprintln!(
                        "kvroute: snapshot failed ({} in a row; /healthz says degraded): {e}",
                        before + 1
                    ),
                    Ok(_) if before > 0 => eprintln!(
                        "kvroute: snapshot written to {} again after {before} failures",
                        dir.display()
                    ),
                    _ => {}
                }
            }
        }
    })
}
