//! The decision: which stages run, on which pools, with which configuration, and what
//! happens when a stage has no candidate (DESIGN §1 "Selection", "Disaggregated
//! prefill/decode").
//!
//! - Workers of role `Shared` are never candidates.
//! - If the request's model has any `Prefill` or `Decode` worker registered (whatever
//!   its liveness), the fleet is disaggregated:
//!   1. Prefill stage among `Prefill` workers, cost with `cfg.prefill_stage()`, the
//!      request's mode (`direct` → `kv`, since the pin names the decode worker).
//!      If the frontend reports the prefill failed (`prefill_failed`), or the pool
//!      has no live worker, or every live one is filtered out, the request falls back
//!      to decode-only routing among `Decode` and `Aggregated` workers with the base
//!      config, and [`Decision::fallback`] says why.
//!   2. Decode stage among `Decode` workers, cost with `cfg.decode_stage()`, the
//!      request's mode, the pin, and the topology policy relative to the chosen
//!      prefill worker's domain (a prefill worker without a domain imposes none;
//!      a decode worker without a domain is outside every domain).
//!   3. Conditional disaggregation (`local.rs`): if the chosen decode worker holds
//!      enough of the prompt, or little is left to compute, it prefills locally:
//!      no prefill worker in the decision, [`Decision::local_prefill`] says why.
//! - Otherwise one stage among `Aggregated` workers with the base config.
//!
//! Allow-list, dp bounds, taints and busy apply to every stage; the pin applies to the
//! single stage, or to the decode stage of a disaggregated decision. The round-robin
//! cursor advances once per successful round-robin decision; both stages of a
//! disaggregated decision use the same cursor value.
//!
//! The aggregated stage doubles as the probe for disaggregation: it stops at the first
//! `Prefill`/`Decode` worker of the model (the kernel asks the fleet, which knows), so
//! an aggregated fleet is decided in a single pass over the workers.
//!
//! [`decide_view`] and [`decide`] run the same orchestration; `decide` first lays its
//! rows out as a [`Fleet`], [`Loads`] and hits (allocating), so both choose alike.

use super::cost::{CostModel, Scorer};
pub use super::decision::{Decision, Explain, Fallback, Rejected, RouteError, RrState};
use super::filter::{Rejection, ScanStats, StageFilter};
use super::fleet::{role_bit, Fleet, UNKNOWN};
use super::hits::Hits;
use super::kernel::KernelScratch;
use super::loads::Loads;
use super::local::local_prefill;
use super::pick::{run_stage, Dense, Outcome, Pick, StageRun};
use super::routed::Routed;
use super::{Fig, RequestShape, Rows, Stage, WorkerRow};
use crate::config::{Mode, RouterConfig, TopologyPolicy};
use crate::types::{Overlap, Role};
use rand::Rng;

/// Everything one decision depends on (besides randomness and the round-robin cursor).
#[derive(Clone, Copy, Debug)]
pub struct RouteInput<'a> {
    /// Base routing configuration (the stage configs are derived from it).
    pub cfg: &'a RouterConfig,
    /// The request's routing mode.
    pub mode: Mode,
    pub req: RequestShape,
    pub filters: &'a super::Filters,
    /// Every registered worker (any model, role, liveness) with its per-request figures.
    pub workers: &'a [WorkerRow<'a>],
    /// The static filter data of `workers` (same specs, same order), built once per
    /// registry change. `None`, or a fleet of another length, makes `decide` build one
    /// from the rows' specs for this call (allocating).
    pub fleet: Option<&'a Fleet>,
    /// The frontend reports that this request's prefill failed: route decode-only.
    pub prefill_failed: bool,
    /// Fill [`Decision::candidates`] and [`Decision::rejected`].
    pub explain: bool,
}

