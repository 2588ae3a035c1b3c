//! Request-level records of the load tracker: what a routing decision hands in
//! ([`NewRequest`]), what a caller can inspect ([`RequestInfo`]), what it must undo
//! elsewhere when a request leaves ([`Finished`]), what carries it into another tracker
//! ([`CarriedRequest`]: snapshots, peer replicas), and the tracker's private per-request
//! state with the output-block weighting rule.

use crate::types::WorkerSlot;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest accepted request id, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = crate::ids::MAX_ID_LEN;

/// A routing decision to account for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRequest {
    /// Request id (1..=128 bytes), unique among active requests.
    pub id: String,
    /// Aggregated worker, or decode worker of a disaggregated decision.
    pub decode_worker: WorkerSlot,
    /// Prefill worker of a disaggregated decision; `None` when the decode (aggregated)
    /// worker does its own prefill.
    pub prefill_worker: Option<WorkerSlot>,
    /// Input sequence length (ISL) in tokens.
    pub input_tokens: u32,
    /// Prefix tokens already cached on the prefill-side worker.
    pub cached_tokens: u32,
    /// KV blocks the prompt occupies on the decode worker (`ceil(isl / block_size)`).
    pub prompt_blocks: u32,
    /// The request's sequence hashes, handed back on finish so the caller can remove
    /// them from its [`ActiveBlocksShard`](super::ActiveBlocksShard)s.
    pub hashes: Vec<u64>,
    /// Expected output length (OSL hint), if the frontend knows one.
    pub expected_output_tokens: Option<u32>,
    /// Routing time (µs, caller's clock).
    pub now_us: u64,
    /// The caller named the worker (`pin`, mode `direct`): the decision is not a
    /// routing of the prompt's prefix, so it teaches no prefix affinity, neither here
    /// nor on a peer replica (`select::Affinity::note_decision`).
    pub pinned: bool,
}

/// Why a lifecycle call was rejected. A rejected call changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum LifecycleError {
    /// `on_route` with an id that is already active.
    #[error("request id is already active")]
    Duplicate,
    /// The id is not active: never routed, already finished, or its worker was removed.
    #[error("unknown request id (never routed, already finished, or its worker was removed)")]
    UnknownRequest,
    /// The id breaks the id rule (`crate::ids`: 1..=128 bytes of `[A-Za-z0-9._:@+=-]`).
    #[error("request id must be 1..=128 bytes of [A-Z a-z 0-9 . _ : @ + = -]")]
    InvalidId,
}

/// Checks the id rule (`crate::ids`) shared by every lifecycle call and restore.
pub(super) fn check_id(id: &str) -> Result<(), LifecycleError> {
    if crate::ids::check("request id", id).is_err() {
        Err(LifecycleError::InvalidId)
    } else {
        Ok(())
    }
}

/// Where a request is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Routed, first token not seen: its effective ISL counts as prefill load.
    Prefill,
    /// Prefill complete (first token or progress seen, or its prefill worker was removed).
    Decode,
}

/// Why a request left the tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `on_finish`.
    Finished,
    /// `on_prefill_failed` (the frontend falls back to aggregated routing).
    PrefillFailed,
    /// `remove_worker` on its decode worker.
    WorkerRemoved,
    /// `expire`: no lifecycle call for the request TTL.
    Expired,
}

/// A request that left the tracker: every contribution it made has been removed; the
/// caller undoes the rest (e.g. `ActiveBlocksShard::remove(decode_worker, &hashes)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub id: String,
    pub decode_worker: WorkerSlot,
    pub prefill_worker: Option<WorkerSlot>,
    /// The hashes given at routing time (moved back, not copied).
    pub hashes: Vec<u64>,
    pub prompt_blocks: u32,
    pub input_tokens: u32,
    pub cached_tokens: u32,
    /// Output tokens reported by the last progress call (0 if none).
    pub output_tokens: u32,
    pub routed_at_us: u64,
    /// When prefill completed (first token, or progress implying it), if it did.
    pub first_token_us: Option<u64>,
    pub reason: FinishReason,
}

/// A snapshot of one active request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestInfo {
    pub decode_worker: WorkerSlot,
    pub prefill_worker: Option<WorkerSlot>,
    pub phase: Phase,
    pub input_tokens: u32,
    pub cached_tokens: u32,
    /// `input_tokens - cached_tokens` (saturating): the prompt-side work.
    pub effective_isl: u32,
    pub prompt_blocks: u32,
    pub output_tokens: u32,
    pub expected_output_tokens: Option<u32>,
    pub routed_at_us: u64,
    pub first_token_us: Option<u64>,
    /// Predicted prefill duration (µs), under the `predicted` prefill load model.
    pub predicted_prefill_us: Option<u64>,
    /// This request's current weighted output placeholder blocks × 1000.
    pub output_blocks_milli: u64,
}

