//! The cluster bridge (`--cluster`): how the glommio cores and the NATS side meet.
//!
//! - Cores (and the ZMQ threads) hand what their ingest accepted to [`publish_ops`],
//!   and registry writes to [`publish_worker`] / [`publish_removal`]: a `try_send` on
//!   one bounded crossbeam channel (the publish buffer), never blocking a core. A full
//!   buffer drops the record, counts it, and flags the worker `lost`; its binary event
//!   connection then asks it to resync ([`take_lost`]), which re-announces its whole
//!   state through the log (the reconcile path for anything the peers missed).
//! - One OS thread, "kvroute-cluster", runs a small tokio runtime with the NATS client
//!   (`cluster::nats`): it publishes the buffer, consumes the stream and watches the
//!   registry bucket, and passes what it receives, in order, to the apply thread.
//! - The apply thread ("kvroute-cluster-apply") turns received records into the same
//!   `Msg::Index` batches the local ingest sends (`control::send_blocking`, the ZMQ
//!   ingest's backpressure), and replicated registrations into registry writes.
//!
//! Without `--cluster` none of this exists: every hook is one `OnceLock` load.

use crate::cluster::state::{Health, Verdict};
use crate::cluster::wire::{EventRecord, RecOp};
use crate::service::cluster::load::{apply_load, load_sync};
pub use crate::service::cluster::load::{
    carried_ops, carry_all, publish_life, publish_route, ReplicaOp,
};
use crate::service::cluster::metrics::{ClusterMetrics, OutcomeLabel};
use crate::service::routing::control;
use crate::service::runtime::msg::{Hashes, IndexOp, Msg};
use crate::service::runtime::shared::Shared;
use crate::types::{WorkerSlot, WorkerSpec};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a replica publishes, in ingest order.
pub enum Out {
    Events { worker: String, ops: Vec<RecOp> },
    Worker(WorkerSpec),
    Removed(String),
}

/// What the NATS side hands the apply thread, in stream order.
pub enum Apply {
    /// A record at stream sequence `seq`, not yet judged.
    Record {
        seq: u64,
        rec: EventRecord,
    },
    /// A stream sequence that carried nothing to apply (undecodable record).
    Skip {
        seq: u64,
    },
    Worker(WorkerSpec),
    Removed(String),
    /// Connected for the first time: the registry was synced (the items before this
    /// one) and the stream held up to `stream_last`; consuming starts after `start`.
    Connected {
        stream_last: u64,
        start: u64,
    },
    /// A fetch at the stream's tail came back empty.
    Tail,
    /// A peer replica's load changes (core NATS).
    Load(Vec<crate::cluster::load::LoadOp>),
    /// The start's load sync: the in-flight requests of the `peers` replicas that
    /// answered (routes with their progress).
    LoadSync {
        ops: Vec<crate::cluster::load::LoadOp>,
        peers: usize,
    },
}

/// The replica's side of the cluster, reachable from every core.
pub struct Cluster {
    /// This incarnation's origin tag: `replica_id/boot`.
    pub origin: String,
    /// Seals what this replica publishes and opens what it receives
    /// (`cluster.secret`; a pass-through when the tier runs unauthenticated).
    pub sealer: crate::cluster::auth::Sealer,
    tx: crossbeam::channel::Sender<Out>,
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
    lost: Box<[AtomicBool]>,
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

/// The state dir file holding the stream sequence the snapshot beside it covers.
pub const SEQ_FILE: &str = "cluster.seq";

impl Cluster {
    fn phase_changed(&self, sh: &Shared, h: &Health) {
        crate::service::cluster::metrics::of(sh)
            .state
            .set(h.phase().code());
    }

