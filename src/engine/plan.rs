//! Glue shared by the in-process engine and the service: writing a merge result into a
//! request's [`Hits`], and turning a slot-based [`Decision`] into the id-based
//! [`RouteDecision`] the API returns. Pure functions, no state.

use super::request::{CandidateOut, RouteDecision};
use crate::index::{MergeResult, Speculated};
use crate::registry::Registry;
use crate::select::{Decision, Fallback, Fleet, Hits, Stage};
use crate::types::{Overlap, WorkerSlot};

/// Starts `hits` on `fleet` from a merge result and active-block reuse counts: every
/// worker gets the shared-cache run from position 0, the merged workers their own
/// overlap, and reuse adds up per worker.
pub fn write_hits(
    hits: &mut Hits,
    fleet: &Fleet,
    merged: &MergeResult,
    reuse: impl IntoIterator<Item = (WorkerSlot, u32)>,
) {
    hits.begin(
        fleet,
        Overlap {
            shared: merged.shared_from_start(),
            ..Overlap::default()
        },
    );
    for &w in merged.workers() {
        hits.set_overlap(fleet, w, &merged.get(w));
    }
    for (w, r) in reuse {
        hits.add_reuse(fleet, w, r);
    }
}

/// Overwrites the overlap of every worker with pending blocks by its speculative
/// overlap (`index::speculate`).
pub fn write_speculative(hits: &mut Hits, fleet: &Fleet, spec: &[Speculated]) {
    for s in spec {
        hits.set_overlap(fleet, s.worker, &s.overlap);
    }
}

/// Where a routed request's prompt blocks become pending, and from which position:
/// the worker doing the prefill (the prefill worker when disaggregated), from the end
/// of its confirmed device run (blocks already on device need no entry).
pub fn speculative_target(d: &Decision, merged: &MergeResult) -> (WorkerSlot, usize) {
    let w = d.prefill_worker.unwrap_or(d.decode_worker);
    (w, merged.get(w).device as usize)
}

/// Speculative blocks of worker `w` in `spec` (0 when it has none).
pub fn speculative_of(spec: &[Speculated], w: WorkerSlot) -> u32 {
    spec.iter()
        .find(|s| s.worker == w)
        .map_or(0, |s| s.speculative)
}

/// Wire name of a fallback.
pub fn fallback_name(f: Fallback) -> &'static str {
    match f {
        Fallback::None => "none",
        Fallback::NoPrefillWorkers => "no_prefill_workers",
        Fallback::PrefillFilteredOut => "prefill_filtered_out",
        Fallback::PrefillFailed => "prefill_failed",
    }
}

/// Wire name of a stage.
pub fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Aggregated => "aggregated",
        Stage::Prefill => "prefill",
        Stage::Decode => "decode",
    }
}

fn worker_id(reg: &Registry, slot: crate::types::WorkerSlot) -> String {
    reg.get(slot)
        .map(|e| e.spec.id.clone())
        .unwrap_or_else(|| format!("#{slot}"))
}

/// Converts a decision into the API answer.
pub fn to_output(
    reg: &Registry,
    request_id: &str,
    d: &Decision,
    explain: bool,
    spec: &[Speculated],
) -> RouteDecision {
    RouteDecision {
        request_id: request_id.to_string(),
        decode_worker: worker_id(reg, d.decode_worker),
        prefill_worker: d.prefill_worker.map(|p| worker_id(reg, p)),
        dp_rank: d.dp_rank,
        overlap: d.overlap,
        cost: d.cost,
        fallback: fallback_name(d.fallback).to_string(),
        candidates: explain.then(|| {
            d.candidates
                .iter()
                .map(|c| CandidateOut {
                    worker: worker_id(reg, c.worker),
                    stage: stage_name(c.stage).to_string(),
                    prefill_blocks: c.prefill_blocks,
                    overlap: c.overlap,
                    adjusted_prefill: c.adjusted_prefill,
                    decode_blocks: c.decode_blocks,
                    cost: c.cost,
                    speculative: speculative_of(spec, c.worker),
                })
                .collect()
        }),
        local_prefill: d.local_prefill.map(|l| l.name().to_string()),
        affinity: d.affinity.map(|a| super::request::AffinityOut {
            worker: worker_id(reg, a.worker),
            source: match a.source {
                crate::select::AffinitySource::Session => "session",
                crate::select::AffinitySource::Prefix => "prefix",
            }
            .to_string(),
            kept: a.kept,
        }),
    }
}

/// The load-tracker record of a routed request: the decision's workers, the prompt's
/// shape, and the tokens already cached on the prefill-side worker.
pub fn new_request(
    id: &str,
    d: &Decision,
    prepared: &super::request::Prepared,
    hashes: Vec<u64>,
    block_size: u32,
    osl: Option<u32>,
    now_us: u64,
) -> crate::load::NewRequest {
    crate::load::NewRequest {
        id: id.to_string(),
        decode_worker: d.decode_worker,
        prefill_worker: d.prefill_worker,
        input_tokens: prepared.input_tokens,
        cached_tokens: cached_tokens(d.overlap, block_size, prepared.input_tokens),
        prompt_blocks: prepared.prompt_blocks,
        hashes,
        expected_output_tokens: osl,
        now_us,
        pinned: prepared.filters.pin.is_some(),
    }
}

/// Tokens of the prompt already cached on the worker doing the prefill.
pub fn cached_tokens(overlap: Overlap, block_size: u32, input_tokens: u32) -> u32 {
    (overlap.own() as u64 * block_size as u64).min(input_tokens as u64) as u32
}
