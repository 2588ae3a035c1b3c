//! Messages that travel between cores through the mailboxes.
//!
//! Ownership rules: index and active-block messages go to the core owning the shard; a
//! request lives on the core that routed it (its home), and a lifecycle call arriving
//! elsewhere is asked of the other cores. Replies go back to the `from` core and complete the waiter
//! registered under `qid`. Hash lists are shared (`Arc` / zero-copy wire bytes) and each
//! shard picks out its own hashes, so a fan-out never copies them.

use crate::engine::{EngineError, Prepared, RouteDecision};
use crate::index::ShardAnswer;
use crate::types::{Tier, WorkerSlot};
use std::sync::Arc;

/// A shared list of block hashes.
#[derive(Clone, Debug)]
pub enum Hashes {
    Owned(Arc<[u64]>),
    Wire(crate::codec::HashList),
}

impl Hashes {
    pub fn len(&self) -> usize {
        match self {
            Hashes::Owned(v) => v.len(),
            Hashes::Wire(w) => w.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces `out` with the hashes owned by `shard`, in order.
    pub fn select(&self, shard: usize, bits: u32, out: &mut Vec<u64>) {
        match self {
            Hashes::Owned(v) => select_into(v.iter().copied(), v.len(), shard, bits, out),
            Hashes::Wire(w) => select_into(w.iter(), w.len(), shard, bits, out),
        }
    }
}

/// Replaces `out` with the hashes of `src` owned by `shard`, in order (the
/// branch-free [`select_into`] over a plain slice: active-block updates).
pub fn select_slice(src: &[u64], shard: usize, bits: u32, out: &mut Vec<u64>) {
    select_into(src.iter().copied(), src.len(), shard, bits, out)
}

/// Branch-free filter: every hash is written at the cursor, which advances only for
/// this shard's. Shard membership is a coin flip per hash, so a filtering branch would
/// be mispredicted half the time (it was ~9 % of a core under ingest).
fn select_into(
    src: impl Iterator<Item = u64>,
    len: usize,
    shard: usize,
    bits: u32,
    out: &mut Vec<u64>,
) {
    out.clear();
    out.resize(len, 0);
    let mut n = 0usize;
    for h in src {
        // `n` never passes the number of hashes seen so far, so it stays < len.
        if let Some(slot) = out.get_mut(n) {
            *slot = h;
        }
        n += usize::from(crate::index::shard_of(h, bits) == shard);
    }
    out.truncate(n);
}

/// A change to one worker's part of an index shard.
#[derive(Clone, Debug)]
pub enum IndexOp {
    Stored {
        tier: Tier,
        hashes: Hashes,
    },
    Removed {
        tier: Tier,
        hashes: Hashes,
    },
    Cleared {
        tier: Option<Tier>,
    },
    /// Per-shard cap on the worker's indexed blocks.
    SetCap(u64),
}

/// A routed request's prompt blocks from position `from` on become pending on `slot`
/// at `now_us` (speculative indexing, `index::pending`), or stop being pending there
/// when the request ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecAdd {
    pub slot: WorkerSlot,
    pub from: u32,
    pub now_us: u64,
}

pub use crate::engine::request::LifeOp;

/// What a disaggregated request keeps so it can be re-routed after a prefill failure.
#[derive(Clone, Debug)]
pub struct Retained {
    pub prepared: Prepared,
    pub mode: crate::config::Mode,
    pub expected_output_tokens: Option<u32>,
}

/// `--cluster`: a peer's routing or lifecycle call, resolved to this replica's slots, for a core.
pub enum ReplicaOp {
    Route(crate::load::CarriedRequest),
    Life(LifeOp, String),
    /// Send this core's in-flight requests (a load sync).
    Carry(tokio::sync::mpsc::UnboundedSender<Vec<crate::load::CarriedRequest>>),
}

/// Result of a lifecycle call at the core holding the request.
#[derive(Debug)]
pub enum LifeOutcome {
    Done,
    /// Prefill failed: the request was released; re-route it decode-only.
    Reroute(Box<Retained>),
}

pub enum Msg {
    /// A batch of one worker's index operations, in order (shared by every shard).
    Index {
        slot: WorkerSlot,
        gen: u64,
        ops: Arc<[IndexOp]>,
    },
    /// Drop everything about a slot (worker removed, or a new epoch).
    Forget { slot: WorkerSlot },
    Query {
        from: usize,
        qid: u64,
        items: Vec<(u32, u64)>,
        /// Check that this request id is unknown at the receiver (duplicate
        /// detection; the sender has claimed it on its own core first).
        check_id: Option<String>,
    },
    Answer {
        qid: u64,
        /// Boxed: the run-length answer's buffers would make every `Msg` large.
        answer: Box<QueryAnswer>,
    },
    Active {
        slot: WorkerSlot,
        add: bool,
        hashes: Arc<[u64]>,
        /// With a routing commit (`add`): these hashes become pending there; with the
        /// end of a request: they are no longer pending there.
        spec: Option<SpecAdd>,
    },
    Lifecycle {
        from: usize,
        qid: u64,
        op: LifeOp,
        id: String,
    },
    LifecycleDone {
        qid: u64,
        result: Result<LifeOutcome, EngineError>,
    },
    /// Dump this core's shard into the collector (warm-restart snapshot).
    Snapshot(Arc<crate::service::runtime::dump::Collect>),
    /// Read-your-writes barrier: travels in the bulk lane behind the index batches the
    /// sender queued before it, so when the receiver handles it every one of those
    /// batches is applied; it answers `Applied { qid }` to `from`.
    Barrier { from: usize, qid: u64 },
    /// Answer to a `Barrier`: the receiver applied everything queued before it.
    Applied { qid: u64 },
    /// `--cluster`: a peer replica's routing or lifecycle call (`cluster::bridge`).
    Replica(Box<ReplicaOp>),
    /// A route on the sender will query this core soon (a proxied request is being
    /// tokenized there): stay awake for it (`answer_spin`). A hint; nothing answers it.
    Expect,
}

/// Active-block updates of at least this many hashes (a 4k-token prompt in blocks of
/// 16) ring the receiver's doorbell ([`Msg::is_quiet`]).
pub const LOUD_ACTIVE: usize = 256;

/// Which inbox of a core a message travels in (see `service::lanes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// On a routing request's path: handled before any queued index work.
    Urgent = 0,
    /// Index batches and snapshot dumps: handled in budgeted slices.
    Bulk = 1,
}

