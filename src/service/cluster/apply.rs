//! The apply thread ("kvroute-cluster-apply"): what the NATS side receives
//! ([`Apply`], handed over in stream order) goes into the cores. Records become the
//! same `Msg::Index` batches the local ingest sends (`control::send_blocking`, the ZMQ
//! ingest's backpressure), after the origin / duplicate / gap judgement
//! (`crate::cluster::state::Dedup`); replicated registrations become registry writes;
//! peers' load changes and the start's load sync go through `cluster::load`.
//!
//! Guarantees: one thread applies everything, in the order received; a record of a
//! worker unknown here is counted and skipped (the receivers read its registration
//! first, `nats::consume::learn_worker`); it stops at shutdown.

use crate::cluster::state::Verdict;
use crate::cluster::wire::{EventRecord, RecOp};
use crate::service::cluster::load::{apply_load, load_sync};
use crate::service::routing::control;
use crate::service::runtime::cluster_link::Cluster;
use crate::service::runtime::cluster_metrics::OutcomeLabel;
use crate::service::runtime::msg::{Hashes, IndexOp, Msg};
use crate::service::runtime::shared::Shared;
use crate::types::WorkerSpec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
pub(in crate::service::cluster) fn apply_loop(
    sh: Arc<Shared>,
    cl: Arc<Cluster>,
    mut rx: tokio::sync::mpsc::Receiver<Apply>,
) {
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
            Apply::Connected { stream_last, start } => cl.with_health(|h| {
                h.applied = start;
                h.on_connected(stream_last);
            }),
            Apply::Tail => cl.with_health(|h| h.on_tail()),
            Apply::Load(ops) => apply_load(&sh, ops),
            Apply::LoadSync { ops, peers } => {
                if peers > 0 {
                    load_sync(&sh, ops);
                }
                eprintln!("kvroute: cluster: load synced with {peers} peer replica(s)");
                cl.with_health(|h| h.load_synced = true);
            }
            Apply::Worker(spec) => {
                let id = spec.id.clone();
                match control::register_replicated(&sh, spec) {
                    Ok(()) => {
                        sh.cluster_metrics()
                            .registry
                            .get_or_create(&OutcomeLabel { outcome: "put" })
                            .inc();
                    }
                    Err(e) => {
                        sh.cluster_metrics()
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
                    sh.cluster_metrics()
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
    sh.cluster_metrics().applied_seq.set(seq as i64);
    cl.with_health(|h| h.on_applied(seq));
}

fn apply_record(sh: &Shared, dedup: &mut crate::cluster::state::Dedup, rec: EventRecord) {
    let m = sh.cluster_metrics();
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
