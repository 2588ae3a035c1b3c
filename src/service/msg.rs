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

    /// Appends the hashes owned by `shard` to `out`.
    pub fn select(&self, shard: usize, bits: u32, out: &mut Vec<u64>) {
        out.clear();
        let keep = |h: &u64| crate::index::shard_of(*h, bits) == shard;
        match self {
            Hashes::Owned(v) => out.extend(v.iter().copied().filter(keep)),
            Hashes::Wire(w) => out.extend(w.iter().filter(keep)),
        }
    }
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

/// A lifecycle notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifeOp {
    FirstToken,
    Progress(u32),
    Finish,
    PrefillFailed,
}

/// What a disaggregated request keeps so it can be re-routed after a prefill failure.
#[derive(Clone, Debug)]
pub struct Retained {
    pub prepared: Prepared,
    pub mode: crate::config::Mode,
    pub expected_output_tokens: Option<u32>,
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
        answer: ShardAnswer,
        reuse: Vec<(WorkerSlot, u32)>,
        /// Answer to `check_id`: `Some(true)` when the id is unknown here.
        id_free: Option<bool>,
    },
    Active {
        slot: WorkerSlot,
        add: bool,
        hashes: Arc<[u64]>,
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
    Snapshot(Arc<super::persist::Collect>),
}

/// Which inbox of a core a message travels in (see `service::lanes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// On a routing request's path: handled before any queued index work.
    Urgent = 0,
    /// Index batches and snapshot dumps: handled in budgeted slices.
    Bulk = 1,
}

impl Msg {
    /// The lane this message travels in. `Forget` is urgent: it must reach a
    /// core before any commit for the slot's new identity (both lanes are drained
    /// urgent-first, and index batches of an old identity are dropped by generation).
    pub fn lane(&self) -> Lane {
        match self {
            Msg::Index { .. } | Msg::Snapshot(_) => Lane::Bulk,
            Msg::Forget { .. }
            | Msg::Query { .. }
            | Msg::Answer { .. }
            | Msg::Active { .. }
            | Msg::Lifecycle { .. }
            | Msg::LifecycleDone { .. } => Lane::Urgent,
        }
    }
}

/// A reply delivered to a waiting task.
pub enum Reply {
    Answer {
        answer: ShardAnswer,
        reuse: Vec<(WorkerSlot, u32)>,
        id_free: Option<bool>,
    },
    Lifecycle(Result<LifeOutcome, EngineError>),
}

/// What the API layers get back from a route call.
pub type RouteResult = Result<RouteDecision, EngineError>;
