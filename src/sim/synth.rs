//! Seeded synthetic workloads: shared-prefix groups, multi-turn sessions, Poisson
//! arrivals.
//!
//! Prompts are real token-id sequences hashed with the router's own scheme
//! ([`crate::hash::sequence_hashes`]), so prefix sharing is exact:
//! - a new session's first prompt = the prefix of one of `groups` groups (`prefix_tokens`
//!   tokens, e.g. a system prompt; group chosen uniformly) + a unique suffix;
//! - a follow-up turn's prompt = the previous prompt + the previous output (random
//!   token ids standing for the model's answer) + `user_tokens` new tokens;
//! - arrivals form a Poisson process of `rate_per_s`; each arrival starts a new
//!   session with probability `1 / mean(turns)` (always while no session is open, never
//!   while `max_open_sessions` are open) and otherwise continues an open session picked
//!   uniformly. A session closes after its drawn number of turns, or when its next
//!   prompt would exceed `max_input_tokens` (that arrival starts a new session).
//!
//! Lengths are drawn uniformly from inclusive [`LenRange`]s. The same spec and seed
//! always give the same workload.
//!
//! With `burst_size > 1` the load is bursty instead (see [`burst`]): bursts of
//! `burst_size` requests sharing a *fresh* prefix arrive together, within
//! `burst_window_ms` — the load that speculative indexing is for.

mod burst;
mod spec;

use super::SimRequest;
use crate::hash::sequence_hashes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use spec::random_tokens;
pub use spec::{LenRange, SynthSpec};

struct Session {
    id: u64,
    tokens: Vec<u32>,
    last_output: u32,
    turns_left: u32,
}

/// Generates the workload described by `spec`, in arrival order.
pub fn generate(spec: &SynthSpec) -> Result<Vec<SimRequest>, String> {
    spec.validate()?;
    if spec.burst_size > 1 {
        return Ok(burst::generate(spec));
    }
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    let prefixes: Vec<Vec<u32>> = (0..spec.groups)
        .map(|_| {
            let mut p = Vec::with_capacity(spec.prefix_tokens as usize);
            random_tokens(&mut rng, spec.prefix_tokens, &mut p);
            p
        })
        .collect();
    let p_new = 1.0 / spec.turns.mean();
    let mut open: Vec<Session> = Vec::new();
    let mut next_session = 0u64;
    let mut t_s = 0.0f64;
    let mut out = Vec::with_capacity(spec.requests);
    for n in 0..spec.requests {
        // Exponential inter-arrival time; 1 - u is in (0, 1], so ln is finite.
        let u: f64 = rng.random();
        t_s += -(1.0 - u).ln() / spec.rate_per_s;
        let mut slot = None;
        let full = open.len() >= spec.max_open_sessions;
        if !open.is_empty() && (full || rng.random::<f64>() >= p_new) {
            let i = rng.random_range(0..open.len());
            let user = spec.user_tokens.draw(&mut rng);
            let s = &open[i];
            let grown = s.tokens.len() as u64 + s.last_output as u64 + user as u64;
            if grown <= spec.max_input_tokens as u64 {
                let s = &mut open[i];
                let answer = s.last_output;
                random_tokens(&mut rng, answer, &mut s.tokens);
                random_tokens(&mut rng, user, &mut s.tokens);
                slot = Some(i);
            } else {
                open.swap_remove(i);
            }
        }
        let i = match slot {
            Some(i) => i,
            None => {
                let mut tokens = match spec.groups {
                    0 => Vec::new(),
                    g => prefixes[rng.random_range(0..g) as usize].clone(),
                };
                let suffix = spec.suffix_tokens.draw(&mut rng);
                random_tokens(&mut rng, suffix, &mut tokens);
                open.push(Session {
                    id: next_session,
                    tokens,
                    last_output: 0,
                    turns_left: spec.turns.draw(&mut rng),
                });
                next_session += 1;
                open.len() - 1
            }
        };
        let output = spec.output_tokens.draw(&mut rng);
        let s = &mut open[i];
        out.push(SimRequest {
            id: format!("syn-{n}"),
            arrival_us: (t_s * 1e6).round() as u64,
            input_tokens: u32::try_from(s.tokens.len()).unwrap_or(u32::MAX),
            output_tokens: output,
            hashes: sequence_hashes(&s.tokens, spec.block_size as usize),
            session: Some(s.id),
        });
        s.last_output = output;
        s.turns_left = s.turns_left.saturating_sub(1);
        if s.turns_left == 0 {
            open.swap_remove(i);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
