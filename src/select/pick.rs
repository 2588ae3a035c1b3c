//! Per-mode selection over the candidates of one stage (DESIGN §1 "Selection").
//!
//! `kv` stages whose filters the dense kernel covers (no pin, allow-list or dp bounds,
//! no untolerated taint in the fleet) run `kernel.rs`; everything else, and the
//! statistics of a stage that found no candidate, runs here row by row.
//!
//! Every row-by-row algorithm streams over the worker rows (one or two passes, re-filtering on the
//! second pass instead of collecting candidates), so selection allocates nothing:
//! - `kv`, temperature 0: argmin of cost; ties (|Δ| < [`TIE_EPS`]) are broken
//!   uniformly at random by reservoir sampling (the k-th tied worker replaces the
//!   current pick with probability 1/k). With `balance_slack` s > 0: pass 1 finds the
//!   minimum m, pass 2 counts the workers with cost ≤ m + max(TIE_EPS, s·m), pass 3
//!   takes the `(RrState::ties mod count)`-th of them, as the kernel does; when at
//!   least `balance_routed_min_ties` are tied, pass 3 takes that turn among the tied
//!   workers with the fewest requests routed so far ([`super::routed`]).
//! - `kv`, temperature T > 0: pass 1 finds min and max cost; pass 2 samples with
//!   p ∝ exp(-x / T), x = (cost - min) / (max - min), by weighted reservoir sampling
//!   (keep worker i with probability w_i / Σ_{j≤i} w_j). All costs equal → uniform.
//! - `random`: count, then the uniformly drawn k-th eligible worker.
//! - `round-robin`: the `(counter mod count)`-th eligible worker.
//! - `direct`: the (only) eligible worker; the pin filter has already done the work.
//! - `least-loaded`: fewest active requests, ties uniformly at random.
//! - `device-aware-weighted`: CPU vs non-CPU groups, less normalised load wins (tie →
//!   GPU), then least-loaded inside the group.

use super::cost::Scorer;
use super::filter::{Eval, RejectionCounts, ScanStats, StageFilter};
use super::hits::Hits;
use super::kernel::{kv_select, KernelScratch};
use super::loads::Loads;
use super::routed;
use super::stage::{tie_bound, KvStage, Topo, TIE_EPS};
use super::{Fig, Rows};
use crate::config::Mode;
use crate::types::DeviceClass;
use rand::Rng;

/// The worker chosen by one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pick {
    /// Index into the rows slice.
    pub index: usize,
    pub dp_rank: u32,
}

/// Result of running one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Picked(Pick),
    /// No eligible worker; the stats say why.
    Empty,
    /// The aggregated probe met a Prefill/Decode worker of the model.
    Split,
}

/// One stage ready to run: its filters, its scorer and the selection mode.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StageRun<'a> {
    pub filter: StageFilter<'a>,
    pub scorer: Scorer<'a>,
    pub mode: Mode,
    /// Softmax temperature (0 = argmin).
    pub temperature: f64,
    /// `balance_slack`: relative tie tolerance of the argmin.
    pub slack: f64,
    /// `balance_routed_min_ties`: tie sets from this size on go by routed counts.
    pub min_ties: u32,
    /// `affinity_slack`: the request's affinity worker wins within this fraction of
    /// the minimum ([`super::Affinity`]).
    pub affinity_slack: f64,
    /// Throughput of a non-CPU worker relative to a CPU one (`device-aware-weighted`).
    pub cuda_to_cpu_ratio: f64,
}

/// The dense per-position inputs of the `kv` kernel for one decision.
pub(crate) struct Dense<'a> {
    pub loads: &'a Loads,
    pub req: &'a Hits,
    /// Requests routed so far by fleet position ([`super::routed::Routed`]; empty:
    /// all 0).
    pub routed: &'a [f64],
    pub scratch: &'a mut KernelScratch,
}

/// First pass: filters every row, fills `stats`, feeds eligible rows to `f`.
/// Returns `false` (and stops) on a split.
#[inline(always)]
fn survey<R: Rows + ?Sized>(
    filter: &StageFilter,
    rows: &R,
    stats: &mut ScanStats,
    mut f: impl FnMut(usize, &Fig, u32),
) -> bool {
    // Counted in locals so they stay in registers inside the loop.
    let (mut in_pool, mut eligible) = (0u32, 0u32);
    let mut rejections = RejectionCounts::default();
    let mut split = false;
    for i in 0..rows.len() {
        let row = &rows.fig(i);
        match filter.eval(i, row) {
            Eval::Skip => {}
            Eval::Split => {
                split = true;
                break;
            }
            Eval::Reject(r) => {
                in_pool += 1;
                rejections.add(r);
            }
            Eval::Pass(dp) => {
                in_pool += 1;
                eligible += 1;
                f(i, row, dp);
            }
        }
    }
    *stats = ScanStats {
        in_pool,
        eligible,
        rejections,
    };
    !split
}

