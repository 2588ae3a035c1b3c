//! The hooks the cores, the ingest and the registry writes call to publish to router
//! replicas what this replica accepted (`--cluster`): index changes
//! ([`publish_ops`]), registrations ([`publish_worker`], [`publish_removal`]), routes
//! and lifecycle calls ([`publish_route`], [`publish_life`]); and what they ask of
//! the link ([`engine_may_ingest`], [`take_lost`]).
//!
//! Guarantees: a hook never blocks a core: it is a `try_send` on a bounded crossbeam
//! channel of the [`Cluster`] link (the publish buffer, or the load channel). A full
//! buffer drops the record, counts it, and flags the worker `lost`; its binary event
//! connection then asks it to resync ([`take_lost`]), which re-announces its whole
//! state through the log. Without `--cluster` every hook is one `OnceLock` load. The
//! NATS side that drains the channels, and the apply thread that feeds peers' changes
//! back to the cores, are `service::cluster`.

use crate::cluster::wire::RecOp;
use crate::service::runtime::cluster_link::{Cluster, Out};
use crate::service::runtime::msg::{Hashes, IndexOp};
use crate::service::runtime::shared::Shared;
use crate::types::{WorkerSlot, WorkerSpec};
use std::sync::atomic::Ordering;

fn enqueue(sh: &Shared, cl: &Cluster, out: Out, slot: Option<WorkerSlot>) {
    match cl.tx.try_send(out) {
        Ok(()) => {
            sh.cluster_metrics().publish_backlog.set(cl.tx.len() as i64);
            cl.wake.notify_one();
        }
        Err(_) => {
            sh.cluster_metrics().record("dropped", 1);
            if let Some(flag) = slot.and_then(|s| cl.lost.get(s as usize)) {
                flag.store(true, Ordering::Release);
            }
        }
    }
}

/// Publishes a batch of one worker's index changes as its ingest accepted it (no-op
/// without `--cluster`; caps are not published, every replica derives them).
pub fn publish_ops(sh: &Shared, slot: WorkerSlot, ops: &[IndexOp]) {
    let Some(cl) = sh.cluster.get() else {
        return;
    };
    let rec: Vec<RecOp> = ops.iter().filter_map(to_rec).collect();
    if rec.is_empty() {
        return;
    }
    let reg = sh.registry.load();
    let Some(e) = reg.get(slot) else {
        return;
    };
    enqueue(
        sh,
        cl,
        Out::Events {
            worker: e.spec.id.clone(),
            ops: rec,
        },
        Some(slot),
    );
}

/// Publishes a registration made through one of this replica's doors.
pub fn publish_worker(sh: &Shared, spec: &WorkerSpec) {
    if let Some(cl) = sh.cluster.get() {
        enqueue(sh, cl, Out::Worker(spec.clone()), None);
    }
}

/// Publishes a removal made through one of this replica's doors.
pub fn publish_removal(sh: &Shared, id: &str) {
    if let Some(cl) = sh.cluster.get() {
        enqueue(sh, cl, Out::Removed(id.to_string()), None);
    }
}

/// Whether this replica ingests the ZMQ engine of `worker` now: always without
/// `--cluster`; with it, only while it holds the engine's lease (so each engine batch
/// enters the log once, through one replica).
pub fn engine_may_ingest(sh: &Shared, worker: &str) -> bool {
    let Some(cl) = sh.cluster.get() else {
        return true;
    };
    sh.settings
        .engines
        .iter()
        .position(|e| e.worker_id == worker)
        .and_then(|i| cl.engine_leases.get(i))
        .is_some_and(|f| f.load(Ordering::Acquire))
}

/// Whether records of `slot`'s worker were dropped since the last call (its event
/// connection then asks for a resync, which republishes its whole state).
pub fn take_lost(sh: &Shared, slot: WorkerSlot) -> bool {
    sh.cluster
        .get()
        .and_then(|c| c.lost.get(slot as usize))
        .is_some_and(|f| f.swap(false, Ordering::AcqRel))
}

fn to_rec(op: &IndexOp) -> Option<RecOp> {
    let list = |h: &Hashes| match h {
        Hashes::Owned(v) => v.to_vec(),
        Hashes::Wire(w) => w.iter().collect(),
    };
    Some(match op {
        IndexOp::Stored { tier, hashes } => RecOp::Stored {
            tier: *tier,
            hashes: list(hashes),
        },
        IndexOp::Removed { tier, hashes } => RecOp::Removed {
            tier: *tier,
            hashes: list(hashes),
        },
        IndexOp::Cleared { tier } => RecOp::Cleared { tier: *tier },
        IndexOp::SetCap(_) => return None,
    })
}

fn enqueue_load(sh: &Shared, cl: &Cluster, op: crate::cluster::load::LoadOp) {
    match cl.load_tx.try_send(op) {
        Ok(()) => cl.load_wake.notify_one(),
        Err(_) => sh.cluster_metrics().load("dropped", 1),
    }
}

/// Publishes a request this replica routed (no-op without `--cluster`).
pub fn publish_route(sh: &Shared, req: &crate::load::NewRequest) {
    let Some(cl) = sh.cluster.get() else {
        return;
    };
    let reg = sh.registry.load();
    let name = |&s: &WorkerSlot| reg.get(s).map(|e| e.spec.id.clone());
    let Some(route) = crate::load::CarriedRequest::fresh(req).map_workers(name) else {
        return;
    };
    let op = crate::cluster::load::LoadOp::Route(route);
    enqueue_load(sh, cl, op);
}

/// Publishes a lifecycle call this replica answered.
pub fn publish_life(sh: &Shared, op: crate::service::runtime::msg::LifeOp, id: &str) {
    use crate::cluster::load::LoadOp;
    use crate::service::runtime::msg::LifeOp as L;
    let Some(cl) = sh.cluster.get() else {
        return;
    };
    let id = id.to_string();
    let op = match op {
        L::FirstToken => LoadOp::FirstToken { id },
        L::Progress(n) => LoadOp::Progress {
            id,
            output_tokens: n,
        },
        L::Finish => LoadOp::Finish { id },
        L::PrefillFailed => LoadOp::PrefillFailed { id },
    };
    enqueue_load(sh, cl, op);
}
