//! Bursty synthetic load: groups of requests sharing a prefix nobody has seen yet,
//! arriving together (issue 15 item 5).
//!
//! Bursts start as a Poisson process of `rate_per_s / burst_size` (so requests still
//! arrive at `rate_per_s` on average). Each burst draws a fresh prefix of
//! `prefix_tokens` random tokens; its `burst_size` requests arrive at independent
//! uniform offsets in `[0, burst_window_ms]` from its start, each with that prefix and
//! its own unique suffix (`suffix_tokens`) and output length (`output_tokens`).
//! Requests are single-turn; `groups`, `turns`, `user_tokens` and sessions do not
//! apply. Output is in arrival order with ids `syn-N` in that order; the same spec and
//! seed always give the same workload.

use super::{random_tokens, SimRequest, SynthSpec};
use crate::hash::sequence_hashes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The bursty workload of `spec` (validated by the caller, `burst_size > 1`).
pub fn generate(spec: &SynthSpec) -> Vec<SimRequest> {
    let mut rng = SmallRng::seed_from_u64(spec.seed ^ 0x6275_7273_7400_0000);
    let size = spec.burst_size.max(1) as usize;
    let burst_rate = spec.rate_per_s / size as f64;
    let window_us = spec.burst_window_ms as f64 * 1e3;
    let mut out: Vec<SimRequest> = Vec::with_capacity(spec.requests);
    let mut t_s = 0.0f64;
    let mut burst = 0u64;
    while out.len() < spec.requests {
        let u: f64 = rng.random();
        t_s += -(1.0 - u).ln() / burst_rate;
        let mut prefix = Vec::with_capacity(spec.prefix_tokens as usize);
        random_tokens(&mut rng, spec.prefix_tokens, &mut prefix);
        for _ in 0..size.min(spec.requests - out.len()) {
            let mut tokens = prefix.clone();
            let suffix = spec.suffix_tokens.draw(&mut rng);
            random_tokens(&mut rng, suffix, &mut tokens);
            let offset_us = rng.random::<f64>() * window_us;
            out.push(SimRequest {
                id: String::new(),
                arrival_us: (t_s * 1e6 + offset_us).round() as u64,
                input_tokens: u32::try_from(tokens.len()).unwrap_or(u32::MAX),
                output_tokens: spec.output_tokens.draw(&mut rng),
                hashes: sequence_hashes(&tokens, spec.block_size as usize),
                session: Some(burst),
            });
        }
        burst += 1;
    }
    out.sort_by_key(|r| r.arrival_us);
    for (n, r) in out.iter_mut().enumerate() {
        r.id = format!("syn-{n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::synth::LenRange;

    #[test]
    fn bursts_share_a_fresh_prefix_and_arrive_together() {
        let spec = SynthSpec {
            requests: 400,
            rate_per_s: 20.0,
            burst_size: 8,
            burst_window_ms: 50,
            prefix_tokens: 1024,
            suffix_tokens: LenRange::fixed(256),
            ..Default::default()
        };
        let a = super::super::generate(&spec).unwrap();
        assert_eq!(a, super::super::generate(&spec).unwrap());
        assert_eq!(a.len(), 400);
        assert!(a.windows(2).all(|w| w[0].arrival_us <= w[1].arrival_us));
        assert_eq!(a[5].id, "syn-5");
        let mut by_burst: std::collections::HashMap<u64, Vec<&SimRequest>> = Default::default();
        for r in &a {
            by_burst
                .entry(r.session.unwrap_or(u64::MAX))
                .or_default()
                .push(r);
        }
        assert_eq!(by_burst.len(), 50);
        let mut first_blocks = std::collections::HashSet::new();
        for rs in by_burst.values() {
            assert_eq!(rs.len(), 8);
            // Same 8-block prefix, distinct suffixes.
            assert!(rs.iter().all(|r| r.hashes[..8] == rs[0].hashes[..8]));
            assert!(rs.iter().all(|r| r.hashes.len() == 10));
            assert_ne!(rs[0].hashes[8], rs[1].hashes[8]);
            let lo = rs.iter().map(|r| r.arrival_us).min().unwrap_or(0);
            let hi = rs.iter().map(|r| r.arrival_us).max().unwrap_or(0);
            assert!(hi - lo <= 50_000, "{lo}..{hi}");
            // Every burst's prefix is new.
            assert!(first_blocks.insert(rs[0].hashes[0]));
        }
    }
}
