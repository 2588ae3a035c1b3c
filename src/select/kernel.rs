//! The `kv` selection kernel: one stage's cost for every worker of its pool, computed
//! densely over the [`Loads`] arrays, then argmin with uniform ties (temperature 0) or
//! softmax sampling (temperature > 0), DESIGN §1 "Cost", "Selection".
//!
//! A pool is a contiguous range of fleet positions ([`Fleet::pool_range`]). Its costs
//! go into a buffer in three steps:
//! 1. every worker's cost from the [`Loads`] arrays, the request's overlap and
//!    reuse columns and the per-worker speed factors (`weigh_by_throughput`: the
//!    fleet's all-ones column on an all-GPU fleet, else filled per stage)
//!    ([`super::fill`], four workers per instruction where the CPU has AVX2); a
//!    worker that is not live, busy or (`topology_policy = restrict`) outside the
//!    domain gets +∞;
//! 2. the suspect workers are recomputed with their overlap counted as zero;
//! 3. selection over the buffer: temperature 0 counts the workers within
//!    [`TIE_EPS`] of the minimum (or within `balance_slack` × minimum, when that is
//!    larger) per chunk of 64 and takes the uniformly drawn k-th (with a slack: the
//!    `(turn mod count)`-th, so near ties are taken in turn; and when at least
//!    `balance_routed_min_ties` are tied, the turn among those of them with the
//!    fewest requests routed so far, [`super::routed`]); a smaller (or exact) tie
//!    set first gives the request's affinity worker ([`super::Affinity`]) the
//!    request if its cost is within `affinity_slack` (or `balance_slack`, if
//!    larger) of the minimum;
//!    temperature T > 0 replaces each cost by its weight `exp(-(c - min) / ((max - min)
//!    * T))`, sums per chunk, and takes the worker where the running sum crosses a
//!    uniform draw times the total (p ∝ weight); all costs within `TIE_EPS` → uniform.
//!
//! Guarantees: the cost of every worker is the one [`CostModel::terms`] gives (same
//! operations in the same order; non-finite → `f64::MAX`), so the kernel chooses
//! exactly like the row-by-row path of `pick.rs`; no allocation once the scratch
//! buffers have grown to the fleet size; no panic on any input (ranges are checked
//! against the arrays, `None` when nothing is eligible).

use super::cost::CostModel;
use super::fill::{fill_with, Arrays, Portable};
use super::fleet::Fleet;
use super::hits::Hits;
use super::loads::Loads;
use super::routed;
use super::stage::{exp_neg, tie_bound, KvStage, Topo, TIE_EPS};
use crate::types::Overlap;
use rand::Rng;
use std::ops::Range;

/// Workers per chunk of the selection passes.
const CHUNK: usize = 64;
const INF: f64 = f64::INFINITY;

/// Reusable buffers of the kernel.
#[derive(Clone, Debug, Default)]
pub(crate) struct KernelScratch {
    cost: Vec<f64>,
    chunks: Vec<f64>,
    /// Per-worker cost factors of a fleet with workers of different speeds.
    slow: Vec<f64>,
}

/// Chooses a worker of `st`'s pool; returns its position, `None` if none is eligible.
pub(crate) fn kv_select(
    st: &KvStage,
    fleet: &Fleet,
    loads: &Loads,
    req: &Hits,
    routed: &[f64],
    rng: &mut impl Rng,
    scratch: &mut KernelScratch,
) -> Option<usize> {
    let r = st.range.clone();
    if r.is_empty() || r.end > loads.len() || r.end > fleet.cap_pos.len() || r.end > req.len() {
        return None;
    }
    let n = r.len();
    if scratch.cost.len() < n {
        scratch.cost.resize(n, 0.0);
    }
    let chunks = n.div_ceil(CHUNK);
    if scratch.chunks.len() < chunks {
        scratch.chunks.resize(chunks, 0.0);
    }
    let buf = &mut scratch.cost[..n];
    let sums = &mut scratch.chunks[..chunks];
    let slow = slowness(&st.model, fleet, r.clone(), &mut scratch.slow);
    let a = arrays(st, fleet, loads, req, r.clone(), slow);
    let mut m = fill(st, &a, buf);

    // Step 2: the suspect workers, whose overlap counts as zero, with the same
    // operations as `CostModel::terms` (+ penalty, non-finite → MAX).
    let cm = &st.model;
    let suspect = &loads.suspect[r.clone()];
    let mut raised = false;
    let mut redo = |j: usize, reuse: u32, buf: &mut [f64]| {
        if j >= n || buf[j] == INF || !suspect[j] {
            return; // outside the pool, or excluded by a filter
        }
        let o = Overlap::default();
        let prefill = (a.q[j] + cm.input_tokens) * cm.inv_block_size;
        let adj = (prefill - cm.credit(&o)).max(0.0);
        let decode = if cm.track_active_blocks {
            (a.held[j] + a.ob[j]) + f64::from(cm.added(reuse, o.device))
        } else {
            0.0
        };
        let s = a.slow.get(j).copied().unwrap_or(1.0);
        let c = (cm.scale * adj + decode) * s + penalty(st.topo, a.topo[j]);
        let c = if c.is_finite() { c } else { f64::MAX };
        raised |= c > buf[j];
        buf[j] = c;
        m = m.min(c);
    };
    for &p in &loads.suspects {
        let reuse = req.at(p as usize).1;
        redo((p as usize).wrapping_sub(r.start), reuse, buf);
    }
    if raised {
        m = min_of(buf);
    }
    if m == INF {
        return None;
    }
    let tie = Tie {
        slack: st.slack,
        turn: st.turn,
        min_ties: st.min_ties,
        routed: routed.get(r.clone()).unwrap_or_default(),
        affinity: st.affinity.filter(|p| r.contains(p)).map(|p| p - r.start),
        affinity_slack: st.affinity_slack,
    };
    let j = choose(buf, sums, m, st.temperature, &tie, rng);
    j.map(|j| r.start + j)
}

