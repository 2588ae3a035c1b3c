//! Per-worker load aggregates: the additive numbers one tracker publishes, and the final
//! view scoring reads after combining cores and applying the prefill load model.
//!
//! Guarantees:
//! - every field of [`WorkerAgg`] except `oldest_prefill` is a plain sum, so summing the
//!   aggregates of every core's tracker gives the fleet-wide numbers for a worker;
//! - `oldest_prefill` is not additive: [`WorkerAgg::add`] keeps the older of the two, which
//!   is exactly the oldest active prefill across the combined trackers;
//! - [`WorkerAgg::load`] never returns negative or non-finite numbers.

use crate::config::PrefillLoadModel;

/// The earliest-routed request still in prefill on a worker (DESIGN §1, `predicted`
/// prefill load model). Its tokens are part of [`WorkerAgg::prefill_tokens`]; the model
/// lets only this request's share decay while it is being processed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OldestPrefill {
    /// When the request was routed (µs, caller's clock).
    pub started_us: u64,
    /// Its effective ISL (input tokens not covered by the prefill worker's cache).
    pub tokens: u64,
    /// Predicted prefill duration (µs, always >= 1).
    pub predicted_us: u64,
}

impl OldestPrefill {
    /// Tokens of this prefill still to be processed at `now_us`: they decay linearly from
    /// `tokens` at `started_us` to 0 at `started_us + predicted_us`. A clock earlier than
    /// `started_us` (skew between cores) counts as no progress.
    pub fn remaining_tokens(&self, now_us: u64) -> f64 {
        let elapsed = now_us.saturating_sub(self.started_us) as f64;
        let predicted = self.predicted_us.max(1) as f64;
        let frac = (1.0 - elapsed / predicted).clamp(0.0, 1.0);
        self.tokens as f64 * frac
    }
}

/// Additive per-worker numbers of one tracker (sum across cores = fleet view).
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct WorkerAgg {
    /// Requests whose decode (or aggregated) worker is this worker.
    pub active_requests: u32,
    /// Requests in prefill on this worker (routed, no first token yet).
    pub prefill_requests: u32,
    /// Σ effective ISL of the requests in prefill on this worker.
    pub prefill_tokens: u64,
    /// Σ prompt blocks of the active requests decoding on this worker (with
    /// multiplicity: shared prefixes count once per request).
    pub blocks_total: u64,
    /// Σ weighted output placeholder blocks × 1000 (only with `track_output_blocks`).
    pub output_blocks_milli: u64,
    /// Earliest-routed request still in prefill here; maintained only under the
    /// `predicted` prefill load model (`None` under `full`). Not additive.
    pub oldest_prefill: Option<OldestPrefill>,
}

/// Final view of a worker's load used by scoring, after combining cores and applying
/// the prefill load model.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct WorkerLoad {
    /// In-flight requests decoding on the worker.
    pub active_requests: u32,
    /// Prompt-side tokens still to be prefilled (decayed under `predicted`).
    pub prefill_tokens: f64,
    /// Prompt KV blocks of the active requests.
    pub blocks_total: f64,
    /// Weighted output placeholder blocks.
    pub output_blocks: f64,
}

impl WorkerAgg {
    /// Combines another core's aggregate for the same worker into this one: sums every
    /// additive field (saturating, so a corrupt reader can never wrap) and keeps the older
    /// of the two oldest prefills (ties: the one with more tokens, so the result does not
    /// depend on the order in which cores are added).
    pub fn add(&mut self, other: &WorkerAgg) {
        self.active_requests = self.active_requests.saturating_add(other.active_requests);
        self.prefill_requests = self.prefill_requests.saturating_add(other.prefill_requests);
        self.prefill_tokens = self.prefill_tokens.saturating_add(other.prefill_tokens);
        self.blocks_total = self.blocks_total.saturating_add(other.blocks_total);
        self.output_blocks_milli = self
            .output_blocks_milli
            .saturating_add(other.output_blocks_milli);
        self.oldest_prefill = match (self.oldest_prefill, other.oldest_prefill) {
            (Some(a), Some(b)) => Some(older(a, b)),
            (a, None) => a,
            (None, b) => b,
        };
    }

    /// True when nothing is accounted on the worker.
    pub fn is_zero(&self) -> bool {
        *self == WorkerAgg::default()
    }