/// Everything one decision depends on, in the struct-of-arrays form the engine and
/// the service keep (see [`Loads`] and [`Hits`]).
#[derive(Clone, Copy, Debug)]
pub struct ViewInput<'a> {
    /// Base routing configuration (the stage configs are derived from it).
    pub cfg: &'a RouterConfig,
    /// The request's routing mode.
    pub mode: Mode,
    pub req: RequestShape,
    pub filters: &'a super::Filters,
    /// Every registered worker's static data.
    pub fleet: &'a Fleet,
    /// Liveness and load of the fleet's workers ([`Loads::new`] of this fleet).
    pub loads: &'a Loads,
    /// This request's overlaps and reuse.
    pub hits: &'a Hits,
    /// The frontend reports that this request's prefill failed: route decode-only.
    pub prefill_failed: bool,
    /// Fill [`Decision::candidates`] and [`Decision::rejected`].
    pub explain: bool,
}

/// Reusable buffers of [`decide_view`]; keep one per thread to avoid allocating.
/// Also the requests routed to each worker by the decisions made with it
/// (`balance_routed_min_ties`): keep one per fleet, or [`Scratch::forget_routed`] when
/// the fleet is laid out anew.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    kernel: KernelScratch,
    /// Stands in for hits made for another fleet.
    base: Hits,
    routed: Routed,
}

impl Scratch {
    /// Forgets the routed counts (call when the [`Fleet`] is rebuilt: its positions
    /// may name other workers now).
    pub fn forget_routed(&mut self) {
        self.routed.clear();
    }
}

/// The parts of an input besides the workers.
struct Common<'a> {
    cfg: &'a RouterConfig,
    mode: Mode,
    req: RequestShape,
    filters: &'a super::Filters,
    prefill_failed: bool,
    explain: bool,
}

/// The workers of a [`ViewInput`], row by row.
struct ViewRows<'a> {
    fleet: &'a Fleet,
    loads: &'a Loads,
    req: &'a Hits,
}

impl Rows for ViewRows<'_> {
    fn len(&self) -> usize {
        self.fleet.len()
    }
    fn fig(&self, i: usize) -> Fig {
        let (Some(&p), Some(&slot)) = (self.fleet.pos.get(i), self.fleet.slot.get(i)) else {
            return Fig::default();
        };
        let p = p as usize;
        let (overlap, reuse_blocks) = self.req.at(p);
        Fig {
            slot,
            live: self.loads.live.get(p).copied().unwrap_or(false),
            suspect: self.loads.suspect.get(p).copied().unwrap_or(false),
            overlap,
            reuse_blocks,
            load: self.loads.load_at(p),
            blocks_unique: self.loads.blocks_unique.get(p).copied().unwrap_or(0.0),
            cpu: self.fleet.cpu_pos.get(p).copied().unwrap_or(false),
            throughput: self.fleet.throughput_pos.get(p).copied().unwrap_or(0.0),
        }
    }
}

const POOL_AGG: u8 = role_bit(Role::Aggregated);
const POOL_PREFILL: u8 = role_bit(Role::Prefill);
const POOL_DECODE: u8 = role_bit(Role::Decode);

/// Builds one stage. `pin` says whether the request's pin applies to this stage.
fn stage<'x>(
    input: &'x Common,
    fleet: &'x Fleet,
    stage: Stage,
    cfg: &'x RouterConfig,
    pool: u8,
    split: u8,
    pin: bool,
) -> StageRun<'x> {
    let f = input.filters;
    let pin = if pin { f.pin.as_deref() } else { None };
    let model = CostModel::new(cfg, &input.req);
    StageRun {
        filter: StageFilter {
            fleet,
            stage,
            model: fleet.model_id(&f.model),
            pool,
            split,
            pin,
            pin_id: pin.map_or(UNKNOWN, |p| fleet.id_of(p)),
            allow: f.allow.as_deref(),
            dp: f.dp,
            tolerations: &f.tolerations,
            tolerated: fleet.tolerations(&f.tolerations),
            domain: None,
            busy: cfg.busy_threshold.map(|t| (t, model)),
        },
        scorer: Scorer {
            model,
            prefer: None,
        },
        // Without a pin on this stage, `direct` has nothing to name: choose by cost.
        mode: match input.mode {
            Mode::Direct if pin.is_none() => Mode::Kv,
            m => m,
        },
        temperature: cfg.router_temperature,
        slack: cfg.balance_slack,
        min_ties: cfg.balance_routed_min_ties,
        affinity_slack: cfg.affinity_slack,
        cuda_to_cpu_ratio: cfg.cuda_to_cpu_ratio,
    }
}