/// How step 3 at temperature 0 breaks near ties (see the module docs).
struct Tie<'a> {
    slack: f64,
    turn: u64,
    min_ties: u32,
    /// Requests routed so far, by pool position (missing: 0).
    routed: &'a [f64],
    /// Pool position of the request's affinity worker, and `affinity_slack`.
    affinity: Option<usize>,
    affinity_slack: f64,
}

/// Step 3 over `buf` whose minimum is `m` (finite): the position chosen.
fn choose(
    buf: &mut [f64],
    sums: &mut [f64],
    m: f64,
    temperature: f64,
    tie: &Tie,
    rng: &mut impl Rng,
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if super::avx2::available() {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { choose_avx2(buf, sums, m, temperature, tie, rng) };
    }
    choose_portable(buf, sums, m, temperature, tie, rng)
}

/// [`choose_portable`] compiled for AVX2: its loops (minimum and maximum, counting,
/// the branch-free `exp`) vectorise four lanes wide. Same operations, same results.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn choose_avx2(
    buf: &mut [f64],
    sums: &mut [f64],
    m: f64,
    temperature: f64,
    tie: &Tie,
    rng: &mut impl Rng,
) -> Option<usize> {
    choose_portable(buf, sums, m, temperature, tie, rng)
}

#[inline(always)]
fn choose_portable(
    buf: &mut [f64],
    sums: &mut [f64],
    m: f64,
    temperature: f64,
    tie: &Tie,
    rng: &mut impl Rng,
) -> Option<usize> {
    let Tie { slack, turn, .. } = *tie;
    if temperature > 0.0 {
        softmax(buf, sums, temperature, rng)
    } else {
        let thr = tie_bound(m, slack);
        let count = count_chunks(buf, sums, |c| c <= thr);
        if slack > 0.0 && routed::by_count(u64::from(count), tie.min_ties) {
            let r = tie.routed;
            let tied = |j: usize| buf[j] <= thr;
            let used = |j: usize| r.get(j).copied().unwrap_or(0.0);
            return routed::fewest_routed(buf.len(), tied, used, turn);
        }
        let wide = tie_bound(m, slack.max(tie.affinity_slack));
        if let Some(j) = tie
            .affinity
            .filter(|&j| buf.get(j).is_some_and(|&c| c <= wide))
        {
            return Some(j);
        }
        let k = if slack > 0.0 && count > 0 {
            (turn % u64::from(count)) as u32
        } else if count > 1 {
            rng.random_range(0..count)
        } else {
            0
        };
        nth(buf, sums, k, |c| c <= thr)
    }
}

/// Topology penalty of a worker in domain `topo` (0 when not applicable).
#[inline(always)]
fn penalty(t: Topo, topo: u32) -> f64 {
    match t {
        Topo::Prefer(d, pen) if topo != d => pen,
        _ => 0.0,
    }
}