/// Later passes: feeds eligible rows to `f` until it returns `true`.
#[inline(always)]
fn each_eligible<R: Rows + ?Sized>(
    filter: &StageFilter,
    rows: &R,
    mut f: impl FnMut(usize, &Fig, u32) -> bool,
) {
    for i in 0..rows.len() {
        let row = &rows.fig(i);
        if let Eval::Pass(dp) = filter.eval(i, row) {
            if f(i, row, dp) {
                return;
            }
        }
    }
}

/// The `k`-th (0-based) eligible row.
fn nth_eligible<R: Rows + ?Sized>(filter: &StageFilter, rows: &R, k: u32) -> Option<Pick> {
    nth_eligible_where(filter, rows, u64::from(k), |_, _| true)
}

/// The `k`-th (0-based) eligible row among those `keep` accepts.
fn nth_eligible_where<R: Rows + ?Sized>(
    filter: &StageFilter,
    rows: &R,
    k: u64,
    mut keep: impl FnMut(usize, &Fig) -> bool,
) -> Option<Pick> {
    let mut seen = 0u64;
    let mut out = None;
    each_eligible(filter, rows, |index, row, dp_rank| {
        if !keep(index, row) {
            return false;
        }
        if seen == k {
            out = Some(Pick { index, dp_rank });
            return true;
        }
        seen += 1;
        false
    });
    out
}

/// Reservoir state for "minimum, ties uniformly at random".
struct MinTies<T> {
    best: Option<(T, Pick)>,
    ties: u32,
}

impl<T: Copy> MinTies<T> {
    fn new() -> Self {
        MinTies {
            best: None,
            ties: 0,
        }
    }

    /// Offers a candidate; `cmp(v, best)` says Less / Tie / Greater.
    #[inline(always)]
    fn offer(
        &mut self,
        v: T,
        pick: Pick,
        rng: &mut impl Rng,
        cmp: impl Fn(T, T) -> std::cmp::Ordering,
    ) {
        use std::cmp::Ordering::*;
        match self.best {
            None => {
                self.best = Some((v, pick));
                self.ties = 1;
            }
            Some((b, _)) => match cmp(v, b) {
                Less => {
                    self.best = Some((v, pick));
                    self.ties = 1;
                }
                Equal => {
                    self.ties += 1;
                    if rng.random_range(0..self.ties) == 0 {
                        self.best = Some((v, pick));
                    }
                }
                Greater => {}
            },
        }
    }
}

fn cost_cmp(a: f64, b: f64) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    if a < b - TIE_EPS {
        Less
    } else if a <= b + TIE_EPS {
        Equal
    } else {
        Greater
    }
}

/// The request's affinity worker ([`Hits::affinity`]), if it is eligible in this stage
/// and its cost is within `affinity_slack` (or `balance_slack`, if larger) of the
/// minimum `lo` — the rule the kernel applies (`kernel.rs`, step 3) unless the
/// near-tie set is large enough for the routed counts, which then decide.
fn affinity_pick<R: Rows + ?Sized>(run: &StageRun, rows: &R, req: &Hits, lo: f64) -> Option<Pick> {
    let f = &run.filter;
    let index = *f.fleet.order.get(req.affinity()?)? as usize;
    let row = &rows.fig(index);
    let Eval::Pass(dp_rank) = f.eval(index, row) else {
        return None;
    };
    let thr = tie_bound(lo, run.slack.max(run.affinity_slack));
    (run.scorer.cost(index, row) <= thr).then_some(Pick { index, dp_rank })
}

/// The kernel form of a `kv` stage, if the kernel covers its filters.
fn kv_stage(run: &StageRun) -> Option<KvStage> {
    let f = &run.filter;
    let fleet = f.fleet;
    if run.mode != Mode::Kv
        || f.pin.is_some()
        || f.allow.is_some()
        || f.dp.is_some()
        || fleet.all_taints & !f.tolerated != 0
    {
        return None;
    }
    let topo = match (f.domain, run.scorer.prefer) {
        (None, None) => Topo::None,
        (Some((_, d)), None) => Topo::Restrict(d),
        (None, Some((_, d, pen))) => Topo::Prefer(d, pen),
        (Some(_), Some(_)) => return None,
    };
    Some(KvStage {
        model: run.scorer.model,
        range: fleet.pool_range(f.model, f.pool)?,
        busy: f.busy.map(|(t, _)| t),
        topo,
        temperature: run.temperature,
        slack: run.slack,
        turn: 0,
        min_ties: run.min_ties,
        affinity: None,
        affinity_slack: run.affinity_slack,
    })
}

