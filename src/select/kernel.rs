//! The `kv` selection kernel: one stage's cost for every worker of its pool, computed
//! densely over the [`Loads`] arrays, then argmin with uniform ties (temperature 0) or
//! softmax sampling (temperature > 0), DESIGN §1 "Cost", "Selection".
//!
//! A pool is a contiguous range of fleet positions ([`Fleet::pool_range`]). Its costs
//! go into a buffer in three steps:
//! 1. every worker as if it had only the request's base overlap (the shared-cache run
//!    from position 0) and no reuse: a few multiply-adds over contiguous `f64`s, in
//!    lanes of four so the compiler vectorises it; a worker that is not live, busy or
//!    (`topology_policy = restrict`) outside the domain gets +∞;
//! 2. the request's hits (workers with an overlap or reuse of their own) and the suspect
//!    workers are recomputed with the full formula ([`CostModel::terms`]);
//! 3. selection over the buffer: temperature 0 counts the workers within
//!    [`TIE_EPS`] of the minimum per chunk of 64 and takes the uniformly drawn k-th;
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
use super::fleet::Fleet;
use super::loads::{Loads, ReqFigs};
use super::pick::TIE_EPS;
use crate::types::Overlap;
use rand::Rng;
use std::ops::Range;

/// Workers per chunk of the selection passes.
const CHUNK: usize = 64;
const INF: f64 = f64::INFINITY;

/// Topology rule of the decode stage relative to the prefill worker's domain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Topo {
    None,
    /// Only workers of this domain are eligible.
    Restrict(u32),
    /// Workers outside this domain pay the penalty.
    Prefer(u32, f64),
}

/// One `kv` stage ready for the kernel.
#[derive(Clone, Debug)]
pub(crate) struct KvStage {
    pub model: CostModel,
    /// Positions of the pool.
    pub range: Range<usize>,
    /// `busy_threshold`.
    pub busy: Option<f64>,
    pub topo: Topo,
    pub temperature: f64,
}

/// Reusable buffers of the kernel.
#[derive(Clone, Debug, Default)]
pub(crate) struct KernelScratch {
    cost: Vec<f64>,
    chunks: Vec<f64>,
}

/// Everything of the dense cost that does not depend on the worker.
#[derive(Clone, Copy)]
struct Consts {
    input: f64,
    inv_bs: f64,
    /// Credit weights of the device, host, disk and shared overlaps.
    w: [f64; 4],
    scale: f64,
    prompt_blocks: f64,
    busy: f64,
}

/// Chooses a worker of `st`'s pool; returns its position, `None` if none is eligible.
pub(crate) fn kv_select(
    st: &KvStage,
    fleet: &Fleet,
    loads: &Loads,
    req: &ReqFigs,
    rng: &mut impl Rng,
    scratch: &mut KernelScratch,
) -> Option<usize> {
    let r = st.range.clone();
    if r.is_empty() || r.end > loads.len() || r.end > fleet.cap_pos.len() || r.end > req.reuse.len()
    {
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
    let a = arrays(st, fleet, loads, req, r.clone());
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
        let c = cm.scale * adj + decode + penalty(st.topo, a.topo[j]);
        let c = if c.is_finite() { c } else { f64::MAX };
        raised |= c > buf[j];
        buf[j] = c;
        m = m.min(c);
    };
    for &p in &loads.suspects {
        let reuse = req.reuse.get(p as usize).copied().unwrap_or(0);
        redo((p as usize).wrapping_sub(r.start), reuse, buf);
    }
    if raised {
        m = min_of(buf);
    }
    if m == INF {
        return None;
    }
    let j = if st.temperature > 0.0 {
        softmax(buf, sums, st.temperature, rng)
    } else {
        let thr = m + TIE_EPS;
        let count = count_chunks(buf, sums, |c| c <= thr);
        let k = if count > 1 {
            rng.random_range(0..count)
        } else {
            0
        };
        nth(buf, sums, k, |c| c <= thr)
    };
    j.map(|j| r.start + j)
}

/// Topology penalty of a worker in domain `topo` (0 when not applicable).
#[inline(always)]
fn penalty(t: Topo, topo: u32) -> f64 {
    match t {
        Topo::Prefer(d, pen) if topo != d => pen,
        _ => 0.0,
    }
}

/// The per-worker inputs of the pool `r` under the configuration of `st`.
fn arrays<'a>(
    st: &KvStage,
    fleet: &'a Fleet,
    loads: &'a Loads,
    req: &'a ReqFigs,
    r: Range<usize>,
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
        dev: &req.dev[r.clone()],
        host: &req.host[r.clone()],
        disk: &req.disk[r.clone()],
        shared: &req.shared[r.clone()],
        reuse: &req.reuse[r],
    }
}

