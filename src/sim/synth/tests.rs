//! Tests of the synthetic workload generator.

use super::*;
use crate::sim::bound::hit_rate_bound;
use std::collections::HashMap;

#[test]
fn same_seed_same_workload() {
    let spec = SynthSpec {
        requests: 200,
        turns: LenRange { min: 1, max: 4 },
        ..Default::default()
    };
    let a = generate(&spec).unwrap();
    assert_eq!(a, generate(&spec).unwrap());
    let b = generate(&SynthSpec { seed: 1, ..spec }).unwrap();
    assert_ne!(a, b);
    assert!(a.windows(2).all(|w| w[0].arrival_us <= w[1].arrival_us));
    assert_eq!(a[17].id, "syn-17");
}

#[test]
fn arrivals_are_poisson_at_the_rate() {
    let spec = SynthSpec {
        requests: 4_000,
        rate_per_s: 20.0,
        prefix_tokens: 0,
        suffix_tokens: LenRange::fixed(16),
        ..Default::default()
    };
    let reqs = generate(&spec).unwrap();
    let gaps: Vec<f64> = reqs
        .windows(2)
        .map(|w| (w[1].arrival_us - w[0].arrival_us) as f64 / 1e6)
        .collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!((mean - 0.05).abs() < 0.005, "mean gap {mean}");
    // Exponential: the coefficient of variation is 1.
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    let cv = var.sqrt() / mean;
    assert!((cv - 1.0).abs() < 0.1, "cv {cv}");
}

#[test]
fn groups_share_exactly_their_prefix() {
    let spec = SynthSpec {
        requests: 300,
        groups: 3,
        prefix_tokens: 1_000, // 7 full blocks of 128 (896 tokens) are pure prefix
        suffix_tokens: LenRange { min: 200, max: 400 },
        ..Default::default()
    };
    let reqs = generate(&spec).unwrap();
    let mut by_first: HashMap<Vec<u64>, usize> = HashMap::new();
    for r in &reqs {
        assert!(r.input_tokens >= 1_200 && r.input_tokens <= 1_400);
        assert_eq!(r.hashes.len(), r.input_tokens as usize / 128);
        *by_first.entry(r.hashes[..7].to_vec()).or_insert(0) += 1;
    }
    assert_eq!(by_first.len(), 3, "one shared 7-block prefix per group");
    // Block 8 mixes prefix and a unique suffix: no two requests share it.
    let mut eighth: Vec<u64> = reqs.iter().map(|r| r.hashes[7]).collect();
    eighth.sort_unstable();
    eighth.dedup();
    assert_eq!(eighth.len(), reqs.len());
}

#[test]
fn follow_up_turns_extend_the_previous_prompt() {
    let spec = SynthSpec {
        requests: 500,
        groups: 0,
        turns: LenRange { min: 2, max: 6 },
        ..Default::default()
    };
    let reqs = generate(&spec).unwrap();
    let mut last: HashMap<u64, &SimRequest> = HashMap::new();
    let mut follow_ups = 0;
    for r in &reqs {
        let s = r.session.unwrap();
        if let Some(prev) = last.get(&s) {
            follow_ups += 1;
            let grown = r.input_tokens - prev.input_tokens - prev.output_tokens;
            assert!((64..=512).contains(&grown), "user tokens {grown}");
            assert_eq!(r.hashes[..prev.hashes.len()], prev.hashes[..]);
            assert!(r.input_tokens <= spec.max_input_tokens);
        }
        last.insert(s, r);
    }
    assert!(follow_ups > 250, "{follow_ups} follow-ups");
    // Multi-turn sessions make most of each prompt reusable.
    let multi = hit_rate_bound(&reqs, 128).ratio;
    let single = hit_rate_bound(
        &generate(&SynthSpec {
            turns: LenRange::fixed(1),
            ..spec
        })
        .unwrap(),
        128,
    )
    .ratio;
    assert_eq!(single, 0.0, "no groups, single turn: nothing shared");
    assert!(multi > 0.5, "bound {multi}");
}

#[test]
fn invalid_specs_are_rejected() {
    let bad = [
        SynthSpec {
            rate_per_s: 0.0,
            ..Default::default()
        },
        SynthSpec {
            turns: LenRange { min: 0, max: 2 },
            ..Default::default()
        },
        SynthSpec {
            output_tokens: LenRange { min: 5, max: 1 },
            ..Default::default()
        },
        SynthSpec {
            max_input_tokens: 100,
            ..Default::default()
        },
        SynthSpec {
            block_size: 0,
            ..Default::default()
        },
    ];
    for s in bad {
        assert!(generate(&s).is_err(), "{s:?}");
    }
    let parsed: SynthSpec = toml::from_str("requests = 3\nturns = { min = 1, max = 3 }").unwrap();
    assert_eq!(generate(&parsed).unwrap().len(), 3);
}

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
    let a = generate(&spec).unwrap();
    assert_eq!(a, generate(&spec).unwrap());
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