/// Runs one stage: selects a worker per `run.mode`, recording filter stats (only
/// when no worker is picked, for a `kv` stage the kernel ran).
pub(crate) fn run_stage<R: Rows + ?Sized>(
    run: &StageRun,
    rows: &R,
    dense: &mut Dense,
    rng: &mut impl Rng,
    rr: super::RrState,
    stats: &mut ScanStats,
) -> Outcome {
    let rr_counter = rr.counter;
    let filter = &run.filter;
    if let Some(mut st) = kv_stage(run) {
        st.turn = rr.ties;
        st.affinity = dense.req.affinity();
        let fleet = filter.fleet;
        if filter.split != 0 && fleet.is_split(filter.model) {
            return Outcome::Split;
        }
        let (loads, req, routed) = (dense.loads, dense.req, dense.routed);
        let picked = kv_select(&st, fleet, loads, req, routed, rng, dense.scratch);
        if let Some(row) = picked.and_then(|p| fleet.order.get(p)) {
            let index = *row as usize;
            return Outcome::Picked(Pick {
                index,
                dp_rank: fleet.dp_lo.get(index).copied().unwrap_or(0),
            });
        }
        // Nothing eligible: the row-by-row pass below finds that out again, with the
        // statistics the error needs.
    }
    let picked = match run.mode {
        Mode::Kv if run.temperature > 0.0 => {
            return softmax(run, rows, rng, stats);
        }
        Mode::Kv if run.slack > 0.0 => {
            // Pass 1: the minimum; pass 2: a uniform pick among the costs tied with it.
            let mut lo = f64::INFINITY;
            let ok = survey(filter, rows, stats, |index, row, _| {
                lo = lo.min(run.scorer.cost(index, row));
            });
            if !ok {
                return Outcome::Split;
            }
            // Pass 2 counts the workers tied with it, pass 3 takes the `ties`-th in
            // turn (as the kernel does).
            let thr = tie_bound(lo, run.slack);
            let mut count = 0u64;
            each_eligible(filter, rows, |index, row, _| {
                count += u64::from(run.scorer.cost(index, row) <= thr);
                false
            });
            if routed::by_count(count, run.min_ties) {
                let pos = &filter.fleet.pos;
                let used = |i: usize| {
                    let p = pos.get(i).map_or(usize::MAX, |&p| p as usize);
                    dense.routed.get(p).copied().unwrap_or(0.0)
                };
                let tied = |i: usize| {
                    let row = &rows.fig(i);
                    matches!(filter.eval(i, row), Eval::Pass(_)) && run.scorer.cost(i, row) <= thr
                };
                routed::fewest_routed(rows.len(), tied, used, rr.ties).and_then(
                    |index| match filter.eval(index, &rows.fig(index)) {
                        Eval::Pass(dp_rank) => Some(Pick { index, dp_rank }),
                        _ => None,
                    },
                )
            } else if let Some(p) = affinity_pick(run, rows, dense.req, lo) {
                Some(p)
            } else {
                let k = if count > 0 { rr.ties % count } else { 0 };
                nth_eligible_where(filter, rows, k, |index, row| {
                    run.scorer.cost(index, row) <= thr
                })
            }
        }
        Mode::Kv => {
            let mut m = MinTies::new();
            let ok = survey(filter, rows, stats, |index, row, dp_rank| {
                let c = run.scorer.cost(index, row);
                m.offer(c, Pick { index, dp_rank }, rng, cost_cmp);
            });
            if !ok {
                return Outcome::Split;
            }
            match m.best {
                Some((lo, p)) => affinity_pick(run, rows, dense.req, lo).or(Some(p)),
                None => None,
            }
        }
        Mode::LeastLoaded => {
            let mut m = MinTies::new();
            let ok = survey(filter, rows, stats, |index, row, dp_rank| {
                let a = row.load.active_requests;
                m.offer(a, Pick { index, dp_rank }, rng, |x, y| x.cmp(&y));
            });
            if !ok {
                return Outcome::Split;
            }
            m.best.map(|(_, p)| p)
        }
        Mode::Direct => {
            let mut first = None;
            let ok = survey(filter, rows, stats, |index, _, dp_rank| {
                first.get_or_insert(Pick { index, dp_rank });
            });
            if !ok {
                return Outcome::Split;
            }
            first
        }
        Mode::Random | Mode::RoundRobin => {
            if !survey(filter, rows, stats, |_, _, _| {}) {
                return Outcome::Split;
            }
            let n = stats.eligible;
            if n == 0 {
                None
            } else {
                let k = if run.mode == Mode::Random {
                    rng.random_range(0..n)
                } else {
                    (rr_counter % u64::from(n)) as u32
                };
                nth_eligible(filter, rows, k)
            }
        }
        Mode::DeviceAwareWeighted => {
            return device_aware(run, rows, rng, stats);
        }
    };
    picked.map_or(Outcome::Empty, Outcome::Picked)
}

