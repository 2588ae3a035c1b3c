//! What a synthetic workload is made of: its description ([`SynthSpec`], lengths as
//! [`LenRange`]s) and the random token ids its prompts are drawn from. A leaf of
//! `synth`, shared by the steady generator and the bursty one (`burst`).

use rand::rngs::SmallRng;
use rand::Rng;
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

    pub(super) fn draw(&self, rng: &mut SmallRng) -> u32 {
        rng.random_range(self.min..=self.max.max(self.min))
    }

    pub(super) fn mean(&self) -> f64 {
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

pub(super) fn random_tokens(rng: &mut SmallRng, n: u32, out: &mut Vec<u32>) {
    out.extend((0..n).map(|_| rng.random_range(0..VOCAB)));
}
