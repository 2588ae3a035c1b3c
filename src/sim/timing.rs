//! The simulated workers' time model.
//!
//! - Prefill of a request: `prefill_us = a + b·uncached + c·uncached·input / 1000`
//!   where `uncached = input_tokens − cached_tokens`. `b` is the per-token cost of the
//!   linear layers, `c` the attention term that grows with context length (0 turns it
//!   off).
//! - Decode runs in continuous batches: one step costs `step_us = d + e·batch_size` and
//!   yields one token for every running request.
//! - CPU workers multiply every duration by `cpu_slowdown`.
//! - `jitter` (default 0) scales each duration by a factor drawn uniformly from
//!   `[1 − jitter, 1 + jitter]` from the run's seeded generator, so runs differ across
//!   seeds but are reproducible for one seed.
//!
//! Defaults describe a mid-range datacenter GPU serving an ~8B model (A10G/L40S
//! class): prefill ≈ 16k tokens/s plus 2 ms of overhead, a decode step of 12 ms at
//! batch 1 growing by 0.15 ms per running sequence, at most 64 running sequences, and a
//! CPU worker 8× slower (the router's default `cuda_to_cpu_ratio`).

use crate::types::DeviceClass;
use serde::{Deserialize, Serialize};

/// Parameters of the time model (all µs unless stated). See the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimingModel {
    /// `a`: fixed cost of one prefill. Default 2,000 µs.
    pub prefill_base_us: f64,
    /// `b`: cost per uncached prompt token. Default 60 µs (≈ 16.7k tokens/s).
    pub prefill_us_per_token: f64,
    /// `c`: attention term, µs per (uncached token × thousand prompt tokens).
    /// Default 1.0 (adds 64 ms to an uncached 8k-token prompt).
    pub prefill_attention_us: f64,
    /// `d`: fixed cost of one decode step. Default 12,000 µs.
    pub decode_step_base_us: f64,
    /// `e`: cost per running sequence in a decode step. Default 150 µs.
    pub decode_us_per_seq: f64,
    /// Most sequences decoding at once on one worker. Default 64.
    pub max_batch: u32,
    /// Multiplier of every duration on CPU workers. Default 8.0.
    pub cpu_slowdown: f64,
    /// Relative random variation of each duration, in [0, 1). Default 0.
    pub jitter: f64,
}

impl Default for TimingModel {
    fn default() -> Self {
        TimingModel {
            prefill_base_us: 2_000.0,
            prefill_us_per_token: 60.0,
            prefill_attention_us: 1.0,
            decode_step_base_us: 12_000.0,
            decode_us_per_seq: 150.0,
            max_batch: 64,
            cpu_slowdown: 8.0,
            jitter: 0.0,
        }
    }
}

impl TimingModel {
    /// Rejects negative or non-finite parameters, `max_batch = 0`, a slowdown below
    /// 1 and a jitter outside [0, 1).
    pub fn validate(&self) -> Result<(), String> {
        let fields = [
            ("prefill_base_us", self.prefill_base_us),
            ("prefill_us_per_token", self.prefill_us_per_token),
            ("prefill_attention_us", self.prefill_attention_us),
            ("decode_step_base_us", self.decode_step_base_us),
            ("decode_us_per_seq", self.decode_us_per_seq),
        ];
        for (name, v) in fields {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("timing.{name} must be finite and >= 0 (got {v})"));
            }
        }
        if self.max_batch == 0 {
            return Err("timing.max_batch must be > 0".into());
        }
        if !(self.cpu_slowdown.is_finite() && self.cpu_slowdown >= 1.0) {
            return Err("timing.cpu_slowdown must be >= 1".into());
        }
        if !(self.jitter.is_finite() && (0.0..1.0).contains(&self.jitter)) {
            return Err("timing.jitter must be in [0, 1)".into());
        }
        Ok(())
    }

    fn device_factor(&self, device: DeviceClass) -> f64 {
        match device {
            DeviceClass::Gpu => 1.0,
            DeviceClass::Cpu => self.cpu_slowdown,
        }
    }

    /// Prefill duration of a prompt of `input_tokens` of which `cached_tokens` are
    /// already in the cache, before jitter. At least 1 µs so time always advances.
    pub fn prefill_us(&self, input_tokens: u32, cached_tokens: u32, device: DeviceClass) -> u64 {
        let uncached = input_tokens.saturating_sub(cached_tokens) as f64;
        let us = self.prefill_base_us
            + self.prefill_us_per_token * uncached
            + self.prefill_attention_us * uncached * input_tokens as f64 / 1000.0;
        to_us(us * self.device_factor(device))
    }

    /// Duration of one decode step over `batch` running sequences, before jitter.
    /// At least 1 µs.
    pub fn decode_step_us(&self, batch: usize, device: DeviceClass) -> u64 {
        let us = self.decode_step_base_us + self.decode_us_per_seq * batch as f64;
        to_us(us * self.device_factor(device))
    }

    /// Applies the jitter to `us`, given a uniform draw `u` in [0, 1).
    pub fn jittered(&self, us: u64, u: f64) -> u64 {
        if self.jitter == 0.0 {
            return us;
        }
        to_us(us as f64 * (1.0 + self.jitter * (2.0 * u - 1.0)))
    }
}

