//! Bursty synthetic load: groups of requests sharing a prefix nobody has seen yet,
//! arriving together.
//!
//! Bursts start as a Poisson process of `rate_per_s / burst_size` (so requests still
//! arrive at `rate_per_s` on average). Each burst draws a fresh prefix of
//! `prefix_tokens` random tokens; its `burst_size` requests arrive at independent
//! uniform offsets in `[0, burst_window_ms]` from its start, each with that prefix and
//! its own unique suffix (`suffix_tokens`) and output length (`output_tokens`).
//! Requests are single-turn; `groups`, `turns`, `user_tokens` and sessions do not
//! apply. Output is in arrival order with ids `syn-N` in that order; the same spec and
//! seed always give the same workload.

use super::spec::{random_tokens, SynthSpec};
use crate::hash::sequence_hashes;
use crate::sim::SimRequest;
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
