//! Step 1 of the `kv` kernel: the stage cost of every worker of a pool, densely, from
//! the [`Loads`](super::Loads) arrays and the request's [`Hits`](super::Hits) columns,
//! DESIGN §1 "Cost".
//!
//! Two implementations compute the same thing: a portable one, one worker at a time,
//! and on x86-64 CPUs with AVX2 one that computes four workers per instruction
//! ([`super::avx2`]), chosen at run time. Both do, per worker, the operations of
//! [`CostModel::terms`](super::cost::CostModel::terms) in the same order (plus the
//! topology penalty, the busy check and the liveness gate), so they agree to the bit
//! with each other and with the row-by-row path; a worker that is not live, busy or
//! (`topology_policy = restrict`) outside the domain gets +∞, a non-finite cost
//! becomes `f64::MAX`.
//!
//! The configuration is turned into const generics once per stage ([`Lanes::run`]), so
//! the loops carry no per-worker branches on settings.
//!
//! Guarantees: no panic on any input (every array is checked against the output's
//! length once; a short array gives +∞ everywhere).

use super::hits::Columns;
use super::stage::{KvStage, Topo};

const INF: f64 = f64::INFINITY;

/// Topology rules as a const generic.
pub(crate) const TP_NONE: u8 = 0;
pub(crate) const TP_RESTRICT: u8 = 1;
pub(crate) const TP_PREFER: u8 = 2;

/// Everything of the cost that does not depend on the worker.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Consts {
    pub input: f64,
    pub inv_bs: f64,
    /// Credit weights of the device, host, disk and shared overlaps.
    pub w: [f64; 4],
    pub scale: f64,
    pub prompt_blocks: f64,
    /// `busy_threshold`.
    pub busy: f64,
    /// Topology domain of the rule, and the `prefer` penalty.
    pub domain: u32,
    pub penalty: f64,
    /// False: the disk and shared terms of the credit are `finite weight × 0` and may
    /// be left out. (Adding such a ±0 could only change the sign of a zero credit,
    /// and `max(prefill - credit, 0)` maps every zero to +0, so costs are unchanged.)
    pub extra: bool,
    /// All ones with `assume_device_reuse` (the device overlap counts as held), else 0.
    pub dev_mask: u32,
}

/// The per-worker inputs of step 1, all the length of the pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arrays<'a> {
    pub q: &'a [f64],
    pub held: &'a [f64],
    pub ob: &'a [f64],
    pub gate: &'a [f64],
    pub cap: &'a [f64],
    pub topo: &'a [u32],
    /// Each worker's cost factor (`CostModel::slowness`; all ones on a uniform fleet).
    pub slow: &'a [f64],
    pub cols: Columns<'a>,
}

/// The same arrays, each checked to be exactly `n` long.
#[derive(Clone, Copy)]
pub(crate) struct Exact<'a>(pub(crate) Arrays<'a>);

impl<'a> Arrays<'a> {
    /// The arrays cut to `n`, `None` if one is shorter.
    pub fn exact(&self, n: usize) -> Option<Exact<'a>> {
        let c = &self.cols;
        Some(Exact(Arrays {
            q: self.q.get(..n)?,
            held: self.held.get(..n)?,
            ob: self.ob.get(..n)?,
            gate: self.gate.get(..n)?,
            cap: self.cap.get(..n)?,
            topo: self.topo.get(..n)?,
            slow: self.slow.get(..n)?,
            cols: Columns {
                ov: c.ov.get(..n)?,
                reuse: c.reuse.get(..n)?,
                extra: c.extra,
            },
        }))
    }
}

/// One implementation of step 1 over exact arrays; returns the minimum cost.
/// `T`: `track_active_blocks`; `R`: `assume_kv_reuse`; `O`: `track_output_blocks`;
/// `B`: check `busy_threshold`; `TP`: topology rule.
pub(crate) trait Lanes {
    fn run<const T: bool, const R: bool, const O: bool, const B: bool, const TP: u8>(
        a: Exact,
        k: &Consts,
        out: &mut [f64],
    ) -> f64;
}

