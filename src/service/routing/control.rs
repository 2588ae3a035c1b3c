//! Control plane: worker registration, removal, JSON events, status.
//!
//! Registry writes are serialised by one mutex (rare, cold) and published as a new
//! snapshot (O(1) to copy: the registry is persistent); the shards learn about identity
//! changes through `Forget` messages and per-slot generations, so events about a
//! previous identity of a slot are dropped.
//!
//! Registration rules (the decisions are `Registry::upsert_as`): one event connection
//! per worker, bound under the write lock; a registration changing the spec of a worker
//! that is connected, or that another door ([`Origin`]) registered, is refused with
//! `conflict`; heartbeat tracking is only ever switched on (by the event protocol) and
//! off only by removal, so no registration can keep a dead worker live.
//!
//! JSON events are read-your-writes: `json_events` returns only once every shard has
//! applied the batches it queued ([`applied_everywhere`]), so a route sent after the
//! answer sees them. Binary and ZMQ ingest answer no event and skip that round trip.

use crate::engine::{EngineError, KvEvent, WorkerState, WorkerStatus};
use crate::engines::adapter::Change;
use crate::registry::{Origin, Upsert};
use crate::service::routing::router::ApiError;
use crate::service::runtime::core::Core;
use crate::service::runtime::index_batch::Batch;
use crate::service::runtime::msg::{IndexOp, Msg};
use crate::service::runtime::shared::Shared;
use crate::types::{WorkerSlot, WorkerSpec};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The cap every shard enforces for a worker: its declared capacity, at most
/// `max_blocks_per_worker`. The service's shards share one `index::Budget`, so this is
/// the worker's total over all cores, enforced exactly (no slack for the uneven split
/// of hashes over shards); `_cores` is kept for the callers' sake.
pub fn cap_per_shard(capacity: u64, max_per_worker: u64, _cores: usize) -> u64 {
    capacity.min(max_per_worker)
}

/// Registers (or re-registers) a worker arriving through `origin`. From
/// [`Origin::Events`] it also binds the event connection (the caller clears
/// `connected` when that connection ends) and makes the worker heartbeat-tracked.
pub async fn register(
    core: &Core,
    spec: WorkerSpec,
    origin: Origin,
) -> Result<(Upsert, u64), ApiError> {
    let sh = &core.shared;
    let capacity = spec.capacity_blocks;
    let published = sh.cluster.get().map(|_| spec.clone());
    let (up, gen) = upsert(sh, spec, origin)?;
    if let Some(spec) = published {
        crate::service::runtime::cluster_hooks::publish_worker(sh, &spec);
    }
    let slot = up.slot();
    if let Upsert::NewEpoch(_) = up {
        broadcast(core, |_| Msg::Forget { slot }).await;
    }
    let cap = cap_per_shard(capacity, sh.settings.limits.max_blocks_per_worker, sh.cores);
    index_ops(core, slot, gen, vec![IndexOp::SetCap(cap)]).await;
    sh.metrics.workers.set(sh.registry.load().len() as i64);
    Ok((up, gen))
}

/// The registry write of a registration: new snapshot, slot generation and cells.
fn upsert(sh: &Shared, spec: WorkerSpec, origin: Origin) -> Result<(Upsert, u64), ApiError> {
    let _guard = sh
        .registry_write
        .lock()
        .map_err(|_| EngineError::BadRequest("registry lock poisoned".into()))?;
    let mut reg = (**sh.registry.load()).clone();
    // `connected` only goes 0 → 1 under this lock, so the answer cannot go stale
    // before the registration below is published (1 → 0, a close, is benign).
    let connected = reg
        .slot(&spec.id)
        .and_then(|s| sh.cells(s))
        .is_some_and(|c| c.connected.load(Ordering::Acquire) != 0);
    let modelled = sh.settings.router.approximate && spec.url.is_some();
    let up = reg
        .upsert_as(spec, origin, connected)
        .map_err(EngineError::from)?;
    let cells = sh
        .cells(up.slot())
        .ok_or_else(|| EngineError::BadRequest("slot out of range".into()))?;
    // Approximate mode: a new worker (or epoch) with a url and no event source is
    // modelled; a known one keeps its mode until its first event (`core::index`).
    if !matches!(up, Upsert::SameEpoch(_)) {
        let no_source = matches!(origin, Origin::Admin | Origin::Restored);
        cells
            .approximate
            .store(modelled && no_source, Ordering::Release);
    }
    if !matches!(up, Upsert::SameEpoch(_)) {
        cells.gen.fetch_add(1, Ordering::AcqRel);
        cells.next_seq.store(0, Ordering::Release);
        cells.suspect.store(false, Ordering::Release);
        sh.status.counters.reset(up.slot());
    }
    let gen = cells.gen.load(Ordering::Acquire);
    if origin == Origin::Events {
        cells
            .connected
            .store(connection_tag(gen), Ordering::Release);
        cells.heartbeat.store(true, Ordering::Release);
    }
    // A worker's own registration is a sign of life; an admin repeating the spec of a
    // silent worker is not (it must not keep a dead worker live).
    if origin == Origin::Events || !matches!(up, Upsert::SameEpoch(_)) {
        cells.last_seen_ms.store(sh.now_ms(), Ordering::Release);
    }
    sh.registry.store(Arc::new(reg));
    Ok((up, gen))
}