impl Msg {
    /// Whether the message travels without ringing the receiver's doorbell
    /// (`Mailbox::push_quiet`): active-block updates of fewer than [`LOUD_ACTIVE`]
    /// hashes, two per request and core. A parked receiver applies them, in order with
    /// the rest, at its next wake-up, before its next decision (`Core::catch_up`), and
    /// at the latest at its probe's next tick (`schedule_lag::PERIOD`); each doorbell
    /// was a wake-up of the other core (a system call here, a pass through its rings
    /// there). A long prompt's update rings: its thousands of table updates cost far
    /// more than the wake-up, and an idle receiver applies them at once instead of at
    /// the start of its next decision.
    pub fn is_quiet(&self) -> bool {
        matches!(self, Msg::Active { hashes, .. } if hashes.len() < LOUD_ACTIVE)
    }

    /// The lane this message travels in. `Forget` is urgent: it must reach a
    /// core before any commit for the slot's new identity (both lanes are drained
    /// urgent-first, and index batches of an old identity are dropped by generation).
    pub fn lane(&self) -> Lane {
        match self {
            Msg::Index { .. } | Msg::Snapshot(_) | Msg::Barrier { .. } => Lane::Bulk,
            Msg::Forget { .. }
            | Msg::Query { .. }
            | Msg::Answer { .. }
            | Msg::Active { .. }
            | Msg::Lifecycle { .. }
            | Msg::LifecycleDone { .. }
            | Msg::Applied { .. }
            | Msg::Replica(_)
            | Msg::Expect => Lane::Urgent,
        }
    }
}

/// One shard's answer to a `Query` (or to the home core's own query,
/// `Core::local_query`).
pub struct QueryAnswer {
    /// Index matches.
    pub answer: ShardAnswer,
    /// Active-block reuse: (worker, blocks).
    pub reuse: Vec<(WorkerSlot, u32)>,
    /// Pending (speculative) blocks: (position, worker).
    pub spec: Vec<(u32, WorkerSlot)>,
    /// Answer to `check_id`: `Some(true)` when the id is unknown here.
    pub id_free: Option<bool>,
}

/// A reply delivered to a waiting task.
pub enum Reply {
    Answer(QueryAnswer),
    Lifecycle(Result<LifeOutcome, EngineError>),
    /// A `Barrier` came back: that core applied what was queued before it.
    Applied,
}

/// What the API layers get back from a route call.
pub type RouteResult = Result<RouteDecision, EngineError>;

#[cfg(test)]
mod tests {
    use super::{Hashes, Msg, LOUD_ACTIVE};
    use crate::index::shard_of;

    #[test]
    fn only_a_long_prompts_active_update_rings() {
        let active = |n: usize| Msg::Active {
            slot: 0,
            add: true,
            hashes: vec![1u64; n].into(),
            spec: None,
        };
        assert!(active(0).is_quiet());
        assert!(active(LOUD_ACTIVE - 1).is_quiet());
        assert!(!active(LOUD_ACTIVE).is_quiet());
        assert!(!Msg::Forget { slot: 0 }.is_quiet());
    }

    #[test]
    fn select_partitions_in_order() {
        let v: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let all = Hashes::Owned(v.clone().into());
        let wire = Hashes::Wire(crate::codec::HashList::from_slice(&v));
        for bits in [0u32, 1, 2] {
            let mut seen = 0;
            for shard in 0..1usize << bits {
                let mut a = vec![7u64; 3];
                all.select(shard, bits, &mut a);
                let mut b = Vec::new();
                wire.select(shard, bits, &mut b);
                let want: Vec<u64> = v
                    .iter()
                    .copied()
                    .filter(|h| shard_of(*h, bits) == shard)
                    .collect();
                assert_eq!(a, want);
                assert_eq!(b, want);
                seen += a.len();
            }
            assert_eq!(seen, v.len());
        }
    }
}