    /// Runs `f` on the health state and updates the state gauge.
    pub fn with_health<R>(&self, sh: &Shared, f: impl FnOnce(&mut Health) -> R) -> R {
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
        self.phase_changed(sh, &h);
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

/// `GET /readyz`: ready unless this replica is still catching up with the cluster
/// (then 503), draining its proxy or stopping; the body says why, and how the cluster link is
/// (`degraded` while NATS is unreachable: still ready, routing on local state).
pub fn readyz(sh: &Shared) -> (bool, serde_json::Value) {
    let draining = sh.draining.load(Ordering::Relaxed);
    let stopping = sh.stopping.load(Ordering::Relaxed);
    let (cluster_ready, detail) = match sh.cluster.get() {
        Some(c) => {
            let (r, d) = c.readiness();
            (r, Some(d))
        }
        None => (true, None),
    };
    let ready = cluster_ready && !stopping && !draining;
    let status = if stopping {
        "stopping"
    } else if draining {
        "draining"
    } else if !cluster_ready {
        "catching_up"
    } else if detail.as_ref().is_some_and(|d| d["state"] == "degraded") {
        "degraded"
    } else {
        "ready"
    };
    let mut body = serde_json::json!({ "ready": ready, "status": status });
    if let Some(d) = detail {
        body["cluster"] = d;
    }
    (ready, body)
}

/// Starts the bridge when `--cluster` is set: the NATS thread and the apply thread
/// (both joined at shutdown through the returned handles).
pub fn start(
    sh: &Arc<Shared>,
    restored: bool,
    orphans: Vec<String>,
) -> Result<Vec<std::thread::JoinHandle<()>>, String> {
    let cfg = &sh.settings.cluster;
    // Registered with or without `--cluster`: the families are always listed.
    let metrics = ClusterMetrics::default();
    sh.metrics.with_registry(|r| metrics.register(r));
    if !cfg.enabled() {
        return Ok(Vec::new());
    }
    let sealer = match cfg.resolve_secret()? {
        Some(secret) => crate::cluster::auth::Sealer::new(secret.as_bytes(), &cfg.name),
        None => {
            eprintln!(
                "kvroute: cluster: WARNING: unauthenticated (cluster.unauthenticated): \
                 any client of the NATS server can forge records, registrations and load"
            );
            crate::cluster::auth::Sealer::unauthenticated()
        }
    };
    let replica = cfg.replica_id.clone().unwrap_or_else(default_replica_id);
    let boot = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(40)
    );
    let start_after = match (&sh.settings.state_dir, restored) {
        (Some(dir), true) => read_seq(std::path::Path::new(dir)),
        _ => 0,
    };
    let (tx, rx) = crossbeam::channel::bounded(cfg.publish_buffer);
    let (load_tx, load_rx) = crossbeam::channel::bounded(cfg.publish_buffer);
    let cluster = Arc::new(Cluster {
        origin: format!("{replica}/{boot}"),
        sealer,
        tx,
        load_tx,
        wake: Arc::new(tokio::sync::Notify::new()),
        load_wake: tokio::sync::Notify::new(),
        health: Mutex::new(Health::default()),
        unacked: AtomicU64::new(0),
        applied_seq: AtomicU64::new(start_after),
        start_after,
        lost: (0..sh.settings.limits.max_workers)
            .map(|_| AtomicBool::new(false))
            .collect(),
        engine_leases: sh
            .settings
            .engines
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect(),
        orphans: orphans.iter().cloned().collect(),
        metrics,
    });
    cluster.metrics.state.set(0);
    if sh.cluster.set(cluster.clone()).is_err() {
        return Err("cluster bridge started twice".into());
    }
    // Sent once NATS is reached (the load publisher starts then).
    for id in orphans {
        publish_life(sh, crate::service::runtime::msg::LifeOp::Finish, &id);
    }
    eprintln!(
        "kvroute: cluster {:?} via {}: replica {}, resuming the log after sequence {start_after}",
        cfg.name,
        cfg.url.as_deref().unwrap_or(""),
        cluster.origin
    );
    let (apply_tx, apply_rx) = tokio::sync::mpsc::channel::<Apply>(1024);
    let nats = {
        let (sh, cl) = (sh.clone(), cluster.clone());
        std::thread::Builder::new()
            .name("kvroute-cluster".into())
            .spawn(move || crate::service::cluster::nats::run(sh, cl, rx, load_rx, apply_tx))
            .map_err(|e| format!("cluster thread: {e}"))?
    };
    let apply = {
        let (sh, cl) = (sh.clone(), cluster);
        std::thread::Builder::new()
            .name("kvroute-cluster-apply".into())
            .spawn(move || apply_loop(sh, cl, apply_rx))
            .map_err(|e| format!("cluster apply thread: {e}"))?
    };
    Ok(vec![nats, apply])
}

fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| {
            h.trim()
                .bytes()
                .filter(|b| crate::ids::is_id_byte(*b))
                .collect::<Vec<u8>>()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kvroute".into());
    format!("{host}-{}", std::process::id())
}

fn read_seq(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join(SEQ_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The stream sequence a snapshot about to be taken covers (0 without `--cluster`).
/// Taken before the snapshot: every batch handed to the cores up to it is queued ahead
/// of the snapshot's dump messages, so the snapshot holds at least that much.
pub fn seq_before_snapshot(sh: &Shared) -> Option<u64> {
    sh.cluster
        .get()
        .map(|c| c.applied_seq.load(Ordering::Acquire))
}

/// Saves the sequence beside a snapshot that was just written (atomic rename).
pub fn save_seq(dir: &std::path::Path, seq: u64) -> Result<(), String> {
    let tmp = dir.join(format!("{SEQ_FILE}.tmp"));
    std::fs::write(&tmp, format!("{seq}\n")).map_err(|e| format!("{SEQ_FILE}: {e}"))?;
    std::fs::rename(&tmp, dir.join(SEQ_FILE)).map_err(|e| format!("{SEQ_FILE}: {e}"))
}

fn enqueue(sh: &Shared, cl: &Cluster, out: Out, slot: Option<WorkerSlot>) {
    match cl.tx.try_send(out) {
        Ok(()) => {
            crate::service::cluster::metrics::of(sh)
                .publish_backlog
                .set(cl.tx.len() as i64);
            cl.wake.notify_one();
        }
        Err(_) => {
            crate::service::cluster::metrics::of(sh).record("dropped", 1);
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

fn to_index(op: RecOp) -> IndexOp {
    match op {
        RecOp::Stored { tier, hashes } => IndexOp::Stored {
            tier,
            hashes: Hashes::Owned(hashes.into()),
        },
        RecOp::Removed { tier, hashes } => IndexOp::Removed {
            tier,
            hashes: Hashes::Owned(hashes.into()),
        },
        RecOp::Cleared { tier } => IndexOp::Cleared { tier },
    }
}

/// The apply thread: received records and registry writes, in order, into the cores.
fn apply_loop(sh: Arc<Shared>, cl: Arc<Cluster>, mut rx: tokio::sync::mpsc::Receiver<Apply>) {
    let mut dedup = crate::cluster::state::Dedup::new(&cl.origin, 1 << 16);
    while let Some(a) = rx.blocking_recv() {
        if sh.shutdown.load(Ordering::Relaxed) {
            break;
        }
        match a {
            Apply::Record { seq, rec } => {
                apply_record(&sh, &mut dedup, rec);
                done(&sh, &cl, seq);
            }
            Apply::Skip { seq } => done(&sh, &cl, seq),
            Apply::Connected { stream_last, start } => cl.with_health(&sh, |h| {
                h.applied = start;
                h.on_connected(stream_last);
            }),
            Apply::Tail => cl.with_health(&sh, |h| h.on_tail()),
            Apply::Load(ops) => apply_load(&sh, ops),
            Apply::LoadSync { ops, peers } => {
                if peers > 0 {
                    load_sync(&sh, ops);
                }
                eprintln!("kvroute: cluster: load synced with {peers} peer replica(s)");
                cl.with_health(&sh, |h| h.load_synced = true);
            }
            Apply::Worker(spec) => {
                let id = spec.id.clone();
                match control::register_replicated(&sh, spec) {
                    Ok(()) => {
                        crate::service::cluster::metrics::of(&sh)
                            .registry
                            .get_or_create(&OutcomeLabel { outcome: "put" })
                            .inc();
                    }
                    Err(e) => {
                        crate::service::cluster::metrics::of(&sh)
                            .registry
                            .get_or_create(&OutcomeLabel { outcome: "refused" })
                            .inc();
                        eprintln!(
                            "kvroute: cluster: replicated registration of {id:?} refused: {e}"
                        );
                    }
                }
            }
            Apply::Removed(id) => {
                if control::deregister_replicated(&sh, &id) {
                    crate::service::cluster::metrics::of(&sh)
                        .registry
                        .get_or_create(&OutcomeLabel { outcome: "delete" })
                        .inc();
                }
            }
        }
    }
}

fn done(sh: &Shared, cl: &Cluster, seq: u64) {
    cl.applied_seq.fetch_max(seq, Ordering::AcqRel);
    crate::service::cluster::metrics::of(sh)
        .applied_seq
        .set(seq as i64);
    cl.with_health(sh, |h| h.on_applied(seq));
}

fn apply_record(sh: &Shared, dedup: &mut crate::cluster::state::Dedup, rec: EventRecord) {
    let m = crate::service::cluster::metrics::of(sh);
    match dedup.judge(&rec.origin, &rec.worker, rec.seq) {
        Verdict::Own => return m.record("own", 1),
        Verdict::Duplicate => return m.record("duplicate", 1),
        Verdict::Apply { gap } => {
            if gap {
                m.record("gap", 1);
            }
        }
    }
    let Some(slot) = sh.registry.load().slot(&rec.worker) else {
        return m.record("unknown_worker", 1);
    };
    let gen = sh.cells(slot).map_or(0, |c| c.gen.load(Ordering::Acquire));
    let ops: Arc<[IndexOp]> = rec.ops.into_iter().map(to_index).collect();
    for to in 0..sh.cores {
        let msg = Msg::Index {
            slot,
            gen,
            ops: ops.clone(),
        };
        if !control::send_blocking(sh, to, msg) {
            return;
        }
    }
    m.record("applied", 1);
}
