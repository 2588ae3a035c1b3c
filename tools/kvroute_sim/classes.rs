//! Two priority classes and a TTFT goodput for `kvroute-sim replay`: a share of the
//! requests (chosen by their index, deterministically, so every run sends the same
//! ones) carries the body field `priority` (vLLM's: a lower value is served first),
//! and the report gives each class's TTFT distribution and the requests answered
//! within a TTFT SLO. Used by `tools/policies_bench.sh` (docs/POLICIES.md).

use clap::Args;
use serde_json::{json, Value};

#[derive(Args, Debug, Clone)]
pub struct ClassArgs {
    /// Share of the requests sent with `"priority": --high-priority` (0 to 1; the rest
    /// carry no priority field). Which ones depends only on their index in the trace.
    #[arg(long, default_value_t = 0.0)]
    high_priority_share: f64,
    /// The `priority` value of the high class (vLLM's convention: lower first).
    #[arg(long, default_value_t = -10, allow_hyphen_values = true)]
    high_priority: i64,
    /// TTFT SLO in ms: the report counts the requests answered within it (goodput).
    #[arg(long)]
    ttft_slo_ms: Option<f64>,
}

impl ClassArgs {
    /// Rejects a share outside [0, 1] and a negative or non-finite SLO.
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.high_priority_share) {
            return Err("--high-priority-share must be in [0, 1]".into());
        }
        if self
            .ttft_slo_ms
            .is_some_and(|s| !(s.is_finite() && s >= 0.0))
        {
            return Err("--ttft-slo-ms must be >= 0".into());
        }
        Ok(())
    }

    /// Whether request `i` of the trace is in the high class.
    pub fn is_high(&self, i: usize) -> bool {
        let x = kvroute::hash::mix_external_id(0x5EED_0000 ^ i as u64) % 1_000_000;
        (x as f64) < self.high_priority_share * 1e6
    }

    /// Marks request `i`'s body with the high class's priority if it is in it.
    pub fn mark(&self, i: usize, body: &mut Value) {
        if self.is_high(i) {
            body["priority"] = json!(self.high_priority);
        }
    }

    /// The classes' part of the report from each request's (ok, TTFT µs), in trace
    /// order; `dist` summarises TTFTs in ms.
    pub fn report(&self, samples: &[(bool, u64)], dist: fn(&mut [u64]) -> Value) -> Value {
        let class = |high: bool| {
            let of: Vec<(bool, u64)> = samples
                .iter()
                .enumerate()
                .filter(|(i, _)| self.is_high(*i) == high)
                .map(|(_, s)| *s)
                .collect();
            let mut ttft: Vec<u64> = of.iter().filter(|s| s.0).map(|s| s.1).collect();
            json!({
                "requests": of.len(),
                "ok": ttft.len(),
                "within_slo": self.within(&of),
                "ttft_ms": dist(&mut ttft),
            })
        };
        json!({
            "high_priority": self.high_priority,
            "high_priority_share": self.high_priority_share,
            "ttft_slo_ms": self.ttft_slo_ms,
            "goodput": self.within(samples),
            "high": class(true),
            "low": class(false),
        })
    }

    /// Requests answered with a TTFT within the SLO (`null` without one).
    fn within(&self, samples: &[(bool, u64)]) -> Value {
        match self.ttft_slo_ms {
            Some(slo) => {
                let slo_us = (slo * 1000.0) as u64;
                json!(samples.iter().filter(|s| s.0 && s.1 <= slo_us).count())
            }
            None => Value::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_picks_about_that_many_the_same_each_time() {
        let c = ClassArgs {
            high_priority_share: 0.2,
            high_priority: -10,
            ttft_slo_ms: Some(100.0),
        };
        let n = (0..10_000).filter(|&i| c.is_high(i)).count();
        assert!((1_800..2_200).contains(&n), "{n}");
        let mut b = json!({});
        let i = (0..100).find(|&i| c.is_high(i)).unwrap();
        c.mark(i, &mut b);
        assert_eq!(b["priority"], -10);
        let r = c.report(&[(true, 50_000), (true, 200_000), (false, 0)], |v| {
            json!(v.len())
        });
        assert_eq!(r["goodput"], 1);
    }
}