/// An active request as carried out of one tracker into another: across a restart
/// (warm-restart snapshots, `snapshot::SavedRequest`) and to peer replicas (`--cluster`
/// load batches, `cluster::load::LoadOp::Route`). It holds everything the request's
/// accounting is derived from, with times as ages so they survive a new clock.
///
/// `W` names a worker: a slot of this process's registry (the default, what
/// [`LoadTracker::restore`](super::LoadTracker::restore) takes), an index into a
/// snapshot's worker list, or a worker id between replicas (slots differ between
/// processes); [`CarriedRequest::map_workers`] converts. The serde form is the JSON of
/// a load batch's route op (docs/PROTOCOL.md): its field names and the fields it leaves
/// out are that format, pinned by `cluster::load`'s tests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarriedRequest<W = WorkerSlot> {
    pub id: String,
    #[serde(rename = "decode")]
    pub decode_worker: W,
    #[serde(rename = "prefill", default, skip_serializing_if = "Option::is_none")]
    pub prefill_worker: Option<W>,
    pub input_tokens: u32,
    pub cached_tokens: u32,
    pub prompt_blocks: u32,
    pub hashes: Vec<u64>,
    #[serde(rename = "osl", default, skip_serializing_if = "Option::is_none")]
    pub expected_output_tokens: Option<u32>,
    /// Still contributing prefill load (no first token yet). This and the rest are the
    /// request's progress: a fresh route ([`CarriedRequest::fresh`]) is in prefill,
    /// with no output, age 0, and its JSON leaves them out.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub in_prefill: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_tokens: u32,
    /// Time since routing when carried (µs).
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub age_us: u64,
    /// Time since prefill completed when carried (µs), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_age_us: Option<u64>,
    /// Time since its last lifecycle call (or its routing) when carried (µs): a peer
    /// that takes it over in a load sync expires it when the holder would
    /// (`LoadTracker::expire`). Absent = 0 (a fresh route; snapshots do not save it,
    /// so a restored request's TTL starts again at the restore).
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub idle_us: u64,
    /// Routed to a worker the caller pinned ([`NewRequest::pinned`]): a peer admits
    /// its load but notes no prefix affinity for it. Left out when false, so a route
    /// of an older peer reads as not pinned.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pinned: bool,
    /// Routed by this process (not restored from a snapshot nor taken from a peer):
    /// what a snapshot needs to tell its own proxy's requests apart. Never on the wire.
    #[serde(skip)]
    pub local: bool,
}

impl CarriedRequest {
    /// A request just routed: in prefill, no output, age 0.
    pub fn fresh(req: &NewRequest) -> CarriedRequest {
        CarriedRequest {
            id: req.id.clone(),
            decode_worker: req.decode_worker,
            prefill_worker: req.prefill_worker,
            input_tokens: req.input_tokens,
            cached_tokens: req.cached_tokens,
            prompt_blocks: req.prompt_blocks,
            hashes: req.hashes.clone(),
            expected_output_tokens: req.expected_output_tokens,
            in_prefill: true,
            output_tokens: 0,
            age_us: 0,
            first_token_age_us: None,
            idle_us: 0,
            pinned: req.pinned,
            local: true,
        }
    }
}

impl<W> CarriedRequest<W> {
    /// The same request with its workers named by `name`; `None` when `name` has no
    /// name for one of them.
    pub fn map_workers<V>(
        self,
        mut name: impl FnMut(&W) -> Option<V>,
    ) -> Option<CarriedRequest<V>> {
        let decode_worker = name(&self.decode_worker)?;
        let prefill_worker = match &self.prefill_worker {
            Some(p) => Some(name(p)?),
            None => None,
        };
        Some(CarriedRequest {
            id: self.id,
            decode_worker,
            prefill_worker,
            input_tokens: self.input_tokens,
            cached_tokens: self.cached_tokens,
            prompt_blocks: self.prompt_blocks,
            hashes: self.hashes,
            expected_output_tokens: self.expected_output_tokens,
            in_prefill: self.in_prefill,
            output_tokens: self.output_tokens,
            age_us: self.age_us,
            first_token_age_us: self.first_token_age_us,
            idle_us: self.idle_us,
            pinned: self.pinned,
            local: self.local,
        })
    }
}

fn yes() -> bool {
    true
}
fn is_true(b: &bool) -> bool {
    *b
}
fn is_false(b: &bool) -> bool {
    !*b
}
fn is_zero(n: &u32) -> bool {
    *n == 0
}
fn is_zero64(n: &u64) -> bool {
    *n == 0
}

/// Private per-request state. Its contributions to the aggregates are always exactly
/// derivable from it, which is what makes removal exact.
#[derive(Clone, Debug)]
pub(super) struct Req {
    pub decode: WorkerSlot,
    pub prefill: Option<WorkerSlot>,
    pub input_tokens: u32,
    pub cached_tokens: u32,
    pub prompt_blocks: u32,
    pub hashes: Vec<u64>,
    pub osl: Option<u32>,
    pub routed_at_us: u64,
    /// Its routing or its last lifecycle call (µs, the tracker's clock): it expires
    /// `ttl` after this (`LoadTracker::expire`).
    pub last_call_us: u64,
    /// Tie-break of equal routing times in the per-worker prefill order.
    pub seq: u64,
    /// Contributes prefill load to `prefill_slot()`.
    pub in_prefill: bool,
    pub first_token_us: Option<u64>,
    pub output_tokens: u32,
    /// Contribution to the decode worker's `output_blocks_milli`.
    pub output_milli: u64,
    /// Predicted prefill duration; 0 when the model is `full`.
    pub predicted_us: u64,
    /// Carried across a restart: its routing time is only approximate, so its first
    /// token does not feed the prefill predictor.
    pub carried: bool,
    /// The caller pinned its worker ([`NewRequest::pinned`]); carried along so a load
    /// sync tells peers too.
    pub pinned: bool,
}