/// The cost factors of the workers of pool `r`: the fleet's ones when every worker
/// runs at GPU speed (or speeds are not weighed), else `buf` filled with
/// [`CostModel::slowness`] (grown to the pool once, then reused).
fn slowness<'a>(
    cm: &CostModel,
    fleet: &'a Fleet,
    r: Range<usize>,
    buf: &'a mut Vec<f64>,
) -> &'a [f64] {
    if fleet.uniform_speed || !cm.weigh {
        return fleet.ones.get(r).unwrap_or_default();
    }
    let (Some(cpu), Some(tput)) = (fleet.cpu_pos.get(r.clone()), fleet.throughput_pos.get(r))
    else {
        return &[];
    };
    buf.clear();
    buf.extend(cpu.iter().zip(tput).map(|(&c, &t)| cm.slowness(c, t)));
    buf
}

/// The per-worker inputs of the pool `r` under the configuration of `st`.
fn arrays<'a>(
    st: &KvStage,
    fleet: &'a Fleet,
    loads: &'a Loads,
    req: &'a Hits,
    r: Range<usize>,
    slow: &'a [f64],
) -> Arrays<'a> {
    let cm = &st.model;
    let z = &loads.zeros[r.clone()];
    let q = if cm.track_prefill_tokens {
        &loads.prefill_tokens[r.clone()]
    } else {
        z
    };
    let held = if cm.assume_kv_reuse {
        &loads.blocks_unique[r.clone()]
    } else {
        &loads.blocks_total[r.clone()]
    };
    let ob = if cm.track_output_blocks {
        &loads.output_blocks[r.clone()]
    } else {
        z
    };
    Arrays {
        q,
        held,
        ob,
        gate: &loads.gate[r.clone()],
        cap: &fleet.cap_pos[r.clone()],
        topo: &fleet.topology_pos[r.clone()],
        slow,
        cols: req.columns().slice(r),
    }
}

/// Minimum of `buf`.
fn min_of(buf: &[f64]) -> f64 {
    let mut m = [INF; 4];
    let mut it = buf.chunks_exact(4);
    for c in &mut it {
        for j in 0..4 {
            m[j] = if c[j] < m[j] { c[j] } else { m[j] };
        }
    }
    for &c in it.remainder() {
        m[0] = if c < m[0] { c } else { m[0] };
    }
    m[0].min(m[1]).min(m[2].min(m[3]))
}

/// Counts the entries satisfying `pred`, per chunk into `sums` and in total.
#[inline(always)]
fn count_chunks(buf: &[f64], sums: &mut [f64], pred: impl Fn(f64) -> bool) -> u32 {
    let mut total = 0u32;
    for (chunk, s) in buf.chunks(CHUNK).zip(sums.iter_mut()) {
        let c = chunk.iter().fold(0u32, |a, &x| a + u32::from(pred(x)));
        *s = f64::from(c);
        total += c;
    }
    total
}

/// Index of the `k`-th (0-based) entry satisfying `pred`, using the per-chunk counts.
#[inline(always)]
fn nth(buf: &[f64], sums: &[f64], mut k: u32, pred: impl Fn(f64) -> bool) -> Option<usize> {
    for (ci, &s) in sums.iter().enumerate() {
        let c = s as u32;
        if k < c {
            let start = ci * CHUNK;
            let chunk = buf.get(start..(start + CHUNK).min(buf.len()))?;
            return chunk
                .iter()
                .enumerate()
                .filter(|&(_, &x)| pred(x))
                .nth(k as usize)
                .map(|(j, _)| start + j);
        }
        k -= c;
    }
    None
}