/// The error of a stage that found no candidate, from what its filters saw.
fn stage_error(input: &Common, run: &StageRun, stats: &ScanStats) -> RouteError {
    let f = &run.filter;
    let model = || input.filters.model.clone();
    if stats.in_pool == 0 {
        return if f.split != 0 {
            RouteError::NoWorkers { model: model() }
        } else {
            RouteError::EmptyPool {
                stage: f.stage,
                model: model(),
            }
        };
    }
    if let Some(pin) = f.pin {
        if stats.rejections.get(Rejection::Pin) == stats.in_pool {
            return RouteError::PinNotFound {
                pin: pin.to_owned(),
                stage: f.stage,
                model: model(),
            };
        }
    }
    if stats.rejections.get(Rejection::Busy) > 0 {
        return RouteError::AllBusy { stage: f.stage };
    }
    if let (Some((domain, _)), true) = (f.domain, stats.rejections.get(Rejection::Topology) > 0) {
        return RouteError::NoDecodeInDomain {
            domain: domain.to_owned(),
        };
    }
    RouteError::AllFiltered {
        stage: f.stage,
        rejections: stats.rejections,
    }
}

/// Explain records: scored candidates and filtered-out workers.
#[derive(Default)]
struct Records {
    candidates: Vec<Explain>,
    rejected: Vec<Rejected>,
}

/// Appends the explain records of one stage.
fn explain_stage<R: Rows + ?Sized>(run: &StageRun, rows: &R, d: &mut Records) {
    use super::filter::Eval;
    for i in 0..rows.len() {
        let row = &rows.fig(i);
        match run.filter.eval(i, row) {
            Eval::Pass(_) => {
                let t = run.scorer.terms(i, row);
                d.candidates.push(Explain {
                    worker: row.slot,
                    stage: run.filter.stage,
                    prefill_blocks: t.prefill_blocks,
                    overlap: t.overlap,
                    adjusted_prefill: t.adjusted_prefill,
                    decode_blocks: t.decode_blocks,
                    cost: t.cost,
                });
            }
            Eval::Reject(reason) => d.rejected.push(Rejected {
                worker: row.slot,
                stage: run.filter.stage,
                reason,
            }),
            Eval::Skip | Eval::Split => {}
        }
    }
}

/// A single-stage decision (aggregated fleet or decode-only fallback).
fn single<R: Rows + ?Sized>(
    rows: &R,
    run: &StageRun,
    p: Pick,
    fallback: Fallback,
    records: Records,
) -> Decision {
    let row = &rows.fig(p.index);
    let t = run.scorer.terms(p.index, row);
    Decision {
        decode_worker: row.slot,
        prefill_worker: None,
        dp_rank: p.dp_rank,
        prefill_dp_rank: None,
        overlap: t.overlap,
        cost: t.cost,
        prefill_cost: None,
        fallback,
        local_prefill: None,
        affinity: None,
        candidates: records.candidates,
        rejected: records.rejected,
    }
}

/// Routes one request given as rows. See the module docs for the exact rules.
///
/// `rng` breaks ties and samples (random, softmax); `rr` is the round-robin cursor.
/// Lays the rows out as [`decide_view`] takes them (allocating) and decides like it.
pub fn decide(
    input: &RouteInput,
    rng: &mut impl Rng,
    rr: &mut RrState,
) -> Result<Decision, RouteError> {
    let rows = input.workers;
    let owned;
    let fleet = match input.fleet {
        Some(f) if f.len() == rows.len() => f,
        _ => {
            owned = Fleet::new(rows.iter().map(|r| r.spec));
            &owned
        }
    };
    let mut loads = Loads::new(fleet);
    let mut req = Hits::default();
    req.reset(fleet.len(), Overlap::default());
    for (i, row) in rows.iter().enumerate() {
        let Some(&p) = fleet.pos.get(i) else { continue };
        let p = p as usize;
        loads.set_live_at(p, row.live);
        loads.set_suspect_at(p, row.suspect);
        loads.set_load_at(p, &row.load, row.blocks_unique);
        req.set_overlap_at(p, &row.overlap);
        req.add_reuse_at(p, row.reuse_blocks);
    }
    let mut scratch = KernelScratch::default();
    let mut dense = Dense {
        loads: &loads,
        req: &req,
        routed: &[],
        scratch: &mut scratch,
    };
    let common = Common {
        cfg: input.cfg,
        mode: input.mode,
        req: input.req,
        filters: input.filters,
        prefill_failed: input.prefill_failed,
        explain: input.explain,
    };
    run(&common, fleet, rows, &mut dense, rng, rr)
}