/// Step 1 for the configuration of `st`; returns the minimum.
fn fill(st: &KvStage, a: &Arrays, out: &mut [f64]) -> f64 {
    let cm = &st.model;
    let k = Consts {
        input: cm.input_tokens,
        inv_bs: cm.inv_block_size,
        w: cm.weights(),
        scale: cm.scale,
        prompt_blocks: f64::from(cm.prompt_blocks),
        busy: st.busy.unwrap_or(0.0),
    };
    let busy = st.busy.is_some();
    match (cm.track_active_blocks, cm.assume_kv_reuse) {
        (true, true) => fill_topo::<true, true>(st.topo, busy, a, k, out),
        (true, false) => fill_topo::<true, false>(st.topo, busy, a, k, out),
        (false, _) => fill_topo::<false, false>(st.topo, busy, a, k, out),
    }
}

/// [`fill_loop`] for the topology rule and busy check.
#[inline(always)]
fn fill_topo<const T: bool, const R: bool>(
    t: Topo,
    busy: bool,
    a: &Arrays,
    k: Consts,
    out: &mut [f64],
) -> f64 {
    match (t, busy) {
        (Topo::None, false) => fill_loop::<T, R, false>(a, k, out, |_| (0.0, 0.0)),
        (Topo::None, true) => fill_loop::<T, R, true>(a, k, out, |_| (0.0, 0.0)),
        (t, b) => fill_loop::<T, R, true>(a, busy_k(k, b), out, |d| topo_terms(t, d)),
    }
}

/// With topology the busy check always runs; without a threshold it never fires.
fn busy_k(k: Consts, busy: bool) -> Consts {
    Consts {
        busy: if busy { k.busy } else { INF },
        ..k
    }
}

/// (penalty, gate) of a worker in domain `d`.
#[inline(always)]
fn topo_terms(t: Topo, d: u32) -> (f64, f64) {
    match t {
        Topo::Restrict(x) if d != x => (0.0, INF),
        t => (penalty(t, d), 0.0),
    }
}

/// The per-worker inputs of step 1, all the length of the pool.
struct Arrays<'a> {
    q: &'a [f64],
    held: &'a [f64],
    ob: &'a [f64],
    gate: &'a [f64],
    cap: &'a [f64],
    topo: &'a [u32],
    dev: &'a [f64],
    host: &'a [f64],
    disk: &'a [f64],
    shared: &'a [f64],
    reuse: &'a [u32],
}

/// The figures of one worker that step 1 reads.
#[derive(Clone, Copy)]
struct One {
    q: f64,
    held: f64,
    ob: f64,
    gate: f64,
    cap: f64,
    topo: u32,
    dev: f64,
    host: f64,
    disk: f64,
    shared: f64,
    reuse: u32,
}

/// Step 1 for one worker; same operations, same order as `CostModel::terms`.
#[inline(always)]
fn one<const T: bool, const R: bool, const B: bool>(
    x: One,
    k: &Consts,
    topo: &impl Fn(u32) -> (f64, f64),
) -> f64 {
    let prefill = (x.q + k.input) * k.inv_bs;
    let credit = k.w[0] * x.dev + k.w[1] * x.host + k.w[2] * x.disk + k.w[3] * x.shared;
    let adj = prefill - credit;
    let adj = if adj > 0.0 { adj } else { 0.0 };
    let active = x.held + x.ob;
    let pb = k.prompt_blocks;
    let added = if R {
        // pb - min(max(reuse, device), pb), exact on these integers.
        let r = f64::from(x.reuse);
        let h = if x.dev > r { x.dev } else { r };
        pb - if h < pb { h } else { pb }
    } else {
        pb
    };
    let decode = if T { active + added } else { 0.0 };
    let (pen, g) = topo(x.topo);
    let c = k.scale * adj + decode + pen;
    let c = if c.abs() < INF { c } else { f64::MAX };
    let busy = if B && active >= k.busy * x.cap {
        INF
    } else {
        0.0
    };
    c + (x.gate + g + busy)
}

