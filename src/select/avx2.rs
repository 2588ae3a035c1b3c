//! The AVX2 implementation of the selection kernel's dense passes: step 1 (the cost
//! of every worker, [`super::fill`]) four workers per instruction, and the softmax
//! weights ([`weights`]).
//!
//! Chosen at run time ([`available`]) because the crate is built for baseline x86-64,
//! where these loops stay scalar. Every lane performs exactly the operations of the
//! portable code, in the same order and without fused multiply-adds, so the two
//! implementations agree to the bit (tests below compare them on random inputs
//! including infinities and NaN); the tail of fewer than four workers is computed by
//! the portable code.
//!
//! Safety: the only `unsafe` is calling `#[target_feature(enable = "avx2")]`
//! functions, after [`available`] confirmed the CPU has AVX2, and unaligned loads and
//! stores through pointers of slices whose length was checked just before.

#![cfg(target_arch = "x86_64")]

use super::fill::{min4, one, Consts, Exact, Lanes, TP_PREFER, TP_RESTRICT};
use crate::types::Overlap;
use std::arch::x86_64::*;

/// True if this CPU has AVX2 (cached by the standard library after the first call).
#[inline]
pub(crate) fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
}

/// Marker for [`Lanes`]; only used after [`available`] returned true.
pub(crate) struct Avx2;

impl Lanes for Avx2 {
    #[inline]
    fn run<const T: bool, const R: bool, const O: bool, const B: bool, const TP: u8>(
        a: Exact,
        k: &Consts,
        out: &mut [f64],
    ) -> f64 {
        if !available() {
            return super::fill::Portable::run::<T, R, O, B, TP>(a, k, out);
        }
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe {
            if k.extra {
                fill::<T, R, O, B, TP, true>(a, k, out)
            } else {
                fill::<T, R, O, B, TP, false>(a, k, out)
            }
        }
    }
}

/// Four `f64`s from `s[i..i + 4]`.
///
/// # Safety
/// `i + 4 <= s.len()`.
#[inline(always)]
unsafe fn ld(s: &[f64], i: usize) -> __m256d {
    debug_assert!(i + 4 <= s.len());
    // SAFETY: in bounds by the caller's contract; loadu has no alignment need.
    unsafe { _mm256_loadu_pd(s.as_ptr().add(i)) }
}

/// Four `u32`s from `s[i..i + 4]`.
///
/// # Safety
/// `i + 4 <= s.len()`.
#[inline(always)]
unsafe fn ld32(s: &[u32], i: usize) -> __m128i {
    debug_assert!(i + 4 <= s.len());
    // SAFETY: as `ld`.
    unsafe { _mm_loadu_si128(s.as_ptr().add(i).cast()) }
}

/// Four `u32`s below 2^31 (every [`super::Hits`] figure is) as `f64`s, exactly.
#[inline]
#[target_feature(enable = "avx2")]
fn to_f64(x: __m128i) -> __m256d {
    _mm256_cvtepi32_pd(x)
}

/// The device, host, disk and shared overlaps of workers `i..i + 4`, one vector each
/// (a 4×4 transpose of four 16-byte [`Overlap`]s).
///
/// # Safety
/// `i + 4 <= ov.len()`, and the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn overlaps(ov: &[Overlap], i: usize) -> [__m128i; 4] {
    debug_assert!(i + 4 <= ov.len());
    // SAFETY: in bounds by the caller's contract; `Overlap` is `repr(C)`, four `u32`s.
    let [a, b, c, d] =
        [0, 1, 2, 3].map(|j| unsafe { _mm_loadu_si128(ov.as_ptr().add(i + j).cast()) });
    let ab_lo = _mm_unpacklo_epi32(a, b); // d0 d1 h0 h1
    let ab_hi = _mm_unpackhi_epi32(a, b); // k0 k1 s0 s1
    let cd_lo = _mm_unpacklo_epi32(c, d); // d2 d3 h2 h3
    let cd_hi = _mm_unpackhi_epi32(c, d); // k2 k3 s2 s3
    [
        _mm_unpacklo_epi64(ab_lo, cd_lo),
        _mm_unpackhi_epi64(ab_lo, cd_lo),
        _mm_unpacklo_epi64(ab_hi, cd_hi),
        _mm_unpackhi_epi64(ab_hi, cd_hi),
    ]
}