/// `kv` with temperature > 0: softmax over normalised cost logits.
fn softmax<R: Rows + ?Sized>(
    run: &StageRun,
    rows: &R,
    rng: &mut impl Rng,
    stats: &mut ScanStats,
) -> Outcome {
    let filter = &run.filter;
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut first = None;
    let ok = survey(filter, rows, stats, |index, row, dp_rank| {
        let c = run.scorer.cost(index, row);
        lo = lo.min(c);
        hi = hi.max(c);
        first.get_or_insert(Pick { index, dp_rank });
    });
    if !ok {
        return Outcome::Split;
    }
    let Some(first) = first else {
        return Outcome::Empty;
    };
    let range = hi - lo;
    if range <= TIE_EPS {
        // All costs equal: uniform.
        let k = rng.random_range(0..stats.eligible);
        return nth_eligible(filter, rows, k).map_or(Outcome::Picked(first), Outcome::Picked);
    }
    // w = exp(-x / T) with x = (c - lo) / range, i.e. exp(-(c - lo) * scale).
    let scale = 1.0 / (range * run.temperature);
    let mut total = 0.0f64;
    let mut chosen = first;
    each_eligible(filter, rows, |index, row, dp_rank| {
        let w = exp_neg(-(run.scorer.cost(index, row) - lo) * scale);
        total += w;
        if total > 0.0 && rng.random::<f64>() * total < w {
            chosen = Pick { index, dp_rank };
        }
        false
    });
    Outcome::Picked(chosen)
}

/// `device-aware-weighted`: the CPU or non-CPU group with the lower
/// `Σ active / (count * weight)` (weight 1 for CPU, `cuda_to_cpu_ratio` otherwise;
/// tie → non-CPU), then least-loaded inside it.
fn device_aware<R: Rows + ?Sized>(
    run: &StageRun,
    rows: &R,
    rng: &mut impl Rng,
    stats: &mut ScanStats,
) -> Outcome {
    let filter = &run.filter;
    // [gpu, cpu]: (Σ active requests, count)
    let mut groups = [(0u64, 0u32); 2];
    let cpu = &filter.fleet.cpu;
    let ok = survey(filter, rows, stats, |i, row, _| {
        let g = &mut groups[usize::from(cpu[i])];
        g.0 += u64::from(row.load.active_requests);
        g.1 += 1;
    });
    if !ok {
        return Outcome::Split;
    }
    let class = match (groups[0].1, groups[1].1) {
        (0, 0) => return Outcome::Empty,
        (_, 0) => DeviceClass::Gpu,
        (0, _) => DeviceClass::Cpu,
        (g, c) => {
            let gpu = normalized_load(groups[0].0, g, run.cuda_to_cpu_ratio);
            let cpu = normalized_load(groups[1].0, c, 1.0);
            if cpu < gpu - TIE_EPS {
                DeviceClass::Cpu
            } else {
                DeviceClass::Gpu
            }
        }
    };
    let mut m = MinTies::new();
    each_eligible(filter, rows, |index, row, dp_rank| {
        if cpu[index] == (class == DeviceClass::Cpu) {
            let a = row.load.active_requests;
            m.offer(a, Pick { index, dp_rank }, rng, |x, y| x.cmp(&y));
        }
        false
    });
    m.best.map_or(Outcome::Empty, |(_, p)| Outcome::Picked(p))
}

/// The kernel's branch-free `e^y` for `y <= 0`.
pub(crate) use super::stage::exp_neg;

/// Normalised load of a device group: in-flight requests per unit of throughput.
pub(crate) fn normalized_load(active_sum: u64, count: u32, weight: f64) -> f64 {
    active_sum as f64 / (f64::from(count) * weight)
}