/// The affinity worker `hits` offered the decision, and whether `d` went to it.
fn affinity_use(fleet: &Fleet, hits: &Hits, d: &Decision) -> Option<super::AffinityUse> {
    let row = *fleet.order.get(hits.affinity()?)? as usize;
    let worker = *fleet.slot.get(row)?;
    Some(super::AffinityUse {
        worker,
        source: hits.affinity_source(),
        kept: d.decode_worker == worker || d.prefill_worker == Some(worker),
    })
}

/// Routes one request. See the module docs for the exact rules.
///
/// `rng` breaks ties and samples (random, softmax); `rr` is the round-robin cursor.
/// Allocation-free once `scratch` has grown to the fleet, unless `input.explain` is set
/// or an error is returned. `input.loads` and `input.hits` must be made for
/// `input.fleet` (a mismatch cannot panic, but decides on wrong figures; hits of the
/// wrong length are ignored).
pub fn decide_view(
    input: &ViewInput,
    rng: &mut impl Rng,
    rr: &mut RrState,
    scratch: &mut Scratch,
) -> Result<Decision, RouteError> {
    let fleet = input.fleet;
    let Scratch {
        kernel,
        base,
        routed,
    } = scratch;
    routed.fit(fleet.len());
    routed.follow_liveness(fleet, &input.loads.live);
    let req = if input.hits.len() == fleet.len() {
        input.hits
    } else {
        // Hits begun on another fleet: every worker gets no overlap and no reuse.
        base.reset(fleet.len(), Overlap::default());
        base
    };
    let rows = ViewRows {
        fleet,
        loads: input.loads,
        req,
    };
    let mut dense = Dense {
        loads: input.loads,
        req,
        routed: routed.counts(),
        scratch: kernel,
    };
    let common = Common {
        cfg: input.cfg,
        mode: input.mode,
        req: input.req,
        filters: input.filters,
        prefill_failed: input.prefill_failed,
        explain: input.explain,
    };
    let mut d = run(&common, fleet, &rows, &mut dense, rng, rr)?;
    d.affinity = affinity_use(fleet, req, &d);
    for w in std::iter::once(d.decode_worker).chain(d.prefill_worker) {
        if let Some(p) = fleet.position(w) {
            routed.note(p);
        }
    }
    Ok(d)
}

/// The decision proper, over either form of the workers.
fn run<R: Rows + ?Sized>(
    input: &Common,
    fleet: &Fleet,
    rows: &R,
    dense: &mut Dense,
    rng: &mut impl Rng,
    rr: &mut RrState,
) -> Result<Decision, RouteError> {
    if input.mode == Mode::Direct && input.filters.pin.is_none() {
        return Err(RouteError::DirectNeedsPin);
    }
    let probe = stage(
        input,
        fleet,
        Stage::Aggregated,
        input.cfg,
        POOL_AGG,
        POOL_PREFILL | POOL_DECODE,
        true,
    );
    let mut stats = ScanStats::default();
    let decision = match run_stage(&probe, rows, dense, rng, *rr, &mut stats) {
        Outcome::Picked(p) => {
            let mut records = Records::default();
            if input.explain {
                explain_stage(&probe, rows, &mut records);
            }
            single(rows, &probe, p, Fallback::None, records)
        }
        Outcome::Empty => return Err(stage_error(input, &probe, &stats)),
        Outcome::Split => disaggregated(input, fleet, rows, dense, rng, *rr)?,
    };
    if input.mode == Mode::RoundRobin {
        rr.counter = rr.counter.wrapping_add(1);
    }
    rr.ties = rr.ties.wrapping_add(1);
    Ok(decision)
}

