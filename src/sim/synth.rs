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

use super::SimRequest;
use crate::hash::sequence_hashes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Token ids are drawn from `0..VOCAB` (a Llama-3-sized vocabulary).
const VOCAB: u32 = 128_000;

/// An inclusive range of lengths, drawn uniformly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LenRange {
    pub min: u32,
    pub max: u32,
}

impl LenRange {
    /// A range holding one value.
    pub fn fixed(v: u32) -> LenRange {
        LenRange { min: v, max: v }
    }

    fn draw(&self, rng: &mut SmallRng) -> u32 {
        rng.random_range(self.min..=self.max.max(self.min))
    }

    fn mean(&self) -> f64 {
        (self.min as f64 + self.max as f64) / 2.0
    }
}

/// Parameters of a synthetic workload (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SynthSpec {
    /// Seed of every random choice. Default 0.
    pub seed: u64,
    /// Requests to generate. Default 1,000.
    pub requests: usize,
    /// Mean arrivals per second (Poisson). Default 5.
    pub rate_per_s: f64,
    /// Router block size used for the hashes. Default 128.
    pub block_size: u32,
    /// Shared-prefix groups (0 = no shared prefix). Default 8.
    pub groups: u32,
    /// Tokens of each group's shared prefix. Default 2,048.
    pub prefix_tokens: u32,
    /// Unique tokens after the prefix in a session's first prompt. Default 256..=2,048.
    pub suffix_tokens: LenRange,
    /// Output tokens per request. Default 64..=512.
    pub output_tokens: LenRange,
    /// Turns per session (1 = single-turn). Default 1..=1.
    pub turns: LenRange,
    /// New user tokens per follow-up turn. Default 64..=512.
    pub user_tokens: LenRange,
    /// Longest prompt a session may grow to. Default 32,768.
    pub max_input_tokens: u32,
    /// Most sessions open at once. Default 64.
    pub max_open_sessions: usize,
    /// Requests per burst of a fresh shared prefix (1 = no bursts). Default 1.
    pub burst_size: u32,
    /// A burst's requests arrive within this many ms of its start. Default 100.
    pub burst_window_ms: u32,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            seed: 0,
            requests: 1_000,
            rate_per_s: 5.0,
            block_size: crate::hash::DEFAULT_BLOCK_SIZE as u32,
            groups: 8,
            prefix_tokens: 2_048,
            suffix_tokens: LenRange {
                min: 256,
                max: 2_048,
            },
            output_tokens: LenRange { min: 64, max: 512 },
            turns: LenRange::fixed(1),
            user_tokens: LenRange { min: 64, max: 512 },
            max_input_tokens: 32_768,
            max_open_sessions: 64,
            burst_size: 1,
            burst_window_ms: 100,
        }
    }
}

impl SynthSpec {
    /// Rejects specs that cannot generate: bad rate or block size, inverted ranges,
    /// zero turns, first prompts that could exceed `max_input_tokens`.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.rate_per_s.is_finite() && self.rate_per_s > 0.0) {
            return Err("rate_per_s must be > 0".into());
        }
        if self.block_size == 0 || self.block_size as usize > crate::hash::MAX_BLOCK_SIZE {
            return Err(format!(
                "block_size must be 1..={}",
                crate::hash::MAX_BLOCK_SIZE
            ));
        }
        let ranges = [
            ("suffix_tokens", self.suffix_tokens),
            ("output_tokens", self.output_tokens),
            ("turns", self.turns),
            ("user_tokens", self.user_tokens),
        ];
        for (name, r) in ranges {
            if r.min > r.max {
                return Err(format!("{name}: min > max"));
            }
        }
        if self.turns.min == 0 {
            return Err("turns.min must be >= 1".into());
        }
        if self.max_open_sessions == 0 {
            return Err("max_open_sessions must be >= 1".into());
        }
        let first_max = self.prefix_tokens as u64 + self.suffix_tokens.max as u64;
        if first_max > self.max_input_tokens as u64 {
            return Err("prefix_tokens + suffix_tokens.max exceeds max_input_tokens".into());
        }
        Ok(())
    }
}

struct Session {
    id: u64,
    tokens: Vec<u32>,
    last_output: u32,
    turns_left: u32,
}

fn random_tokens(rng: &mut SmallRng, n: u32, out: &mut Vec<u32>) {
    out.extend((0..n).map(|_| rng.random_range(0..VOCAB)));
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
