//! Online prefill-duration predictor for the `predicted` prefill load model.
//!
//! Model: `duration_us ≈ a + b·e + c·k + d·e²`, where `e` is the effective ISL (input
//! tokens the prefill worker must compute) and `k` the cached prefix length, both in
//! units of 1024 tokens so the normal equations stay well scaled. The quadratic term
//! captures attention's super-linear cost on long prompts; on linear data it fits ~0.
//!
//! Fit: exponentially weighted least squares (every new sample multiplies the weight of
//! all older ones by `decay`, default half-life 1000 samples) so the model follows
//! drifting fleets. The normal equations carry a small ridge pulling each coefficient
//! toward the fixed fallback model (`cfg.prefill_fallback_us`, `d = 0`): directions the
//! data says nothing about (constant features, never-seen cached prefixes) keep the
//! fallback's answer instead of becoming singular or arbitrary.
//!
//! Guarantees: [`PrefillPredictor::predict`] is the fallback model until
//! `min_samples` samples were observed; it never returns less than 1 µs, more than
//! [`MAX_PREDICTED_US`], or anything derived from NaN; non-finite state is never stored
//! (a failed solve keeps the previous coefficients). Memory is constant (a 4×4 system).

/// Upper bound of any prediction (1 hour). A longer "prefill" is a measurement artefact;
/// capping it keeps one wild fit from pinning a worker's load forever.
pub const MAX_PREDICTED_US: u64 = 3_600_000_000;

/// Default forgetting factor per sample: weight halves every 1000 samples.
pub const DEFAULT_HALF_LIFE_SAMPLES: f64 = 1000.0;

/// Features are measured in units of this many tokens.
const TOKEN_UNIT: f64 = 1024.0;
/// Ridge strength relative to each feature's own weighted second moment.
const RIDGE_REL: f64 = 1e-4;
/// Absolute ridge, so features never observed stay exactly at the prior.
const RIDGE_ABS: f64 = 1e-6;

const N: usize = 4;

/// Online least-squares predictor of prefill duration from (effective ISL, cached tokens).
#[derive(Clone, Debug)]
pub struct PrefillPredictor {
    /// Prior / fallback coefficients in feature units.
    prior: [f64; N],
    min_samples: u32,
    decay: f64,
    samples: u64,
    /// Decayed Σ w·x·xᵀ.
    xtx: [[f64; N]; N],
    /// Decayed Σ w·x·y.
    xty: [f64; N],
    /// Current fitted coefficients in feature units.
    theta: [f64; N],
}

fn features(effective_isl: u32, cached_tokens: u32) -> [f64; N] {
    let e = effective_isl as f64 / TOKEN_UNIT;
    let k = cached_tokens as f64 / TOKEN_UNIT;
    [1.0, e, k, e * e]
}

