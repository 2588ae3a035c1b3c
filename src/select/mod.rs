//! Routing decisions: cost, hard filters, selection, routing modes and the two-stage
//! disaggregated prefill/decode flow (DESIGN §1 "Cost", "Selection", "Disaggregated
//! prefill/decode").
//!
//! This is the only place in kvroute that *decides*. The engine and the service gather
//! the inputs (worker specs, liveness, load figures, this request's per-worker overlaps)
//! into a slice of [`WorkerRow`]s and call [`decide`]; everything here is a pure
//! function of those inputs, the caller's random generator and the caller's
//! round-robin cursor.
//!
//! Guarantees:
//! - no I/O, no clocks, no threads, no panics on any input;
//! - no heap allocation on the decision path unless `explain` is requested (or an
//!   error message is built), so choosing among 1,024 workers stays in the low
//!   microseconds (see `benches/select.rs`);
//! - every filtered-out worker has a [`Rejection`] reason, summarised in
//!   [`RouteError::AllFiltered`] and listed in [`Decision::rejected`] with `explain`.
//!
//! Layout: [`cost`](cost_terms) computes the per-worker terms, `filter` holds the hard
//! filters, `pick` the per-mode selection algorithms over one stage, and `decide` the
//! orchestration of stages, fallbacks and errors.

mod cost;
mod decide;
mod filter;
mod fleet;
mod pick;
#[cfg(test)]
mod tests;

pub use cost::{cost_terms, CostTerms};
pub use decide::{decide, Decision, Explain, Fallback, Rejected, RouteError, RouteInput, RrState};
pub use filter::{DpBounds, Filters, Rejection, RejectionCounts};
pub use fleet::Fleet;

use crate::types::{Overlap, WorkerSlot, WorkerSpec};
use serde::Serialize;
use std::fmt;

/// Which stage of a decision a worker was considered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Single-stage routing: an aggregated fleet, or the decode-only fallback of a
    /// disaggregated one.
    Aggregated,
    /// First stage of disaggregated routing: the worker that runs the prompt.
    Prefill,
    /// Second stage of disaggregated routing: the worker that generates.
    Decode,
}

impl Stage {
    /// Lower-case name as used in JSON and error messages.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Aggregated => "aggregated",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Active-load figures of one worker, as kept by the load accounting.
pub use crate::load::WorkerLoad as LoadFigures;

/// The shape of the request being routed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RequestShape {
    /// Prompt length in tokens (the prefill term divides it by `block_size`).
    pub input_tokens: u32,
    /// KV blocks the prompt occupies: `ceil(input_tokens / block_size)`.
    pub prompt_blocks: u32,
}

impl RequestShape {
    /// Shape of a prompt of `input_tokens` tokens with blocks of `block_size` tokens.
    /// A `block_size` of 0 is treated as 1 so the function cannot panic.
    pub fn new(input_tokens: u32, block_size: u32) -> RequestShape {
        RequestShape {
            input_tokens,
            prompt_blocks: input_tokens.div_ceil(block_size.max(1)),
        }
    }
}

/// Everything the decision needs to know about one registered worker for this request.
#[derive(Clone, Copy, Debug)]
pub struct WorkerRow<'a> {
    /// The worker's dense handle, echoed back in the decision.
    pub slot: WorkerSlot,
    /// What the worker declared at registration.
    pub spec: &'a WorkerSpec,
    /// `false` (heartbeat timed out, not connected) → never eligible.
    pub live: bool,
    /// The index state of the worker is suspect (event gap): its overlap counts as zero.
    pub suspect: bool,
    /// This request's prefix overlap on the worker (from the index merge).
    pub overlap: Overlap,
    /// Of this request's blocks, how many the worker's active requests already hold.
    pub reuse_blocks: u32,
    /// The worker's active-load figures.
    pub load: LoadFigures,
    /// Distinct active KV blocks of the worker (used when `assume_kv_reuse`).
    pub blocks_unique: f64,
}