/// Step 3 at temperature `t > 0`. `buf` holds the costs (+∞: not eligible), at least
/// one finite.
#[inline(always)]
fn softmax(buf: &mut [f64], sums: &mut [f64], t: f64, rng: &mut impl Rng) -> Option<usize> {
    let (mut lo, mut hi) = ([INF; 4], [-INF; 4]);
    let mut it = buf.chunks_exact(4);
    for c in &mut it {
        for j in 0..4 {
            lo[j] = if c[j] < lo[j] { c[j] } else { lo[j] };
            let v = if c[j] < INF { c[j] } else { -INF };
            hi[j] = if v > hi[j] { v } else { hi[j] };
        }
    }
    for &c in it.remainder() {
        lo[0] = if c < lo[0] { c } else { lo[0] };
        let v = if c < INF { c } else { -INF };
        hi[0] = if v > hi[0] { v } else { hi[0] };
    }
    let lo = lo[0].min(lo[1]).min(lo[2].min(lo[3]));
    let hi = hi[0].max(hi[1]).max(hi[2].max(hi[3]));
    let range = hi - lo;
    if range <= TIE_EPS {
        // All costs equal: uniform over the eligible workers.
        let count = count_chunks(buf, sums, |c| c < INF);
        if count == 0 {
            return None;
        }
        let k = rng.random_range(0..count);
        return nth(buf, sums, k, |c| c < INF);
    }
    // w = exp(-x / T) with x = (c - lo) / range, i.e. exp(-(c - lo) * scale).
    let scale = 1.0 / (range * t);
    if let Some(j) = reject(buf, lo, scale, rng) {
        return Some(j);
    }
    let mut total = 0.0;
    let avx2 = avx2_available();
    for (chunk, s) in buf.chunks_mut(CHUNK).zip(sums.iter_mut()) {
        let whole = chunk.len() & !3;
        let (four, rest) = chunk.split_at_mut(whole);
        let mut acc = weigh(four, lo, scale, avx2);
        for c in rest {
            let w = exp_neg(-(*c - lo) * scale);
            *c = w;
            acc[0] += w;
        }
        *s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        total += *s;
    }
    let u = rng.random::<f64>() * total;
    let mut acc = 0.0;
    let mut last = None;
    for (ci, &s) in sums.iter().enumerate() {
        if s > 0.0 {
            let start = ci * CHUNK;
            let chunk = buf.get(start..(start + CHUNK).min(buf.len()))?;
            if acc + s > u {
                let mut a = acc;
                for (j, &w) in chunk.iter().enumerate() {
                    a += w;
                    if w > 0.0 {
                        last = Some(start + j);
                        if a > u {
                            return last;
                        }
                    }
                }
                // Rounding between the lane sums and this running sum: the chunk's
                // last weighted worker.
                return last;
            }
            last = chunk.iter().rposition(|&w| w > 0.0).map(|j| start + j);
        }
        acc += s;
    }
    last
}

/// Pools from this size on try [`reject`] before weighing every worker.
const REJECT_MIN: usize = 256;

/// Proposals [`reject`] makes before giving up.
const REJECT_TRIES: usize = 32;

/// Softmax sampling by rejection, for large pools: propose a uniformly drawn position,
/// accept it with its weight `exp(-(c - lo) * scale)` (at most 1, exactly 1 for the
/// cheapest worker; 0 for an ineligible one). Each proposal returns worker `j` with
/// probability `w_j / n`, so an accepted proposal follows the softmax exactly, and when
/// every proposal fails the caller's full pass (exact too) decides: the mixture is
/// the softmax distribution either way.
///
/// Why: the full pass costs one `exp` per worker (~2 ns each, 20 µs at 10,000
/// workers), while the weights of a normalised softmax are at least `e^(-1/T)` (0.14
/// at `T = 0.5`), so a few proposals usually suffice. A low temperature or a mostly
/// filtered pool exhausts the [`REJECT_TRIES`] proposals (≲ 0.5 µs) and falls back.
#[inline(always)]
fn reject(buf: &[f64], lo: f64, scale: f64, rng: &mut impl Rng) -> Option<usize> {
    if buf.len() < REJECT_MIN {
        return None;
    }
    for _ in 0..REJECT_TRIES {
        let j = rng.random_range(0..buf.len());
        let c = *buf.get(j)?;
        if c < INF {
            let w = exp_neg(-(c - lo) * scale);
            if rng.random::<f64>() < w {
                return Some(j);
            }
        }
    }
    None
}

/// Step 1 ([`super::fill`]) for the configuration of `st` with the implementation
/// this CPU runs fastest: AVX2 where it has it, else the portable one. Returns the
/// minimum (+∞ when nothing is eligible or the arrays are short).
fn fill(st: &KvStage, a: &Arrays, out: &mut [f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if super::avx2::available() {
        return fill_with::<super::avx2::Avx2>(st, a, out);
    }
    fill_with::<Portable>(st, a, out)
}

/// Whether the CPU has AVX2 (always false off x86-64): checked once per softmax, not
/// once per chunk.
#[inline(always)]
fn avx2_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::avx2::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Replaces each cost `c` of `four` (a multiple of four long) by its weight
/// `exp_neg(-(c - lo) * scale)`; returns the sums of lanes `i % 4`. `avx2`: the result
/// of [`avx2_available`].
#[inline(always)]
fn weigh(four: &mut [f64], lo: f64, scale: f64, avx2: bool) -> [f64; 4] {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` comes from `avx2_available`: the CPU has AVX2.
        return unsafe { super::avx2::weigh(four, lo, scale) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx2;
    let mut acc = [0.0f64; 4];
    for c in four.chunks_exact_mut(4) {
        for j in 0..4 {
            let w = exp_neg(-(c[j] - lo) * scale);
            c[j] = w;
            acc[j] += w;
        }
    }
    acc
}