/// The non-zero value `connected` holds for the event connection registered at
/// generation `gen`.
fn connection_tag(gen: u64) -> u32 {
    (gen as u32) | 0x8000_0000
}

/// Unbinds the event connection registered at `gen` (no-op if the worker was removed
/// meanwhile and its slot possibly bound by another connection).
pub fn release_connection(sh: &Shared, slot: WorkerSlot, gen: u64) {
    if let Some(c) = sh.cells(slot) {
        let _ = c.connected.compare_exchange(
            connection_tag(gen),
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}

/// `register` for plain OS threads (ZMQ ingest, [`Origin::Engine`]; `heartbeat` true
/// means [`Origin::Events`]): the same registry write, then the same messages through
/// the mailboxes with [`send_blocking`]. Errors if shutdown started before they were
/// delivered.
pub fn register_blocking(
    sh: &Shared,
    spec: WorkerSpec,
    heartbeat: bool,
) -> Result<(Upsert, u64), ApiError> {
    let capacity = spec.capacity_blocks;
    let origin = if heartbeat {
        Origin::Events
    } else {
        Origin::Engine
    };
    let published = sh.cluster.get().map(|_| spec.clone());
    let (up, gen) = upsert(sh, spec, origin)?;
    if let Some(spec) = published {
        crate::service::runtime::cluster_hooks::publish_worker(sh, &spec);
    }
    announce_blocking(sh, &up, gen, capacity)?;
    Ok((up, gen))
}

/// After a registry write from a plain thread: every core forgets the slot's old
/// identity (a new epoch) and takes its per-shard capacity, through [`send_blocking`];
/// then the worker gauge. Errors if shutdown started before the messages were delivered.
fn announce_blocking(sh: &Shared, up: &Upsert, gen: u64, capacity: u64) -> Result<(), ApiError> {
    let slot = up.slot();
    let cap = cap_per_shard(capacity, sh.settings.limits.max_blocks_per_worker, sh.cores);
    let ops: Arc<[IndexOp]> = vec![IndexOp::SetCap(cap)].into();
    for to in 0..sh.cores {
        if let Upsert::NewEpoch(_) = up {
            if !send_blocking(sh, to, Msg::Forget { slot }) {
                return Err(EngineError::BadRequest("shutting down".into()).into());
            }
        }
        let m = Msg::Index {
            slot,
            gen,
            ops: ops.clone(),
        };
        if !send_blocking(sh, to, m) {
            return Err(EngineError::BadRequest("shutting down".into()).into());
        }
    }
    sh.metrics.workers.set(sh.registry.load().len() as i64);
    Ok(())
}

/// Enqueues to core `to` from a thread outside the executors, sleeping briefly while its
/// mailbox is full (backpressure). False if shutdown started first.
pub fn send_blocking(sh: &Shared, to: usize, mut msg: Msg) -> bool {
    let mut pause = std::time::Duration::from_micros(20);
    loop {
        match sh.try_send(to, msg) {
            Ok(()) => return true,
            Err(m) => {
                if sh.shutdown.load(Ordering::Relaxed) {
                    return false;
                }
                msg = m;
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(2));
            }
        }
    }
}

/// Removes a worker and everything known about it.
pub async fn deregister(core: &Core, id: &str) -> Result<(), ApiError> {
    crate::ids::check("worker id", id).map_err(EngineError::BadRequest)?;
    let sh = &core.shared;
    let slot = unregister(sh, id)?;
    crate::service::runtime::cluster_hooks::publish_removal(sh, id);
    broadcast(core, |_| Msg::Forget { slot }).await;
    sh.metrics.workers.set(sh.registry.load().len() as i64);
    Ok(())
}

/// [`deregister`] for plain OS threads (an entry gone from the engines file), the
/// messages sent with [`send_blocking`]. Errors if the worker is unknown or shutdown
/// started first.
pub fn deregister_blocking(sh: &Shared, id: &str) -> Result<(), ApiError> {
    let slot = unregister(sh, id)?;
    crate::service::runtime::cluster_hooks::publish_removal(sh, id);
    for to in 0..sh.cores {
        if !send_blocking(sh, to, Msg::Forget { slot }) {
            return Err(EngineError::BadRequest("shutting down".into()).into());
        }
    }
    sh.metrics.workers.set(sh.registry.load().len() as i64);
    Ok(())
}

/// Takes `id` out of the registry and retires its slot's cells (a new generation, no
/// heartbeat, no connection, not suspect); the caller then tells the cores to forget
/// the slot. Shared by local and replicated removals.
fn unregister(sh: &Shared, id: &str) -> Result<WorkerSlot, EngineError> {
    let _guard = sh
        .registry_write
        .lock()
        .map_err(|_| EngineError::BadRequest("registry lock poisoned".into()))?;
    let mut reg = (**sh.registry.load()).clone();
    let slot = reg
        .remove(id)
        .ok_or_else(|| EngineError::UnknownWorker(id.into()))?;
    if let Some(c) = sh.cells(slot) {
        c.gen.fetch_add(1, Ordering::AcqRel);
        c.heartbeat.store(false, Ordering::Release);
        c.connected.store(0, Ordering::Release);
        c.suspect.store(false, Ordering::Release);
        c.engine_unreachable.store(false, Ordering::Release);
        c.approximate.store(false, Ordering::Release);
    }
    sh.registry.store(Arc::new(reg));
    Ok(slot)
}

/// Sends a message to every core (this one through its own mailbox, to keep order).
pub async fn broadcast(core: &Core, mut make: impl FnMut(usize) -> Msg) {
    for to in 0..core.shared.cores {
        core.send(to, make(to)).await;
    }
}

/// Fans a batch of one worker's index operations out to every shard (each shard picks
/// its own hashes out of the shared lists).
pub async fn index_ops(core: &Core, slot: WorkerSlot, gen: u64, ops: Vec<IndexOp>) {
    if ops.is_empty() {
        return;
    }
    crate::service::runtime::cluster_hooks::publish_ops(&core.shared, slot, &ops);
    let ops: Arc<[IndexOp]> = ops.into();
    for to in 0..core.shared.cores {
        core.send(
            to,
            Msg::Index {
                slot,
                gen,
                ops: ops.clone(),
            },
        )
        .await;
    }
}

/// Applies JSON events of worker `id` (same semantics as the binary protocol).
pub async fn json_events(core: &Core, id: &str, events: Vec<KvEvent>) -> Result<usize, ApiError> {
    crate::ids::check("worker id", id).map_err(EngineError::BadRequest)?;
    let sh = &core.shared;
    let slot = sh
        .registry
        .load()
        .slot(id)
        .ok_or_else(|| EngineError::UnknownWorker(id.into()))?;
    let max = sh.settings.limits.max_hashes_per_request.max(1 << 16);
    let gen = sh
        .cells(slot)
        .map(|c| c.gen.load(Ordering::Acquire))
        .unwrap_or(0);
    let n = events.len();
    if let Some(e) = events.iter().find_map(|ev| match ev {
        KvEvent::Stored { block_hashes, .. } | KvEvent::Removed { block_hashes, .. }
            if block_hashes.len() > max =>
        {
            Some(block_hashes.len())
        }
        _ => None,
    }) {
        return Err(
            EngineError::BadRequest(format!("{e} hashes in one event (at most {max})")).into(),
        );
    }
    // Cut like binary events, so a large body never becomes one long shard batch.
    let mut batch = Batch::default();
    let mut full = Vec::new();
    for ev in events {
        let c = match ev {
            KvEvent::Stored {
                tier, block_hashes, ..
            } => Change::Stored {
                tier,
                hashes: block_hashes,
            },
            KvEvent::Removed { tier, block_hashes } => Change::Removed {
                tier,
                hashes: block_hashes,
            },
            KvEvent::Cleared { tier } => Change::Cleared { tier },
        };
        sh.metrics.event(batch.add_change(c, &mut full), 1);
        for ops in full.drain(..) {
            index_ops(core, slot, gen, ops).await;
        }
    }
    index_ops(core, slot, gen, batch.take()).await;
    if let Some(c) = sh.cells(slot) {
        c.last_seen_ms.store(sh.now_ms(), Ordering::Release);
    }
    // "applied" means visible: routing queries travel in the urgent lane and would
    // otherwise overtake the batches still queued in the bulk lane.
    applied_everywhere(core).await;
    Ok(n)
}

/// Resolves once every core has handled every bulk message this core queued to it
/// before the call: a `Barrier` follows them in each core's bulk lane (a FIFO per
/// sender) and comes back as `Applied`. Each core handles its urgent inbox first, so
/// the quiet messages (`Msg::is_quiet`) any core queued to it before are applied and
/// published too: the API's reads of the load see every call answered before them.
pub async fn applied_everywhere(core: &Core) {
    let mut qids = Vec::with_capacity(core.shared.cores);
    for to in 0..core.shared.cores {
        let qid = core.new_wait();
        core.send(to, Msg::Barrier { from: core.id, qid }).await;
        qids.push(qid);
    }
    for qid in qids {
        core.wait(qid).await;
    }
}

/// Status of every worker (fleet view summed over cores).
pub fn workers(core: &Core) -> Vec<WorkerStatus> {
    let sh = &core.shared;
    let reg = sh.registry.load();
    let now_us = sh.now_us();
    reg.iter().map(|e| worker_status(sh, e, now_us)).collect()
}

/// Status of one worker at `now_us` (also the status page's fleet rows).
pub fn worker_status(sh: &Shared, e: &crate::registry::WorkerEntry, now_us: u64) -> WorkerStatus {
    let cfg = &sh.settings.router;
    let p = sh.board.read(e.slot);
    let load = p.agg.load(cfg.prefill_load_model, now_us);
    let state = if !sh.is_live(e.slot, now_us / 1000) {
        WorkerState::Down
    } else if sh
        .cells(e.slot)
        .is_some_and(|c| c.suspect.load(Ordering::Relaxed))
    {
        WorkerState::Suspect
    } else {
        WorkerState::Live
    };
    let mut w = WorkerStatus::new(
        &e.spec,
        state,
        p.cached_blocks,
        &load,
        if cfg.assume_kv_reuse {
            p.blocks_unique as f64
        } else {
            load.blocks_total
        },
    );
    let mismatch = sh
        .cells(e.slot)
        .map_or(0, |c| c.engine_block_size_mismatch.load(Ordering::Relaxed));
    if sh
        .cells(e.slot)
        .is_some_and(|c| c.engine_unreachable.load(Ordering::Relaxed))
    {
        w.engine_issue = Some(format!(
            "unreachable: the engine's event endpoint has not answered for {} ms or more",
            sh.settings.heartbeat_timeout_ms
        ));
    } else if mismatch != 0 {
        w.engine_issue = Some(format!(
            "block_size_mismatch: engine {mismatch}, router {}",
            cfg.block_size
        ));
    }
    if sh
        .cells(e.slot)
        .is_some_and(|c| c.approximate.load(Ordering::Relaxed))
    {
        // The model's entries reserve from the index budget, and an approximate
        // worker has no indexed ones: its count there is its modelled blocks.
        w.approximate = true;
        w.approximate_entries = Some(sh.budget_of(0).held(e.slot));
    }
    let rank = sh
        .cells(e.slot)
        .map_or(0, |c| c.engine_dp_rank_mismatch.load(Ordering::Relaxed));
    if rank != 0 {
        w.engine_issue = Some(format!(
            "dp_rank_mismatch: engine batches are of rank {}, the entry serves rank {} \
             (each rank publishes on the base port + its rank)",
            rank - 1,
            e.spec.dp_ranks.lo
        ));
    }
    w
}

/// A registration replicated from another replica (`cluster::bridge`): the registry
/// write of [`register_blocking`] as a claimable entry ([`Origin::Restored`]: a
/// worker connecting here later takes it over), not published again.
pub fn register_replicated(sh: &Shared, spec: WorkerSpec) -> Result<(), ApiError> {
    let capacity = spec.capacity_blocks;
    let (up, gen) = upsert(sh, spec, Origin::Restored)?;
    announce_blocking(sh, &up, gen, capacity)
}

/// A removal replicated from another replica: [`deregister`] from a plain thread, not
/// published again. False if the worker was not registered here.
pub fn deregister_replicated(sh: &Shared, id: &str) -> bool {
    let Ok(slot) = unregister(sh, id) else {
        return false;
    };
    for to in 0..sh.cores {
        if !send_blocking(sh, to, Msg::Forget { slot }) {
            break;
        }
    }
    sh.metrics.workers.set(sh.registry.load().len() as i64);
    true
}