fn dot(a: &[f64; N], b: &[f64; N]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Solves `a·x = b` for a symmetric positive definite `a` by Cholesky; `None` if `a` is
/// not numerically positive definite or the result is not finite.
fn solve_spd(a: &[[f64; N]; N], b: &[f64; N]) -> Option<[f64; N]> {
    // Partial dot product of two rows over their first `n` entries.
    let dot_n = |u: &[f64; N], v: &[f64; N], n: usize| -> f64 {
        u[..n].iter().zip(&v[..n]).map(|(p, q)| p * q).sum()
    };
    // a = L·Lᵀ, row by row.
    let mut l = [[0.0f64; N]; N];
    for i in 0..N {
        for j in 0..=i {
            let s = a[i][j] - dot_n(&l[i], &l[j], j);
            if i == j {
                if !(s > 0.0 && s.is_finite()) {
                    return None;
                }
                l[i][i] = s.sqrt();
            } else {
                l[i][j] = s / l[j][j];
            }
        }
    }
    // L·y = b (forward), then Lᵀ·x = y (backward).
    let mut y = [0.0f64; N];
    for i in 0..N {
        y[i] = (b[i] - dot_n(&l[i], &y, i)) / l[i][i];
    }
    let mut x = [0.0f64; N];
    for i in (0..N).rev() {
        let s: f64 = (i + 1..N).map(|k| l[k][i] * x[k]).sum();
        x[i] = (y[i] - s) / l[i][i];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

impl PrefillPredictor {
    /// A predictor that answers with the fixed model
    /// `fallback[0] + fallback[1]·effective_isl + fallback[2]·cached_tokens` (µs) until
    /// it has seen `min_samples` samples. Non-finite or negative fallback coefficients
    /// are treated as 0.
    pub fn new(fallback: [f64; 3], min_samples: u32) -> Self {
        let clean = |v: f64| if v.is_finite() && v > 0.0 { v } else { 0.0 };
        let prior = [
            clean(fallback[0]),
            clean(fallback[1]) * TOKEN_UNIT,
            clean(fallback[2]) * TOKEN_UNIT,
            0.0,
        ];
        PrefillPredictor {
            prior,
            min_samples,
            decay: 0.5f64.powf(1.0 / DEFAULT_HALF_LIFE_SAMPLES),
            samples: 0,
            xtx: [[0.0; N]; N],
            xty: [0.0; N],
            theta: prior,
        }
    }

    /// Sets the forgetting speed: the weight of a sample halves after
    /// `half_life_samples` newer samples (values below 1 or non-finite are ignored).
    pub fn with_half_life(mut self, half_life_samples: f64) -> Self {
        if half_life_samples.is_finite() && half_life_samples >= 1.0 {
            self.decay = 0.5f64.powf(1.0 / half_life_samples);
        }
        self
    }

    /// Samples observed so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// True once enough samples were seen for the fitted model to be used.
    pub fn using_fit(&self) -> bool {
        self.samples >= u64::from(self.min_samples)
    }

    /// Records one observed prefill: `duration_us` from routing to first token of a
    /// request with the given effective ISL and cached prefix length.
    pub fn observe(&mut self, effective_isl: u32, cached_tokens: u32, duration_us: u64) {
        let x = features(effective_isl, cached_tokens);
        let y = duration_us.min(MAX_PREDICTED_US) as f64;
        for i in 0..N {
            for j in 0..N {
                self.xtx[i][j] = self.xtx[i][j] * self.decay + x[i] * x[j];
            }
            self.xty[i] = self.xty[i] * self.decay + x[i] * y;
        }
        self.samples = self.samples.saturating_add(1);
        self.refit();
    }

    /// Re-solves the ridge-regularised normal equations; keeps the previous
    /// coefficients if the system cannot be solved.
    fn refit(&mut self) {
        let mut a = self.xtx;
        let mut b = self.xty;
        for i in 0..N {
            let lambda = RIDGE_REL * self.xtx[i][i] + RIDGE_ABS;
            a[i][i] += lambda;
            b[i] += lambda * self.prior[i];
        }
        if let Some(theta) = solve_spd(&a, &b) {
            self.theta = theta;
        }
    }

    /// The fixed fallback model's prediction (µs, clamped to `[1, MAX_PREDICTED_US]`).
    pub fn fallback_us(&self, effective_isl: u32, cached_tokens: u32) -> u64 {
        clamp_us(dot(&self.prior, &features(effective_isl, cached_tokens)))
    }

    /// Predicted prefill duration in µs, in `[1, MAX_PREDICTED_US]`. Uses the fitted
    /// model once `min_samples` samples were observed, the fallback before; also falls
    /// back where the fit gives a non-physical answer (non-finite or below 1 µs, e.g. a
    /// quadratic term extrapolated far outside the observed range).
    pub fn predict(&self, effective_isl: u32, cached_tokens: u32) -> u64 {
        if self.using_fit() {
            let v = dot(&self.theta, &features(effective_isl, cached_tokens));
            if v.is_finite() && v >= 1.0 {
                return clamp_us(v);
            }
        }
        self.fallback_us(effective_isl, cached_tokens)
    }
}

fn clamp_us(v: f64) -> u64 {
    if v.is_finite() {
        // `as` saturates; the clamp bounds it first anyway.
        v.clamp(1.0, MAX_PREDICTED_US as f64) as u64
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn law(e: u32, k: u32) -> u64 {
        3_000 + 40 * u64::from(e) + (3 * u64::from(k)) / 2
    }

    fn close(a: u64, b: u64, rel: f64) -> bool {
        (a as f64 - b as f64).abs() <= rel * b as f64
    }

    #[test]
    fn fallback_before_min_samples() {
        let mut p = PrefillPredictor::new([2_000.0, 50.0, 2.0], 32);
        assert_eq!(p.predict(1000, 500), 2_000 + 50_000 + 1_000);
        assert_eq!(p.predict(0, 0), 2_000);
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..31 {
            let (e, k) = (rng.random_range(100..8000), rng.random_range(0..8000));
            p.observe(e, k, law(e, k));
        }
        assert!(!p.using_fit());
        assert_eq!(p.predict(1000, 500), 53_000, "still the fallback");
        let (e, k) = (rng.random_range(100..8000), rng.random_range(0..8000));
        p.observe(e, k, law(e, k));
        assert!(p.using_fit());
        assert_eq!(p.samples(), 32);
        // Noise-free data: 32 samples already pin the law down.
        assert!(close(p.predict(1000, 500), law(1000, 500), 0.01));
    }

    #[test]
    fn converges_to_known_linear_law() {
        let mut p = PrefillPredictor::new([2_000.0, 50.0, 2.0], 32);
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..3000 {
            let (e, k) = (rng.random_range(100..16_000), rng.random_range(0..16_000));
            // ±1 % multiplicative noise.
            let noise = rng.random_range(0.99..1.01);
            p.observe(e, k, (law(e, k) as f64 * noise) as u64);
        }
        for (e, k) in [(200, 0), (4000, 2000), (12_000, 8000), (15_000, 15_000)] {
            let got = p.predict(e, k);
            assert!(
                close(got, law(e, k), 0.02),
                "({e},{k}): {got} vs {}",
                law(e, k)
            );
        }
        // The quadratic coefficient fitted ~0 on linear data (per 1024² tokens, µs).
        assert!(p.theta[3].abs() < 100.0, "{:?}", p.theta);
    }

    #[test]
    fn fits_quadratic_law() {
        let q = |e: u32| 1_000 + 10 * u64::from(e) + (u64::from(e) * u64::from(e)) / 100;
        let mut p = PrefillPredictor::new([2_000.0, 50.0, 2.0], 8);
        let mut rng = SmallRng::seed_from_u64(3);
        for _ in 0..500 {
            let e = rng.random_range(100..20_000);
            p.observe(e, 0, q(e));
        }
        assert!(close(p.predict(10_000, 0), q(10_000), 0.01));
    }

    #[test]
    fn forgets_and_adapts_to_a_new_law() {
        let mut p = PrefillPredictor::new([0.0, 0.0, 0.0], 1).with_half_life(100.0);
        let mut rng = SmallRng::seed_from_u64(11);
        for _ in 0..1000 {
            let e = rng.random_range(100..8000);
            p.observe(e, 0, law(e, 0));
        }
        assert!(close(p.predict(4000, 0), law(4000, 0), 0.01));
        // The fleet gets twice as slow.
        for _ in 0..2000 {
            let e = rng.random_range(100..8000);
            p.observe(e, 0, 2 * law(e, 0));
        }
        assert!(close(p.predict(4000, 0), 2 * law(4000, 0), 0.02));
    }

    #[test]
    fn degenerate_constant_features_stay_sane() {
        let mut p = PrefillPredictor::new([2_000.0, 50.0, 2.0], 4);
        for _ in 0..500 {
            p.observe(1000, 0, 30_000);
        }
        // At the observed point: the observed duration.
        assert!(
            close(p.predict(1000, 0), 30_000, 0.01),
            "{}",
            p.predict(1000, 0)
        );
        // Elsewhere: finite, >= 1, and bounded.
        for (e, k) in [
            (0, 0),
            (1, 0),
            (100_000, 0),
            (1000, 50_000),
            (u32::MAX, u32::MAX),
        ] {
            let v = p.predict(e, k);
            assert!((1..=MAX_PREDICTED_US).contains(&v), "({e},{k}) -> {v}");
        }
        // cached never observed → its coefficient stays at the prior (2 µs/token).
        let d = p.predict(1000, 1000) as i64 - p.predict(1000, 0) as i64;
        assert!((d - 2000).abs() <= 2, "cached slope {d}");
    }

    #[test]
    fn never_below_one_or_nan() {
        let mut p = PrefillPredictor::new([f64::NAN, -5.0, f64::INFINITY], 0);
        assert_eq!(p.predict(0, 0), 1);
        assert_eq!(p.predict(100_000, 100_000), 1);
        // Zero durations and extreme inputs.
        for i in 0..100u32 {
            p.observe(i * 1000, u32::MAX - i, 0);
            p.observe(u32::MAX, 0, u64::MAX);
        }
        for (e, k) in [(0, 0), (5, 5), (u32::MAX, 0), (0, u32::MAX)] {
            let v = p.predict(e, k);
            assert!((1..=MAX_PREDICTED_US).contains(&v), "{v}");
        }
        assert!(p.theta.iter().all(|t| t.is_finite()));
    }
}