/// `a > 0 ? a : 0` per lane (NaN → 0), like the portable code.
#[inline]
#[target_feature(enable = "avx2")]
fn pos_or_zero(a: __m256d) -> __m256d {
    let gt = _mm256_cmp_pd::<_CMP_GT_OQ>(a, _mm256_setzero_pd());
    _mm256_and_pd(gt, a)
}

/// Step 1, four workers at a time; see [`super::fill::one`] for the scalar original.
/// `X`: add the disk and shared credit terms (see `Consts::extra`).
/// (`_mm256_min_pd(a, b)` is exactly `a < b ? a : b`, the portable code's choice.)
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn fill<
    const T: bool,
    const R: bool,
    const O: bool,
    const B: bool,
    const TP: u8,
    const X: bool,
>(
    a: Exact,
    k: &Consts,
    out: &mut [f64],
) -> f64 {
    let n = out.len();
    let x = &a.0;
    let c = &x.cols;
    let inf = _mm256_set1_pd(f64::INFINITY);
    let input = _mm256_set1_pd(k.input);
    let inv_bs = _mm256_set1_pd(k.inv_bs);
    let w = k.w.map(|v| _mm256_set1_pd(v));
    let scale = _mm256_set1_pd(k.scale);
    let pb = _mm256_set1_pd(k.prompt_blocks);
    let max = _mm256_set1_pd(f64::MAX);
    let abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(i64::MAX));
    let mut m = inf;
    let mut i = 0;
    // `Exact` guarantees every array is `n` long, so `i + 4 <= n` keeps all loads and
    // the store in bounds.
    while i + 4 <= n {
        // SAFETY (every load and the store below): i + 4 <= n = every length.
        let [d32, h32, k32, s32] = unsafe { overlaps(c.ov, i) };
        let dev = to_f64(d32);
        let prefill = _mm256_mul_pd(_mm256_add_pd(unsafe { ld(x.q, i) }, input), inv_bs);
        let credit = _mm256_add_pd(_mm256_mul_pd(w[0], dev), _mm256_mul_pd(w[1], to_f64(h32)));
        // `X` false: the disk and shared terms are ±0 (see `Consts::extra`).
        let credit = if X {
            _mm256_add_pd(
                _mm256_add_pd(credit, _mm256_mul_pd(w[2], to_f64(k32))),
                _mm256_mul_pd(w[3], to_f64(s32)),
            )
        } else {
            credit
        };
        let adj = pos_or_zero(_mm256_sub_pd(prefill, credit));
        let held = unsafe { ld(x.held, i) };
        let active = if O {
            _mm256_add_pd(held, unsafe { ld(x.ob, i) })
        } else {
            held
        };
        let mut cost = _mm256_mul_pd(scale, adj);
        if T {
            let added = if R {
                let d = _mm_and_si128(d32, _mm_set1_epi32(k.dev_mask as i32));
                let h = to_f64(_mm_max_epu32(d, unsafe { ld32(c.reuse, i) }));
                _mm256_sub_pd(pb, _mm256_min_pd(h, pb))
            } else {
                pb
            };
            cost = _mm256_add_pd(cost, _mm256_add_pd(active, added));
        }
        cost = _mm256_mul_pd(cost, unsafe { ld(x.slow, i) });
        // Topology: lanes whose domain differs.
        let other = if TP == TP_PREFER || TP == TP_RESTRICT {
            let eq = _mm_cmpeq_epi32(unsafe { ld32(x.topo, i) }, _mm_set1_epi32(k.domain as i32));
            _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_xor_si128(eq, _mm_set1_epi32(-1))))
        } else {
            _mm256_setzero_pd()
        };
        if TP == TP_PREFER {
            cost = _mm256_add_pd(cost, _mm256_and_pd(other, _mm256_set1_pd(k.penalty)));
        }
        let finite = _mm256_cmp_pd::<_CMP_LT_OQ>(_mm256_and_pd(cost, abs_mask), inf);
        let cost = _mm256_blendv_pd(max, cost, finite);
        let mut gate = unsafe { ld(x.gate, i) };
        if TP == TP_RESTRICT {
            gate = _mm256_add_pd(gate, _mm256_and_pd(other, inf));
        }
        if B {
            let cap = unsafe { ld(x.cap, i) };
            let limit = _mm256_mul_pd(_mm256_set1_pd(k.busy), cap);
            let ge = _mm256_cmp_pd::<_CMP_GE_OQ>(active, limit);
            gate = _mm256_add_pd(gate, _mm256_and_pd(ge, inf));
        }
        let cost = _mm256_add_pd(cost, gate);
        unsafe { _mm256_storeu_pd(out.as_mut_ptr().add(i), cost) };
        m = _mm256_min_pd(cost, m);
        i += 4;
    }
    let mut lanes = [0.0; 4];
    // SAFETY: `lanes` holds four f64s.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), m) };
    let mut j = 0;
    while i < n {
        let c = one::<T, R, O, B, TP>(&a, i, k);
        if let Some(o) = out.get_mut(i) {
            *o = c;
        }
        lanes[j] = if c < lanes[j] { c } else { lanes[j] };
        i += 1;
        j += 1;
    }
    min4(lanes)
}

