//! One `kv` stage as the selection kernel ([`super::kernel`]) and its dense cost
//! passes ([`super::fill`], [`super::avx2`]) take it, and the two rules they share
//! with the row-by-row path ([`super::pick`]): what counts as a tie with the minimum,
//! and the branch-free `e^y` of softmax weights.
//!
//! A leaf of `select`: it names only the cost model, so the kernel, its fills and the
//! pick path all import it and none of them imports another for these.

use super::cost::CostModel;
use std::ops::Range;

/// Costs closer than this are a tie.
pub(crate) const TIE_EPS: f64 = 1e-9;

/// Highest cost tied with the minimum `m` under `balance_slack` `slack`.
#[inline]
pub(crate) fn tie_bound(m: f64, slack: f64) -> f64 {
    m + TIE_EPS.max(slack * m)
}

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
    /// `balance_slack`, and the decision's turn among the tied workers
    /// ([`super::RrState::ties`]).
    pub slack: f64,
    pub turn: u64,
    /// `balance_routed_min_ties`.
    pub min_ties: u32,
    /// Position of the request's affinity worker ([`Hits::affinity`]), and
    /// `affinity_slack`.
    pub affinity: Option<usize>,
    pub affinity_slack: f64,
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