impl Req {
    /// The worker whose prefill load this request adds to.
    pub fn prefill_slot(&self) -> WorkerSlot {
        self.prefill.unwrap_or(self.decode)
    }

    pub fn effective_isl(&self) -> u32 {
        self.input_tokens.saturating_sub(self.cached_tokens)
    }

    /// Key in the per-worker ordered set of active prefills (oldest first).
    pub fn prefill_key(&self) -> (u64, u64) {
        (self.routed_at_us, self.seq)
    }

    pub fn info(&self) -> RequestInfo {
        RequestInfo {
            decode_worker: self.decode,
            prefill_worker: self.prefill,
            phase: if self.in_prefill {
                Phase::Prefill
            } else {
                Phase::Decode
            },
            input_tokens: self.input_tokens,
            cached_tokens: self.cached_tokens,
            effective_isl: self.effective_isl(),
            prompt_blocks: self.prompt_blocks,
            output_tokens: self.output_tokens,
            expected_output_tokens: self.osl,
            routed_at_us: self.routed_at_us,
            first_token_us: self.first_token_us,
            predicted_prefill_us: (self.predicted_us > 0).then_some(self.predicted_us),
            output_blocks_milli: self.output_milli,
        }
    }

    pub fn into_finished(self, id: String, reason: FinishReason) -> Finished {
        Finished {
            id,
            decode_worker: self.decode,
            prefill_worker: self.prefill,
            hashes: self.hashes,
            prompt_blocks: self.prompt_blocks,
            input_tokens: self.input_tokens,
            cached_tokens: self.cached_tokens,
            output_tokens: self.output_tokens,
            routed_at_us: self.routed_at_us,
            first_token_us: self.first_token_us,
            reason,
        }
    }
}

/// Weighted output placeholder blocks × 1000 for a request that generated
/// `output_tokens` (DESIGN §1): one block per completed `block_size` of output; with an
/// OSL hint each weighs the remaining fraction `max(0, 1 - generated / osl)` (rounded
/// down to a thousandth of a block), without one each weighs 1.
pub fn output_blocks_milli(output_tokens: u32, block_size: u32, osl: Option<u32>) -> u64 {
    let blocks = u64::from(output_tokens / block_size.max(1));
    match osl {
        None => blocks * 1000,
        Some(osl) if output_tokens >= osl => 0,
        Some(osl) => {
            let remaining = u128::from(osl - output_tokens);
            // ≤ blocks · 1000, so the narrowing cannot truncate.
            (u128::from(blocks) * 1000 * remaining / u128::from(osl)) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_weighting_numbers() {
        // No hint: one full block per completed block_size.
        assert_eq!(output_blocks_milli(0, 16, None), 0);
        assert_eq!(output_blocks_milli(15, 16, None), 0);
        assert_eq!(output_blocks_milli(16, 16, None), 1000);
        assert_eq!(output_blocks_milli(47, 16, None), 2000);
        // Hint 100, block 16: at 32 tokens, 2 blocks × (1 - 0.32) = 1.36.
        assert_eq!(output_blocks_milli(32, 16, Some(100)), 1360);
        // at 64: 4 × 0.36 = 1.44; at 96: 6 × 0.04 = 0.24.
        assert_eq!(output_blocks_milli(64, 16, Some(100)), 1440);
        assert_eq!(output_blocks_milli(96, 16, Some(100)), 240);
        // Reaching or passing the hint: weight 0.
        assert_eq!(output_blocks_milli(100, 16, Some(100)), 0);
        assert_eq!(output_blocks_milli(500, 16, Some(100)), 0);
        assert_eq!(output_blocks_milli(0, 16, Some(0)), 0);
        // Rounded down: 1 block × 2/3.
        assert_eq!(output_blocks_milli(16, 16, Some(48)), 666);
        // Extremes do not overflow; block_size 0 is treated as 1.
        assert_eq!(
            output_blocks_milli(u32::MAX, 1, None),
            u64::from(u32::MAX) * 1000
        );
        assert_eq!(output_blocks_milli(3, 0, None), 3000);
    }

    #[test]
    fn id_rules() {
        assert_eq!(check_id(""), Err(LifecycleError::InvalidId));
        assert_eq!(check_id(&"x".repeat(129)), Err(LifecycleError::InvalidId));
        assert_eq!(check_id(&"x".repeat(128)), Ok(()));
        assert_eq!(check_id("a"), Ok(()));
        assert!(LifecycleError::Duplicate
            .to_string()
            .contains("already active"));
    }
}
