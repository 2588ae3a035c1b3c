//! The link between the cores and router replication (`--cluster`): the [`Cluster`]
//! every core reaches through `Shared::cluster` (set once at start by
//! `service::cluster::bridge`), with the bounded channels the cores publish into
//! (`runtime::cluster_hooks`) and the NATS side drains, the replica's health, and the
//! counters the bridge and the cores share. Without `--cluster` there is none.

use crate::cluster::state::Health;
use crate::cluster::wire::RecOp;
use crate::service::runtime::cluster_metrics::ClusterMetrics;
use crate::types::WorkerSpec;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a replica publishes, in ingest order.
pub enum Out {
    Events { worker: String, ops: Vec<RecOp> },
    Worker(WorkerSpec),
    Removed(String),
}

/// The replica's side of the cluster, reachable from every core.
pub struct Cluster {
    /// This incarnation's origin tag: `replica_id/boot`.
    pub origin: String,
    /// Seals what this replica publishes and opens what it receives
    /// (`cluster.secret`; a pass-through when the tier runs unauthenticated).
    pub sealer: crate::cluster::auth::Sealer,
    pub(super) tx: crossbeam::channel::Sender<Out>,
    /// Load changes to publish (core NATS, batched); full = dropped and counted.
    pub(in crate::service) load_tx: crossbeam::channel::Sender<crate::cluster::load::LoadOp>,
    /// Woken after every send, so the publisher need not poll.
    pub wake: Arc<tokio::sync::Notify>,
    /// The same for the load publisher (one `Notify` per waiter: `notify_one` wakes
    /// only one of them).
    pub load_wake: tokio::sync::Notify,
    pub health: Mutex<Health>,
    /// Records taken from the buffer and not yet acknowledged by NATS (the publisher's
    /// queue), so a graceful shutdown can wait for them.
    pub unacked: AtomicU64,
    /// Last stream sequence handed to the cores (saved beside snapshots).
    pub applied_seq: AtomicU64,
    /// Stream sequence to start consuming after (from the restored snapshot).
    pub start_after: u64,
    /// Per slot: a record of this worker was dropped (publish buffer full).
    pub(super) lost: Box<[AtomicBool]>,
    /// Per `[[engines]]` entry: this replica holds the engine's lease (it alone
    /// ingests and publishes that engine's batches; the others discard theirs).
    pub engine_leases: Box<[AtomicBool]>,
    /// Requests of the previous incarnation's proxy, dropped at the restore
    /// (`persist::drop_orphans`): finished on the peers too, and never taken back
    /// from their load-sync answers.
    pub orphans: std::collections::HashSet<String>,
    /// `kvroute_cluster_*` (registered into the service's registry at start).
    pub metrics: ClusterMetrics,
}

/// What a [`Cluster`] link is made of (`service::cluster::bridge::start`).
pub struct Link {
    pub origin: String,
    pub sealer: crate::cluster::auth::Sealer,
    pub start_after: u64,
    pub max_workers: usize,
    /// The number of `[[engines]]` entries.
    pub engines: usize,
    pub orphans: std::collections::HashSet<String>,
    pub metrics: ClusterMetrics,
    /// The publish buffer's and the load channel's bound.
    pub buffer: usize,
}

impl Cluster {
    /// A link, with the receivers the NATS side drains.
    pub fn new(
        l: Link,
    ) -> (
        Cluster,
        crossbeam::channel::Receiver<Out>,
        crossbeam::channel::Receiver<crate::cluster::load::LoadOp>,
    ) {
        let (tx, rx) = crossbeam::channel::bounded(l.buffer);
        let (load_tx, load_rx) = crossbeam::channel::bounded(l.buffer);
        let flags = |n: usize| (0..n).map(|_| AtomicBool::new(false)).collect();
        let c = Cluster {
            origin: l.origin,
            sealer: l.sealer,
            tx,
            load_tx,
            wake: Arc::new(tokio::sync::Notify::new()),
            load_wake: tokio::sync::Notify::new(),
            health: Mutex::new(Health::default()),
            unacked: AtomicU64::new(0),
            applied_seq: AtomicU64::new(l.start_after),
            start_after: l.start_after,
            lost: flags(l.max_workers),
            engine_leases: flags(l.engines),
            orphans: l.orphans,
            metrics: l.metrics,
        };
        (c, rx, load_rx)
    }

    /// Runs `f` on the health state and updates the state gauge.
    pub fn with_health<R>(&self, f: impl FnOnce(&mut Health) -> R) -> R {
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let before = h.phase();
        let r = f(&mut h);
        let after = h.phase();
        if before != after {
            eprintln!(
                "kvroute: cluster: {} -> {}{}",
                before.name(),
                after.name(),
                if after == crate::cluster::state::Phase::Degraded {
                    " (routing on local state; ingest applied locally and buffered)"
                } else {
                    ""
                }
            );
        }
        self.metrics.state.set(h.phase().code());
        r
    }

    /// Records not yet in NATS: in the buffer or the publisher's queue.
    pub fn unpublished(&self) -> u64 {
        self.tx.len() as u64 + self.unacked.load(Ordering::Acquire)
    }

    /// `/readyz`'s `cluster` part and whether it allows ready.
    pub fn readiness(&self) -> (bool, serde_json::Value) {
        let h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let mut d = h.detail();
        d["backlog_now"] = serde_json::json!(self.tx.len());
        d["origin"] = serde_json::json!(self.origin);
        (h.ready(), d)
    }
}
