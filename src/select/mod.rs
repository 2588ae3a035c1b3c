//! Routing decisions: cost, hard filters, selection, routing modes and the two-stage
//! disaggregated prefill/decode flow (DESIGN §1 "Cost", "Selection", "Disaggregated
//! prefill/decode").
//!
//! This is the only place in kvroute that *decides*. The engine and the service keep a
//! [`Fleet`] (static worker data, per registry change) and its [`Loads`] (liveness and
//! load, updated as they change), write one request's [`Hits`] (overlaps and
//! active-block reuse) and call [`decide_view`]; [`decide`] takes the same inputs as a
//! slice of [`WorkerRow`]s instead (tests, tools) and gives the same decisions.
//! Everything here is a pure function of those inputs, the caller's random generator
//! and the caller's round-robin cursor.
//!
//! Guarantees:
//! - no I/O, no clocks, no threads, no panics on any input;
//! - [`decide_view`] allocates nothing once its [`Scratch`] has grown to the fleet size,
//!   unless `explain` is requested (or an error message is built); its `kv` stages run
//!   the dense kernel of `kernel.rs` (figures in `benches/select.rs` and
//!   `docs/PERFORMANCE.md`);
//! - every filtered-out worker has a [`Rejection`] reason, summarised in
//!   [`RouteError::AllFiltered`] and listed in [`Decision::rejected`] with `explain`.
//!
//! Layout: [`cost`](cost_terms) computes the per-worker terms, `filter` holds the hard
//! filters, `pick` the per-mode selection algorithms over one stage (row by row),
//! `kernel` the dense `kv` selection, `fleet` and `loads` the struct-of-arrays inputs,
//! `decide` the orchestration of stages, fallbacks and errors, `decision` what a
//! decision answers, `local` the conditional-disaggregation rule, and `affinity` /
//! `session` the route-time prefix and session affinity tables.

mod affinity;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod cost;
mod decide;
mod decision;
mod fill;
mod filter;
mod fleet;
mod hits;
mod kernel;
mod loads;
mod local;
mod pick;
mod routed;
mod session;
mod stage;
#[cfg(test)]
mod tests;

pub use affinity::Affinity;
pub use cost::{cost_terms, CostTerms};
pub use decide::{
    decide, decide_view, Decision, Explain, Fallback, Rejected, RouteError, RouteInput, RrState,
    Scratch, ViewInput,
};
pub use decision::{AffinitySource, AffinityUse, LocalPrefill};
pub use filter::{DpBounds, Filters, Rejection, RejectionCounts};
pub use fleet::Fleet;
pub use hits::Hits;
pub use loads::Loads;
pub use local::local_prefill;
pub use session::Sessions;

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

impl WorkerRow<'_> {
    /// The figures of the row, without the spec.
    #[inline(always)]
    pub(crate) fn fig(&self) -> Fig {
        Fig {
            slot: self.slot,
            live: self.live,
            suspect: self.suspect,
            overlap: self.overlap,
            reuse_blocks: self.reuse_blocks,
            load: self.load,
            blocks_unique: self.blocks_unique,
            cpu: self.spec.device == crate::types::DeviceClass::Cpu,
            throughput: self.spec.throughput_weight.unwrap_or(0.0),
        }
    }
}

/// A [`WorkerRow`] without the spec: what filters and cost read of a worker.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Fig {
    pub slot: WorkerSlot,
    pub live: bool,
    pub suspect: bool,
    pub overlap: Overlap,
    pub reuse_blocks: u32,
    pub load: LoadFigures,
    pub blocks_unique: f64,
    /// The worker is a CPU worker (its speed for `weigh_by_throughput`).
    pub cpu: bool,
    /// Its declared `throughput_weight`, 0 when it declares none.
    pub throughput: f64,
}

/// The workers of a decision, row by row (the row-by-row path of `pick`, `explain`).
pub(crate) trait Rows {
    fn len(&self) -> usize;
    /// Figures of row `i` (default figures out of range).
    fn fig(&self, i: usize) -> Fig;
}

impl Rows for [WorkerRow<'_>] {
    fn len(&self) -> usize {
        <[WorkerRow]>::len(self)
    }
    #[inline(always)]
    fn fig(&self, i: usize) -> Fig {
        self.get(i).map(WorkerRow::fig).unwrap_or_default()
    }
}
