//! What a decision answers: the chosen workers ([`Decision`]), its explain records
//! ([`Explain`], [`Rejected`]), why it fell back ([`Fallback`]) or failed
//! ([`RouteError`]), and the caller's round-robin cursor ([`RrState`]). Plain data, split
//! out of `decide.rs` (which orchestrates the stages) so each file stays small.

use super::filter::{Rejection, RejectionCounts};
use super::Stage;
use crate::types::{Overlap, WorkerSlot};
use serde::Serialize;
/// Why a disaggregated request was routed decode-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// Normal routing (aggregated fleet, or both disaggregated stages ran).
    None,
    /// The model's prefill pool has no live worker.
    NoPrefillWorkers,
    /// Live prefill workers exist but the request's filters (or busy) removed them all.
    PrefillFilteredOut,
    /// The frontend reported that prefill failed.
    PrefillFailed,
}

/// Where a request's affinity worker came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AffinitySource {
    /// The worker its prompt's prefix was last routed to ([`super::Affinity`]).
    #[default]
    Prefix,
    /// The worker its session's last turn went to ([`super::Sessions`]).
    Session,
}

/// The affinity worker a decision was offered, and whether it got the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AffinityUse {
    pub worker: WorkerSlot,
    pub source: AffinitySource,
    /// The request went to it (its cost was within the affinity slack).
    pub kept: bool,
}

/// Why a disaggregated request prefills on its decode worker (no prefill leg).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalPrefill {
    /// At most `local_prefill_max_uncached_tokens` of its prompt are not cached there.
    Short,
    /// The decode worker holds at least `local_prefill_min_cached_fraction` of it.
    Cached,
}

impl LocalPrefill {
    /// Metric label / header value.
    pub fn name(self) -> &'static str {
        match self {
            LocalPrefill::Short => "short",
            LocalPrefill::Cached => "cached",
        }
    }
}

/// The cost terms of one scored candidate (`explain`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Explain {
    pub worker: WorkerSlot,
    pub stage: Stage,
    pub prefill_blocks: f64,
    /// Overlap credited (zero for a suspect worker).
    pub overlap: Overlap,
    pub adjusted_prefill: f64,
    pub decode_blocks: f64,
    /// Stage cost, including any topology penalty.
    pub cost: f64,
}

/// A worker of a stage's pool that a filter removed (`explain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Rejected {
    pub worker: WorkerSlot,
    pub stage: Stage,
    pub reason: Rejection,
}

/// Where the request goes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// The worker that generates (the only worker of a single-stage decision).
    pub decode_worker: WorkerSlot,
    /// The worker that runs the prompt in a disaggregated decision.
    pub prefill_worker: Option<WorkerSlot>,
    /// DP rank on the decode worker: lowest rank within the request's bounds, or the
    /// worker's lowest rank without bounds.
    pub dp_rank: u32,
    /// DP rank on the prefill worker, same rule.
    pub prefill_dp_rank: Option<u32>,
    /// Overlap on the worker that does the prefill.
    pub overlap: Overlap,
    /// Cost of the decode (or single-stage) worker under its stage's config. Reported
    /// in every mode, so tools can compare modes.
    pub cost: f64,
    /// Cost of the prefill worker under the prefill-stage config.
    pub prefill_cost: Option<f64>,
    pub fallback: Fallback,
    /// A disaggregated request that prefills on its decode worker, and why
    /// (`local_prefill_*`; `prefill_worker` is then `None`).
    pub local_prefill: Option<LocalPrefill>,
    /// The affinity worker (session or prefix) the decision was offered, if any.
    pub affinity: Option<AffinityUse>,
    /// With `explain`: every scored candidate of every stage that ran, in row order.
    pub candidates: Vec<Explain>,
    /// With `explain`: every worker of a stage's pool removed by a filter.
    pub rejected: Vec<Rejected>,
}

/// Why no worker could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("no workers are registered for model {model:?}")]
    NoWorkers { model: String },
    #[error("no workers for the {stage} stage are registered for model {model:?}")]
    EmptyPool { stage: Stage, model: String },
    #[error("every {stage} worker was filtered out ({rejections})")]
    AllFiltered {
        stage: Stage,
        rejections: RejectionCounts,
    },
    #[error("every eligible {stage} worker is busy (busy_threshold reached)")]
    AllBusy { stage: Stage },
    #[error("pinned worker {pin:?} is not a {stage} worker of model {model:?}")]
    PinNotFound {
        pin: String,
        stage: Stage,
        model: String,
    },
    #[error("mode direct requires a pinned worker")]
    DirectNeedsPin,
    #[error("no eligible decode worker in topology domain {domain:?} of the prefill worker")]
    NoDecodeInDomain { domain: String },
}

/// Round-robin cursor, owned by the caller (one per router or per model, as it likes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RrState {
    /// Decisions made in round-robin mode so far.
    pub counter: u64,
    /// Decisions made so far (any mode): with `balance_slack`, the `kv` argmin takes
    /// the `(ties mod count)`-th of the workers tied with the minimum, so the traffic
    /// the slack frees spreads evenly over them instead of by chance.
    pub ties: u64,
}