    /// Applies the prefill load model at `now_us`.
    ///
    /// `Full`: `prefill_tokens` as is. `Predicted`: the oldest prefill's tokens decay
    /// linearly to 0 over its predicted duration; every other prefill still counts in
    /// full (it is queued behind the oldest one).
    pub fn load(&self, model: PrefillLoadModel, now_us: u64) -> WorkerLoad {
        let full = self.prefill_tokens as f64;
        let prefill_tokens = match (model, self.oldest_prefill) {
            (PrefillLoadModel::Predicted, Some(o)) => {
                // The oldest's tokens are part of the sum; replace them by what is left.
                // Clamp to the sum so an inconsistent snapshot cannot inflate the load.
                let o = OldestPrefill {
                    tokens: o.tokens.min(self.prefill_tokens),
                    ..o
                };
                let others = (self.prefill_tokens - o.tokens) as f64;
                others + o.remaining_tokens(now_us)
            }
            _ => full,
        };
        WorkerLoad {
            active_requests: self.active_requests,
            prefill_tokens,
            blocks_total: self.blocks_total as f64,
            output_blocks: self.output_blocks_milli as f64 / 1000.0,
        }
    }
}

fn older(a: OldestPrefill, b: OldestPrefill) -> OldestPrefill {
    if (b.started_us, std::cmp::Reverse(b.tokens)) < (a.started_us, std::cmp::Reverse(a.tokens)) {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agg(prefill_tokens: u64, oldest: Option<(u64, u64, u64)>) -> WorkerAgg {
        WorkerAgg {
            active_requests: 2,
            prefill_requests: 1,
            prefill_tokens,
            blocks_total: 10,
            output_blocks_milli: 1500,
            oldest_prefill: oldest.map(|(s, t, p)| OldestPrefill {
                started_us: s,
                tokens: t,
                predicted_us: p,
            }),
        }
    }

    #[test]
    fn add_sums_and_keeps_oldest() {
        let mut a = agg(100, Some((50, 40, 1000)));
        let b = agg(300, Some((20, 200, 500)));
        a.add(&b);
        assert_eq!(a.active_requests, 4);
        assert_eq!(a.prefill_requests, 2);
        assert_eq!(a.prefill_tokens, 400);
        assert_eq!(a.blocks_total, 20);
        assert_eq!(a.output_blocks_milli, 3000);
        assert_eq!(a.oldest_prefill.map(|o| o.started_us), Some(20));
        // Order of combination does not matter.
        let mut c = agg(300, Some((20, 200, 500)));
        c.add(&agg(100, Some((50, 40, 1000))));
        assert_eq!(a, c);
        // None on either side.
        let mut d = WorkerAgg::default();
        d.add(&b);
        assert_eq!(d, b);
        let mut e = b;
        e.add(&WorkerAgg::default());
        assert_eq!(e, b);
    }

    #[test]
    fn add_saturates() {
        let mut a = WorkerAgg {
            prefill_tokens: u64::MAX - 1,
            active_requests: u32::MAX,
            ..Default::default()
        };
        a.add(&a.clone());
        assert_eq!(a.prefill_tokens, u64::MAX);
        assert_eq!(a.active_requests, u32::MAX);
    }

    #[test]
    fn full_model_ignores_oldest() {
        let a = agg(1000, Some((0, 600, 100)));
        let l = a.load(PrefillLoadModel::Full, 1_000_000);
        assert_eq!(l.prefill_tokens, 1000.0);
        assert_eq!(l.blocks_total, 10.0);
        assert_eq!(l.output_blocks, 1.5);
        assert_eq!(l.active_requests, 2);
    }

    #[test]
    fn predicted_model_decays_oldest_linearly() {
        // 1000 tokens in prefill, of which the oldest has 600 predicted to take 400 µs
        // from t=100.
        let a = agg(1000, Some((100, 600, 400)));
        let at = |t| a.load(PrefillLoadModel::Predicted, t).prefill_tokens;
        assert_eq!(at(0), 1000.0); // clock before start: no progress
        assert_eq!(at(100), 1000.0);
        assert_eq!(at(200), 400.0 + 450.0); // 1/4 elapsed
        assert_eq!(at(300), 400.0 + 300.0); // half
        assert_eq!(at(400), 400.0 + 150.0);
        assert_eq!(at(500), 400.0); // done, the rest counts in full
        assert_eq!(at(10_000), 400.0);
        // Without an oldest prefill the predicted model is the full one.
        assert_eq!(
            agg(70, None)
                .load(PrefillLoadModel::Predicted, 5)
                .prefill_tokens,
            70.0
        );
    }

    #[test]
    fn predicted_model_never_negative_on_inconsistent_input() {
        // An oldest prefill larger than the sum (inconsistent reader snapshot).
        let a = agg(10, Some((0, 600, 0)));
        let l = a.load(PrefillLoadModel::Predicted, 0);
        assert_eq!(l.prefill_tokens, 10.0);
        assert_eq!(a.load(PrefillLoadModel::Predicted, 5).prefill_tokens, 0.0);
    }
}