/// Step 1 proper, four workers at a time so the compiler vectorises it. `T`:
/// `track_active_blocks`; `R`: `assume_kv_reuse`; `B`: check `busy_threshold`; `topo`
/// gives (penalty, gate) from a worker's topology id.
#[inline(always)]
fn fill_loop<const T: bool, const R: bool, const B: bool>(
    a: &Arrays,
    k: Consts,
    out: &mut [f64],
    topo: impl Fn(u32) -> (f64, f64),
) -> f64 {
    let at = |i: usize| One {
        q: a.q.get(i).copied().unwrap_or(0.0),
        held: a.held.get(i).copied().unwrap_or(0.0),
        ob: a.ob.get(i).copied().unwrap_or(0.0),
        gate: a.gate.get(i).copied().unwrap_or(INF),
        cap: a.cap.get(i).copied().unwrap_or(0.0),
        topo: a.topo.get(i).copied().unwrap_or(0),
        dev: a.dev.get(i).copied().unwrap_or(0.0),
        host: a.host.get(i).copied().unwrap_or(0.0),
        disk: a.disk.get(i).copied().unwrap_or(0.0),
        shared: a.shared.get(i).copied().unwrap_or(0.0),
        reuse: a.reuse.get(i).copied().unwrap_or(0),
    };
    let mut m = [INF; 4];
    let n = out.len();
    // Every array has the pool's length by construction; checked once here so the
    // loop below indexes without bounds checks (and vectorises).
    let (Some(q), Some(held), Some(ob), Some(gate), Some(cap), Some(tp)) = (
        a.q.get(..n),
        a.held.get(..n),
        a.ob.get(..n),
        a.gate.get(..n),
        a.cap.get(..n),
        a.topo.get(..n),
    ) else {
        return INF;
    };
    let (Some(dev), Some(host), Some(disk), Some(shared), Some(reuse)) = (
        a.dev.get(..n),
        a.host.get(..n),
        a.disk.get(..n),
        a.shared.get(..n),
        a.reuse.get(..n),
    ) else {
        return INF;
    };
    let mut i = 0;
    while i + 4 <= n {
        for j in 0..4 {
            let x = One {
                q: q[i + j],
                held: held[i + j],
                ob: ob[i + j],
                gate: gate[i + j],
                cap: cap[i + j],
                topo: tp[i + j],
                dev: dev[i + j],
                host: host[i + j],
                disk: disk[i + j],
                shared: shared[i + j],
                reuse: reuse[i + j],
            };
            let c = one::<T, R, B>(x, &k, &topo);
            out[i + j] = c;
            m[j] = if c < m[j] { c } else { m[j] };
        }
        i += 4;
    }
    let chunks = out.chunks_exact_mut(4);
    for o in chunks.into_remainder() {
        let c = one::<T, R, B>(at(i), &k, &topo);
        *o = c;
        m[0] = if c < m[0] { c } else { m[0] };
        i += 1;
    }
    m[0].min(m[1]).min(m[2].min(m[3]))
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
    let mut total = 0.0;
    for (chunk, s) in buf.chunks_mut(CHUNK).zip(sums.iter_mut()) {
        let mut acc = [0.0f64; 4];
        let mut it = chunk.chunks_exact_mut(4);
        for c in &mut it {
            for j in 0..4 {
                let w = exp_neg(-(c[j] - lo) * scale);
                c[j] = w;
                acc[j] += w;
            }
        }
        for c in it.into_remainder() {
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

/// `e^y` for `y <= 0` (larger `y` is not needed: softmax exponents are `<= 0`),
/// relative error below 1e-8 (ample for sampling), and 0 below -708 or for NaN.
///
/// Inlined polynomial instead of libm's `exp`, written without branches or float →
/// integer conversions so a loop of it vectorises: `e^y = 2^k * e^r` with
/// `k = round(y / ln 2)` and `|r| <= ln(2) / 2`, `e^r` by its Taylor series to degree 7
/// (error < 6e-9).
#[inline(always)]
pub(crate) fn exp_neg(y: f64) -> f64 {
    let ok = y > -708.0; // false for NaN
    let y = if ok { y } else { -708.0 };
    let y = if y < 0.0 { y } else { 0.0 };
    // Round to nearest integer: adding 1.5 * 2^52 pushes the fraction bits out of the
    // mantissa, which then holds k as a two's-complement offset from the shifter.
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    let t = y * std::f64::consts::LOG2_E;
    let kt = t + SHIFTER;
    let k = kt - SHIFTER;
    let r = (t - k) * std::f64::consts::LN_2;
    // Degree-7 Taylor polynomial in Estrin form: short dependency chains.
    let r2 = r * r;
    let r4 = r2 * r2;
    let lo = (1.0 + r) + r2 * (1.0 / 2.0 + r * (1.0 / 6.0));
    let hi = (1.0 / 24.0 + r * (1.0 / 120.0)) + r2 * (1.0 / 720.0 + r * (1.0 / 5_040.0));
    let p = lo + r4 * hi;
    // k is in [-1022, 0], so k + 1023 is a valid biased exponent of a normal number.
    let bits = kt
        .to_bits()
        .wrapping_sub(SHIFTER.to_bits())
        .wrapping_add(1023)
        << 52;
    let v = p * f64::from_bits(bits);
    if ok {
        v
    } else {
        0.0
    }
}
