//! The cluster bridge (`--cluster`): how the glommio cores and the NATS side meet.
//!
//! - Cores (and the ZMQ threads) hand what their ingest accepted to the hooks of
//!   `runtime::cluster_link` (a `try_send` on a bounded channel, never blocking a
//!   core); this module starts what drains them.
//! - One OS thread, "kvroute-cluster", runs a small tokio runtime with the NATS client
//!   (`cluster::nats`): it publishes the buffer, consumes the stream and watches the
//!   registry bucket, and passes what it receives, in order, to the apply thread.
//! - The apply thread ("kvroute-cluster-apply", `cluster::apply`) turns received
//!   records into the cores' index batches and replicated registrations into
//!   registry writes.
//!
//! It also answers `/readyz` and keeps the stream sequence saved beside snapshots.
//!
//! Without `--cluster` none of this exists: every hook is one `OnceLock` load.

use crate::service::cluster::apply::{apply_loop, Apply};
use crate::service::runtime::cluster_link::Cluster;
use crate::service::runtime::cluster_metrics::ClusterMetrics;
use crate::service::runtime::shared::Shared;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The state dir file holding the stream sequence the snapshot beside it covers.
pub const SEQ_FILE: &str = "cluster.seq";

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
    let link = crate::service::runtime::cluster_link::Link {
        origin: format!("{replica}/{boot}"),
        sealer,
        start_after,
        max_workers: sh.settings.limits.max_workers,
        engines: sh.settings.engines.len(),
        orphans: orphans.iter().cloned().collect(),
        metrics,
        buffer: cfg.publish_buffer,
    };
    let (cluster, rx, load_rx) = Cluster::new(link);
    let cluster = Arc::new(cluster);
    cluster.metrics.state.set(0);
    if sh.cluster.set(cluster.clone()).is_err() {
        return Err("cluster bridge started twice".into());
    }
    // Sent once NATS is reached (the load publisher starts then).
    for id in orphans {
        crate::service::runtime::cluster_hooks::publish_life(
            sh,
            crate::service::runtime::msg::LifeOp::Finish,
            &id,
        );
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