/// [`super::kernel::exp_neg`] on four lanes, operation for operation.
#[inline]
#[target_feature(enable = "avx2")]
fn exp_neg(y: __m256d) -> __m256d {
    const SHIFTER: f64 = 6_755_399_441_055_744.0;
    let ok = _mm256_cmp_pd::<_CMP_GT_OQ>(y, _mm256_set1_pd(-708.0));
    let y = _mm256_blendv_pd(_mm256_set1_pd(-708.0), y, ok);
    let y = _mm256_min_pd(y, _mm256_setzero_pd());
    let t = _mm256_mul_pd(y, _mm256_set1_pd(std::f64::consts::LOG2_E));
    let kt = _mm256_add_pd(t, _mm256_set1_pd(SHIFTER));
    let k = _mm256_sub_pd(kt, _mm256_set1_pd(SHIFTER));
    let r = _mm256_mul_pd(_mm256_sub_pd(t, k), _mm256_set1_pd(std::f64::consts::LN_2));
    let c = |x: f64| _mm256_set1_pd(x);
    let r2 = _mm256_mul_pd(r, r);
    let r4 = _mm256_mul_pd(r2, r2);
    let lo = _mm256_add_pd(
        _mm256_add_pd(c(1.0), r),
        _mm256_mul_pd(
            r2,
            _mm256_add_pd(c(1.0 / 2.0), _mm256_mul_pd(r, c(1.0 / 6.0))),
        ),
    );
    let hi = _mm256_add_pd(
        _mm256_add_pd(c(1.0 / 24.0), _mm256_mul_pd(r, c(1.0 / 120.0))),
        _mm256_mul_pd(
            r2,
            _mm256_add_pd(c(1.0 / 720.0), _mm256_mul_pd(r, c(1.0 / 5_040.0))),
        ),
    );
    let p = _mm256_add_pd(lo, _mm256_mul_pd(r4, hi));
    let bits = _mm256_slli_epi64::<52>(_mm256_add_epi64(
        _mm256_sub_epi64(
            _mm256_castpd_si256(kt),
            _mm256_set1_epi64x(SHIFTER.to_bits() as i64),
        ),
        _mm256_set1_epi64x(1023),
    ));
    let v = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
    _mm256_and_pd(ok, v)
}