fn to_us(us: f64) -> u64 {
    // Saturating float → int cast; NaN cannot occur after `validate`.
    (us.round() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_follows_the_formula() {
        let t = TimingModel::default();
        // 8,000 tokens, 2,000 cached: 2000 + 60·6000 + 1.0·6000·8000/1000.
        assert_eq!(
            t.prefill_us(8000, 2000, DeviceClass::Gpu),
            2000 + 360_000 + 48_000
        );
        // Fully cached: only the base cost; cached beyond input saturates.
        assert_eq!(t.prefill_us(1000, 5000, DeviceClass::Gpu), 2000);
        let cpu = t.prefill_us(8000, 2000, DeviceClass::Cpu);
        assert_eq!(cpu, 8 * (2000 + 360_000 + 48_000));
        let lin = TimingModel {
            prefill_attention_us: 0.0,
            ..t.clone()
        };
        assert_eq!(lin.prefill_us(1000, 0, DeviceClass::Gpu), 62_000);
    }

    #[test]
    fn decode_step_grows_with_batch_and_never_is_zero() {
        let t = TimingModel::default();
        assert_eq!(t.decode_step_us(1, DeviceClass::Gpu), 12_150);
        assert_eq!(t.decode_step_us(64, DeviceClass::Gpu), 12_000 + 9_600);
        assert_eq!(t.decode_step_us(10, DeviceClass::Cpu), 8 * 13_500);
        let zero = TimingModel {
            decode_step_base_us: 0.0,
            decode_us_per_seq: 0.0,
            ..t
        };
        assert_eq!(zero.decode_step_us(0, DeviceClass::Gpu), 1);
    }

    #[test]
    fn jitter_stays_in_range() {
        let t = TimingModel {
            jitter: 0.1,
            ..Default::default()
        };
        assert_eq!(t.jittered(1000, 0.0), 900);
        assert_eq!(t.jittered(1000, 0.5), 1000);
        assert!(t.jittered(1000, 0.999_999) <= 1100);
        assert_eq!(TimingModel::default().jittered(1234, 0.9), 1234);
    }

    #[test]
    fn validate_rejects_bad_values_and_toml_roundtrips() {
        TimingModel::default().validate().unwrap();
        let bad = [
            TimingModel {
                max_batch: 0,
                ..Default::default()
            },
            TimingModel {
                cpu_slowdown: 0.5,
                ..Default::default()
            },
            TimingModel {
                jitter: 1.0,
                ..Default::default()
            },
            TimingModel {
                prefill_us_per_token: f64::NAN,
                ..Default::default()
            },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
        let t: TimingModel = toml::from_str("max_batch = 8").unwrap();
        assert_eq!(t.max_batch, 8);
        assert_eq!(t.decode_step_base_us, 12_000.0);
    }
}
