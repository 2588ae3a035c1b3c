//! Conditional disaggregation: whether a disaggregated request should prefill on its
//! decode worker instead of a prefill worker (`local_prefill_max_uncached_tokens`,
//! `local_prefill_min_cached_fraction`; docs/POLICIES.md "Local prefill").
//!
//! A remote prefill costs a prefill leg, a KV transfer of every block the decode worker
//! lacks, and a wait in the prefill pool's queue. When the decode worker already holds
//! most of the prompt (a conversation's next turn), or little of the prompt is left to
//! compute, running the rest on the decode worker is cheaper: no transfer, no second
//! queue. The rule, on the decode worker the decode stage chose:
//! - `held` = its device + host overlap × `block_size`, at most the prompt (a disk tier
//!   block costs a load comparable to a transfer, and is not counted); 0 if the
//!   worker's index state is suspect;
//! - local if `prompt − held ≤ local_prefill_max_uncached_tokens` (when > 0), or if
//!   `held ≥ local_prefill_min_cached_fraction × prompt` (when set).
//!
//! Pure: a function of its inputs; no panics.

use super::decision::LocalPrefill;
use crate::config::RouterConfig;
use crate::types::Overlap;

/// The local-prefill decision for a prompt of `input_tokens` on a decode worker with
/// overlap `decode` (`suspect`: its index state is not trusted).
pub fn local_prefill(
    cfg: &RouterConfig,
    input_tokens: u32,
    decode: &Overlap,
    suspect: bool,
) -> Option<LocalPrefill> {
    let blocks = if suspect {
        0
    } else {
        u64::from(decode.device) + u64::from(decode.host)
    };
    let held = (blocks * u64::from(cfg.block_size)).min(u64::from(input_tokens));
    let uncached = u64::from(input_tokens) - held;
    let max = u64::from(cfg.local_prefill_max_uncached_tokens);
    if max > 0 && uncached <= max {
        return Some(LocalPrefill::Short);
    }
    match cfg.local_prefill_min_cached_fraction {
        Some(f) if input_tokens > 0 && held as f64 >= f * f64::from(input_tokens) => {
            Some(LocalPrefill::Cached)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ov(device: u32, host: u32, disk: u32) -> Overlap {
        Overlap {
            device,
            host,
            disk,
            shared: 0,
        }
    }

    fn cfg(max: u32, frac: Option<f64>) -> RouterConfig {
        RouterConfig {
            block_size: 16,
            local_prefill_max_uncached_tokens: max,
            local_prefill_min_cached_fraction: frac,
            ..Default::default()
        }
    }

    #[test]
    fn off_by_default() {
        let c = RouterConfig::default();
        assert_eq!(local_prefill(&c, 10, &ov(100, 0, 0), false), None);
        assert_eq!(local_prefill(&c, 0, &ov(0, 0, 0), false), None);
    }

    #[test]
    fn short_uncached_part() {
        let c = cfg(64, None);
        // 100 tokens, 3 device blocks (48) held: 52 uncached ≤ 64.
        assert_eq!(
            local_prefill(&c, 100, &ov(3, 0, 0), false),
            Some(LocalPrefill::Short)
        );
        // 2 blocks (32): 68 uncached.
        assert_eq!(local_prefill(&c, 100, &ov(2, 0, 0), false), None);
        // Host blocks count, disk blocks do not.
        assert_eq!(
            local_prefill(&c, 100, &ov(2, 1, 0), false),
            Some(LocalPrefill::Short)
        );
        assert_eq!(local_prefill(&c, 100, &ov(2, 0, 9), false), None);
        // A short prompt needs no cache at all.
        assert_eq!(
            local_prefill(&c, 64, &ov(0, 0, 0), false),
            Some(LocalPrefill::Short)
        );
        // A suspect worker holds nothing.
        assert_eq!(local_prefill(&c, 100, &ov(9, 0, 0), true), None);
    }

    #[test]
    fn cached_fraction() {
        let c = cfg(0, Some(0.5));
        assert_eq!(
            local_prefill(&c, 1000, &ov(32, 0, 0), false),
            Some(LocalPrefill::Cached)
        );
        assert_eq!(local_prefill(&c, 1000, &ov(31, 0, 0), false), None);
        // Overlap beyond the prompt (its last, partial block) is capped.
        assert_eq!(
            local_prefill(&c, 10, &ov(u32::MAX, u32::MAX, 0), false),
            Some(LocalPrefill::Cached)
        );
        assert_eq!(local_prefill(&c, 0, &ov(5, 0, 0), false), None);
        // Both rules: the short one is reported first.
        let both = cfg(1000, Some(0.5));
        assert_eq!(
            local_prefill(&both, 1000, &ov(63, 0, 0), false),
            Some(LocalPrefill::Short)
        );
    }
}
