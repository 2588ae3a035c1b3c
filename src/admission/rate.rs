//! Token buckets in their GCRA form (the generic cell rate algorithm): one word of state
//! per bucket, its *theoretical arrival time* `tat` (µs), instead of a token count and
//! a refill timestamp (docs/POLICIES.md "Tenants").
//!
//! A bucket of `burst` units refilled at `per_s` units per second holds
//! `burst − (tat − now) × per_s / 1e6` units at `now`; `tat ≤ now` is a full bucket,
//! the state of a bucket never used, so an idle bucket can be forgotten without
//! changing any answer. Taking `n` units moves `tat` to `max(tat, now) + n / per_s`
//! and is allowed when the bucket then owes at most `burst` units. A request larger
//! than the whole bucket (a prompt longer than one burst of tokens) passes only when
//! the bucket is full, and leaves it in debt for the excess: large requests are slowed
//! to the rate, never locked out.
//!
//! Why not the `governor` crate (the usual GCRA implementation): its limiters read a
//! clock themselves, while these are pure (time passed in, as the simulator and tests
//! need), and its keyed limiter's map grows with every key until pruned, while the
//! tenant table here must stay bounded on its own (`tenant`). The algorithm is these
//! thirty lines.
//!
//! Guarantees: no panic and no overflow for any rate, cost or time (saturating,
//! non-finite inputs treated as "no capacity"); over any interval of length `d` a
//! bucket admits at most `burst + d × per_s` units, plus one oversized request.

/// A bucket's rate and size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    /// Units refilled per second (> 0).
    pub per_s: f64,
    /// Units the bucket holds when full (at least 1).
    pub burst: f64,
}

impl Rate {
    /// `per_s` units per second, a bucket of `burst_ms` worth of them (at least one
    /// unit).
    pub fn new(per_s: f64, burst_ms: u64) -> Rate {
        Rate {
            per_s,
            burst: (per_s * burst_ms as f64 / 1000.0).max(1.0),
        }
    }

    /// µs one unit takes to refill.
    fn interval_us(&self) -> f64 {
        if self.per_s == f64::INFINITY {
            0.0
        } else if self.per_s > 0.0 {
            1e6 / self.per_s
        } else {
            f64::INFINITY // zero, negative or NaN: nothing refills
        }
    }
}

/// One bucket's state (see the module docs). `Default` is a full bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    tat_us: u64,
}

fn to_us(v: f64) -> u64 {
    if v.is_nan() {
        u64::MAX
    } else {
        v.clamp(0.0, u64::MAX as f64) as u64
    }
}

impl Bucket {
    /// The theoretical arrival time, µs (≤ now: the bucket is full).
    pub fn tat_us(&self) -> u64 {
        self.tat_us
    }

    /// Whether the bucket is full at `now_us` (forgetting it changes nothing).
    pub fn is_full(&self, now_us: u64) -> bool {
        self.tat_us <= now_us
    }

    /// What taking `n` units at `now_us` would leave: `Ok(new state)` to commit, or
    /// `Err(µs)` until it would be allowed.
    pub fn try_take(&self, rate: &Rate, n: u64, now_us: u64) -> Result<Bucket, u64> {
        let t = rate.interval_us();
        if t == 0.0 {
            return Ok(*self); // an infinite rate
        }
        if t.is_infinite() {
            return Err(u64::MAX); // a rate of zero (or NaN): nothing ever refills
        }
        let cap_us = rate.burst * t;
        let base = self.tat_us.max(now_us);
        let cost_us = n as f64 * t;
        let new = base as f64 + cost_us;
        let owed = new - now_us as f64;
        if owed <= cap_us || (self.is_full(now_us) && cost_us > cap_us && cost_us.is_finite()) {
            return Ok(Bucket { tat_us: to_us(new) });
        }
        if cost_us > cap_us {
            // Oversized: it waits for the bucket to be full.
            return Err(self.tat_us.saturating_sub(now_us).max(1));
        }
        Err(to_us((owed - cap_us).ceil()).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_full_bucket_gives_its_burst_then_the_rate() {
        let r = Rate::new(10.0, 1000); // 10 per s, bucket of 10
        let mut b = Bucket::default();
        for _ in 0..10 {
            b = b.try_take(&r, 1, 0).unwrap();
        }
        assert_eq!(b.try_take(&r, 1, 0), Err(100_000));
        b = b.try_take(&r, 1, 100_000).unwrap();
        assert!(b.try_take(&r, 1, 100_000).is_err());
        assert!(!b.is_full(100_000));
        assert!(b.is_full(1_100_000));
    }

    #[test]
    fn an_oversized_request_passes_on_a_full_bucket_and_leaves_debt() {
        let r = Rate::new(1000.0, 1000); // 1000 tokens/s, bucket 1000
        let b = Bucket::default().try_take(&r, 5000, 0).unwrap();
        assert_eq!(b.tat_us(), 5_000_000);
        assert_eq!(b.try_take(&r, 1, 1_000_000), Err(3_001_000));
        assert_eq!(b.try_take(&r, 5000, 1_000_000), Err(4_000_000));
        assert!(b.try_take(&r, 5000, 5_000_000).is_ok());
    }

    #[test]
    fn degenerate_rates_admit_nothing_and_never_panic() {
        for per_s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let r = Rate::new(per_s, 1000);
            let b = Bucket::default();
            let got = b.try_take(&r, 1, 5);
            if per_s == f64::INFINITY {
                assert!(got.is_ok());
            } else {
                assert!(got.is_err(), "{per_s}: {got:?}");
            }
        }
        let r = Rate::new(1e-9, 0);
        assert!(Bucket::default().try_take(&r, u64::MAX, u64::MAX).is_ok());
    }

    proptest! {
        /// Over any run of calls, what a bucket admits is at most its burst plus the
        /// rate times the time elapsed, plus one oversized request.
        #[test]
        fn admits_no_more_than_burst_plus_rate(
            per_s in 1.0f64..1000.0,
            burst_ms in 0u64..3000,
            calls in prop::collection::vec((0u64..200_000, 1u64..50), 1..200),
        ) {
            let r = Rate::new(per_s, burst_ms);
            let mut b = Bucket::default();
            let mut now = 0u64;
            let mut taken = 0f64;
            let mut oversized = 0f64;
            for &(dt, n) in &calls {
                now += dt;
                if let Ok(nb) = b.try_take(&r, n, now) {
                    if n as f64 > r.burst {
                        oversized = oversized.max(n as f64);
                    }
                    b = nb;
                    taken += n as f64;
                }
            }
            let bound = r.burst + now as f64 * per_s / 1e6 + oversized + 1e-6;
            prop_assert!(taken <= bound, "took {taken} > {bound}");
        }
    }
}