/// Step 1 with implementation `L`.
pub(crate) fn fill_with<L: Lanes>(st: &KvStage, a: &Arrays, out: &mut [f64]) -> f64 {
    let cm = &st.model;
    let (domain, penalty) = match st.topo {
        Topo::None => (0, 0.0),
        Topo::Restrict(d) => (d, 0.0),
        Topo::Prefer(d, p) => (d, p),
    };
    let k = Consts {
        input: cm.input_tokens,
        inv_bs: cm.inv_block_size,
        w: cm.weights(),
        scale: cm.scale,
        prompt_blocks: f64::from(cm.prompt_blocks),
        busy: st.busy.unwrap_or(0.0),
        domain,
        penalty,
        extra: a.cols.extra || !cm.weights()[2..].iter().all(|w| w.is_finite()),
        dev_mask: if cm.device_reuse { u32::MAX } else { 0 },
    };
    let Some(a) = a.exact(out.len()) else {
        out.fill(INF);
        return INF;
    };
    match (
        cm.track_active_blocks,
        cm.assume_kv_reuse,
        cm.track_output_blocks,
    ) {
        (true, true, true) => busy_topo::<L, true, true, true>(st, a, &k, out),
        (true, true, false) => busy_topo::<L, true, true, false>(st, a, &k, out),
        (true, false, true) => busy_topo::<L, true, false, true>(st, a, &k, out),
        (true, false, false) => busy_topo::<L, true, false, false>(st, a, &k, out),
        // Without active blocks neither reuse nor output blocks count, but output
        // blocks still count toward `busy_threshold`.
        (false, _, true) => busy_topo::<L, false, false, true>(st, a, &k, out),
        (false, _, false) => busy_topo::<L, false, false, false>(st, a, &k, out),
    }
}

#[inline(always)]
fn busy_topo<L: Lanes, const T: bool, const R: bool, const O: bool>(
    st: &KvStage,
    a: Exact,
    k: &Consts,
    out: &mut [f64],
) -> f64 {
    match (st.busy.is_some(), st.topo) {
        (false, Topo::None) => L::run::<T, R, O, false, TP_NONE>(a, k, out),
        (true, Topo::None) => L::run::<T, R, O, true, TP_NONE>(a, k, out),
        (false, Topo::Restrict(_)) => L::run::<T, R, O, false, TP_RESTRICT>(a, k, out),
        (true, Topo::Restrict(_)) => L::run::<T, R, O, true, TP_RESTRICT>(a, k, out),
        (false, Topo::Prefer(..)) => L::run::<T, R, O, false, TP_PREFER>(a, k, out),
        (true, Topo::Prefer(..)) => L::run::<T, R, O, true, TP_PREFER>(a, k, out),
    }
}

/// Step 1 for worker `i`; same operations, same order as `CostModel::terms`, except
/// that terms a configuration leaves out are not added at all (adding 0 could only
/// turn a cost of -0 into +0, which compares equal).
#[inline(always)]
pub(crate) fn one<const T: bool, const R: bool, const O: bool, const B: bool, const TP: u8>(
    a: &Exact,
    i: usize,
    k: &Consts,
) -> f64 {
    let a = &a.0;
    let c = &a.cols;
    let g = |v: &[f64], d: f64| v.get(i).copied().unwrap_or(d);
    let o = c.ov.get(i).copied().unwrap_or_default();
    let prefill = (g(a.q, 0.0) + k.input) * k.inv_bs;
    let credit = k.w[0] * f64::from(o.device)
        + k.w[1] * f64::from(o.host)
        + k.w[2] * f64::from(o.disk)
        + k.w[3] * f64::from(o.shared);
    let adj = prefill - credit;
    let adj = if adj > 0.0 { adj } else { 0.0 };
    let held = g(a.held, 0.0);
    let active = if O { held + g(a.ob, 0.0) } else { held };
    let pb = k.prompt_blocks;
    let mut cost = k.scale * adj;
    if T {
        let added = if R {
            // pb - min(max(reuse, device & mask), pb), exact on these integers.
            let d = o.device & k.dev_mask;
            let h = f64::from(d.max(c.reuse.get(i).copied().unwrap_or(0)));
            pb - if h < pb { h } else { pb }
        } else {
            pb
        };
        cost += active + added;
    }
    cost *= g(a.slow, 1.0);
    let other = a.topo.get(i).is_some_and(|&d| d != k.domain);
    if TP == TP_PREFER && other {
        cost += k.penalty;
    }
    let cost = if cost.abs() < INF { cost } else { f64::MAX };
    let mut gate = g(a.gate, INF);
    if TP == TP_RESTRICT && other {
        gate += INF;
    }
    if B && active >= k.busy * g(a.cap, 0.0) {
        gate += INF;
    }
    cost + gate
}

/// The portable implementation: one worker at a time, four running minima.
pub(crate) struct Portable;

impl Lanes for Portable {
    fn run<const T: bool, const R: bool, const O: bool, const B: bool, const TP: u8>(
        a: Exact,
        k: &Consts,
        out: &mut [f64],
    ) -> f64 {
        let mut m = [INF; 4];
        for (i, o) in out.iter_mut().enumerate() {
            let c = one::<T, R, O, B, TP>(&a, i, k);
            *o = c;
            m[i & 3] = if c < m[i & 3] { c } else { m[i & 3] };
        }
        min4(m)
    }
}

/// Minimum of four running minima (the same whatever their order: no NaN).
#[inline(always)]
pub(crate) fn min4(m: [f64; 4]) -> f64 {
    m[0].min(m[1]).min(m[2].min(m[3]))
}