/// The softmax weights of `four` (a multiple of four long): each cost `c` becomes
/// `exp_neg(-(c - lo) * scale)`; returns the sums of lanes `i % 4`. Same operations
/// as the portable loop in `kernel::weigh`.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn weigh(four: &mut [f64], lo: f64, scale: f64) -> [f64; 4] {
    let lo = _mm256_set1_pd(lo);
    let scale = _mm256_set1_pd(scale);
    let sign = _mm256_set1_pd(-0.0);
    let mut acc = _mm256_setzero_pd();
    for c in four.chunks_exact_mut(4) {
        // SAFETY: `c` is four f64s long.
        let x = unsafe { _mm256_loadu_pd(c.as_ptr()) };
        let y = _mm256_mul_pd(_mm256_xor_pd(_mm256_sub_pd(x, lo), sign), scale);
        let w = exp_neg(y);
        // SAFETY: as the load.
        unsafe { _mm256_storeu_pd(c.as_mut_ptr(), w) };
        acc = _mm256_add_pd(acc, w);
    }
    let mut out = [0.0; 4];
    // SAFETY: `out` holds four f64s.
    unsafe { _mm256_storeu_pd(out.as_mut_ptr(), acc) };
    out
}

#[cfg(test)]
mod tests {
    use super::super::cost::CostModel;
    use super::super::fill::{fill_with, Arrays, Portable};
    use super::super::hits::Columns;
    use super::super::stage::{KvStage, Topo};
    use super::super::RequestShape;
    use super::*;
    use crate::config::RouterConfig;
    use proptest::prelude::*;

    /// One worker's inputs: q, held, ob, gate, cap, topology, overlap, reuse.
    type Row = (f64, f64, f64, f64, f64, u32, Overlap, u32);

    /// A load figure: mostly ordinary, sometimes an edge value.
    fn fig() -> impl Strategy<Value = f64> {
        prop_oneof![
            8 => 0.0..5000.0f64,
            1 => Just(f64::INFINITY),
            1 => Just(f64::NAN),
            1 => Just(-0.0),
            1 => Just(f64::MAX),
        ]
    }

    /// A disk or shared weight: usually ordinary, sometimes negative or infinite.
    fn odd_weight() -> impl Strategy<Value = f64> {
        prop_oneof![6 => 0.0..2.0f64, 1 => -1.0..0.0f64, 1 => Just(f64::INFINITY)]
    }

    fn overlap() -> impl Strategy<Value = Overlap> {
        let rare = || prop_oneof![4 => Just(0u32), 1 => 0u32..5];
        (0u32..40, 0u32..10, rare(), rare()).prop_map(|(d, h, k, s)| Overlap {
            device: d,
            host: h,
            disk: k,
            shared: s,
        })
    }