/// Two-stage routing, or the decode-only fallback.
fn disaggregated<R: Rows + ?Sized>(
    input: &Common,
    fleet: &Fleet,
    rows: &R,
    dense: &mut Dense,
    rng: &mut impl Rng,
    counter: RrState,
) -> Result<Decision, RouteError> {
    let pcfg = input.cfg.prefill_stage();
    let dcfg = input.cfg.decode_stage();
    let prun = stage(input, fleet, Stage::Prefill, &pcfg, POOL_PREFILL, 0, false);
    let mut prefill = None;
    let fallback = if input.prefill_failed {
        Fallback::PrefillFailed
    } else {
        let mut stats = ScanStats::default();
        match run_stage(&prun, rows, dense, rng, counter, &mut stats) {
            Outcome::Picked(p) => {
                prefill = Some(p);
                Fallback::None
            }
            Outcome::Empty | Outcome::Split if stats.live() == 0 => Fallback::NoPrefillWorkers,
            Outcome::Empty | Outcome::Split => Fallback::PrefillFilteredOut,
        }
    };
    // Explain records of the prefill stage (it ran unless prefill failed).
    let mut records = Records::default();
    if input.explain && !input.prefill_failed {
        explain_stage(&prun, rows, &mut records);
    }

    let Some(pp) = prefill else {
        // Decode-only: Decode and Aggregated workers, base config, as a single stage.
        let run = stage(
            input,
            fleet,
            Stage::Aggregated,
            input.cfg,
            POOL_AGG | POOL_DECODE,
            0,
            true,
        );
        let mut stats = ScanStats::default();
        let Outcome::Picked(p) = run_stage(&run, rows, dense, rng, counter, &mut stats) else {
            return Err(stage_error(input, &run, &stats));
        };
        if input.explain {
            explain_stage(&run, rows, &mut records);
        }
        return Ok(single(rows, &run, p, fallback, records));
    };

    let prow = &rows.fig(pp.index);
    let pterms = prun.scorer.terms(pp.index, prow);
    let mut drun = stage(input, fleet, Stage::Decode, &dcfg, POOL_DECODE, 0, true);
    let domain_id = fleet.topology.get(pp.index).copied().unwrap_or(UNKNOWN);
    let domain = fleet.topology_name(domain_id);
    if !domain.is_empty() {
        match input.cfg.topology_policy {
            TopologyPolicy::None => {}
            TopologyPolicy::Restrict => drun.filter.domain = Some((domain, domain_id)),
            TopologyPolicy::Prefer => {
                drun.scorer.prefer = Some((&fleet.topology, domain_id, input.cfg.topology_penalty))
            }
        }
    }
    let mut stats = ScanStats::default();
    let Outcome::Picked(dp) = run_stage(&drun, rows, dense, rng, counter, &mut stats) else {
        return Err(stage_error(input, &drun, &stats));
    };
    if input.explain {
        explain_stage(&drun, rows, &mut records);
    }
    let drow = &rows.fig(dp.index);
    let cost = drun.scorer.terms(dp.index, drow).cost;
    if let Some(why) = local_prefill(
        input.cfg,
        input.req.input_tokens,
        &drow.overlap,
        drow.suspect,
    ) {
        // Conditional disaggregation: the decode worker runs the prompt itself.
        let overlap = if drow.suspect {
            Overlap::default()
        } else {
            drow.overlap
        };
        return Ok(Decision {
            decode_worker: drow.slot,
            prefill_worker: None,
            dp_rank: dp.dp_rank,
            prefill_dp_rank: None,
            overlap,
            cost,
            prefill_cost: None,
            fallback: Fallback::None,
            local_prefill: Some(why),
            affinity: None,
            candidates: records.candidates,
            rejected: records.rejected,
        });
    }
    Ok(Decision {
        decode_worker: drow.slot,
        prefill_worker: Some(prow.slot),
        dp_rank: dp.dp_rank,
        prefill_dp_rank: Some(pp.dp_rank),
        overlap: pterms.overlap,
        cost,
        prefill_cost: Some(pterms.cost),
        fallback: Fallback::None,
        local_prefill: None,
        affinity: None,
        candidates: records.candidates,
        rejected: records.rejected,
    })
}