    proptest! {
        /// The AVX2 pass gives every cost and the minimum bit for bit like the
        /// portable one, for every configuration the const generics select.
        #[test]
        fn avx2_fill_equals_portable(
            n in 0usize..23,
            figs in prop::collection::vec((fig(), fig(), fig(), prop_oneof![Just(0.0), Just(f64::INFINITY)], fig(), 0u32..3, overlap(), 0u32..50), 23),
            flags in (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), 0u8..3, any::<bool>()),
            slow in prop::collection::vec(prop_oneof![4 => Just(1.0f64), 2 => 0.5..16.0f64, 1 => Just(8.0)], 23),
            weights in (0.0..2.0f64, -1.0..1.0f64, odd_weight(), odd_weight(), 0.0..4.0f64),
            input in 0u32..9000,
            plain in any::<bool>(),
        ) {
            prop_assume!(available());
            let (track_active, reuse, output, busy, topo, device_reuse) = flags;
            let cfg = RouterConfig {
                assume_device_reuse: device_reuse,
                track_active_blocks: track_active,
                assume_kv_reuse: reuse,
                track_output_blocks: output,
                overlap_score_credit: weights.0,
                host_cache_hit_weight: weights.1,
                disk_cache_hit_weight: weights.2,
                shared_cache_multiplier: weights.3,
                prefill_load_scale: weights.4,
                ..RouterConfig::default()
            };
            let st = KvStage {
                model: CostModel::new(&cfg, &RequestShape::new(input, cfg.block_size)),
                range: 0..n,
                busy: busy.then_some(0.7),
                topo: match topo {
                    0 => Topo::None,
                    1 => Topo::Restrict(1),
                    _ => Topo::Prefer(1, 3.5),
                },
                temperature: 0.0,
                slack: 0.0,
                turn: 0,
                min_ties: 0,
                affinity: None,
                affinity_slack: 0.0,
            };
            let f = &figs[..n];
            let col = |g: fn(&Row) -> f64| -> Vec<f64> {
                f.iter().map(g).collect()
            };
            let (q, held, ob, gate, cap) = (col(|x| x.0), col(|x| x.1), col(|x| x.2), col(|x| x.3), col(|x| x.4));
            let topo: Vec<u32> = f.iter().map(|x| x.5).collect();
            // Half the fleets have no disk or shared overlap at all.
            let ov: Vec<Overlap> = f
                .iter()
                .map(|x| if plain { Overlap { disk: 0, shared: 0, ..x.6 } } else { x.6 })
                .collect();
            // Claim "no disk or shared overlap" whenever it holds, as `Hits` would.
            let extra = ov.iter().any(|o| o.disk != 0 || o.shared != 0);
            let reuse_col: Vec<u32> = f.iter().map(|x| x.7).collect();
            let a = Arrays {
                q: &q,
                held: &held,
                ob: &ob,
                gate: &gate,
                cap: &cap,
                topo: &topo,
                slow: &slow[..n],
                cols: Columns { ov: &ov, reuse: &reuse_col, extra },
            };
            let (mut x, mut y) = (vec![0.0; n], vec![0.0; n]);
            let mx = fill_with::<Portable>(&st, &a, &mut x);
            let my = fill_with::<Avx2>(&st, &a, &mut y);
            prop_assert_eq!(mx.to_bits(), my.to_bits());
            for (i, (p, v)) in x.iter().zip(&y).enumerate() {
                prop_assert_eq!(p.to_bits(), v.to_bits(), "worker {}: {} vs {}", i, p, v);
            }
        }
    }

    proptest! {
        /// The AVX2 softmax weights equal the portable `exp_neg` loop bit for bit.
        #[test]
        fn avx2_weights_equal_portable(
            costs in prop::collection::vec(prop_oneof![
                8 => 0.0..1.0e4f64,
                1 => Just(f64::INFINITY),
                1 => Just(f64::MAX),
                1 => -1.0e3..0.0f64,
            ], 0..9),
            lo in 0.0..100.0f64,
            scale in prop_oneof![0.0..10.0f64, Just(1.0e300)],
        ) {
            prop_assume!(available());
            let n = costs.len() & !3;
            let mut x = costs[..n].to_vec();
            let mut acc = [0.0f64; 4];
            for c in x.chunks_exact_mut(4) {
                for j in 0..4 {
                    let w = super::super::stage::exp_neg(-(c[j] - lo) * scale);
                    c[j] = w;
                    acc[j] += w;
                }
            }
            let mut y = costs[..n].to_vec();
            // SAFETY: AVX2 is available (assumed above).
            let got = unsafe { weigh(&mut y, lo, scale) };
            prop_assert_eq!(acc.map(f64::to_bits), got.map(f64::to_bits));
            for (a, b) in x.iter().zip(&y) {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            }
        }
    }
}
