//! A model of SGLang Model Gateway's `cache_aware` policy (sgl-router 0.3.x,
//! `--policy cache_aware`) as a [`RouterApi`], so the offline simulator can compare
//! kvroute with it on the same workload, deterministic and without Python.
//!
//! What the gateway does, and what this model keeps of it:
//! - It keeps, per worker, an approximate radix tree of the *prompt text it routed*
//!   there (never the workers' KV events). Here a worker's "tree" is the set of the
//!   router block hashes of the prompts routed to it: the hashes are prefix-chained, so
//!   the longest routed prefix of a request on a worker is its longest run of leading
//!   hashes in that set, and the tree size is the number of distinct blocks.
//! - Load is the number of requests in flight per worker (routed, not yet finished).
//!   The fleet is imbalanced when `max - min > balance_abs_threshold` (32) and
//!   `max > min * balance_rel_threshold` (1.0001); then the request goes to the least
//!   loaded worker (and is still inserted in its tree).
//! - Otherwise the match rate is the matched share of the prompt (tokens of the longest
//!   routed prefix over the prompt's tokens; the gateway counts characters). Above
//!   `cache_threshold` (0.5) the request goes to the worker of the longest match (the
//!   most recently routed one among equals), else to the worker with the smallest tree.
//! - Trees are evicted by size: every `eviction_interval_us` of model time (the
//!   gateway's 120 s), a tree above `max_tree_blocks` drops its least recently routed
//!   blocks down to that size. The gateway's default (2^26 characters) is far above
//!   what a trace slice routes, so by default nothing is evicted, as in the gateway.
//!
//! Guarantees: deterministic (no randomness, no hash-map iteration order in a
//! decision), no panics on any input, memory bounded by `max_tree_blocks` per worker
//! (plus what one eviction interval routes).

use super::driver::{RouteQuery, Routed, RouterApi};
use crate::types::{Role, WorkerSpec};
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

/// The gateway's knobs (its defaults); serde so tools can set them by name.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheAwareConfig {
    /// Match rate above which the longest-match worker is taken. Default 0.5.
    pub cache_threshold: f64,
    /// Imbalance needs `max - min` in-flight requests above this. Default 32.
    pub balance_abs_threshold: u64,
    /// ... and `max > min * this`. Default 1.0001.
    pub balance_rel_threshold: f64,
    /// Largest tree per worker, in blocks, after an eviction. Default 2^26 / 512
    /// (2^26 characters at ~4 characters per token, 128 tokens per block).
    pub max_tree_blocks: usize,
    /// Model time between evictions, µs. Default 120 s.
    pub eviction_interval_us: u64,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        CacheAwareConfig {
            cache_threshold: 0.5,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.0001,
            max_tree_blocks: (1 << 26) / 512,
            eviction_interval_us: 120_000_000,
        }
    }
}

/// One worker's approximate tree: block hash → tick of its last insertion.
#[derive(Clone, Debug, Default)]
struct Tree {
    blocks: HashMap<u64, u64>,
}

impl Tree {
    /// Leading hashes of `hashes` present in the tree.
    fn matched(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.blocks.contains_key(*h))
            .count()
    }

    /// Tick at which the prefix of length `n` was last touched (0 if `n == 0`).
    fn touched(&self, hashes: &[u64], n: usize) -> u64 {
        n.checked_sub(1)
            .and_then(|i| hashes.get(i))
            .and_then(|h| self.blocks.get(h))
            .copied()
            .unwrap_or(0)
    }

    fn insert(&mut self, hashes: &[u64], tick: u64) {
        for &h in hashes {
            self.blocks.insert(h, tick);
        }
    }

    /// Drops the least recently inserted blocks until at most `max` remain.
    fn evict_to(&mut self, max: usize) {
        if self.blocks.len() <= max {
            return;
        }
        let mut ticks: Vec<u64> = self.blocks.values().copied().collect();
        let cut = ticks.len() - max;
        ticks.select_nth_unstable(cut.saturating_sub(1));
        let below = ticks[cut.saturating_sub(1)];
        // Everything at or before the cut tick goes (ties may take a few more).
        self.blocks.retain(|_, t| *t > below);
    }
}

/// The gateway's `cache_aware` policy as a router of the offline driver.
#[derive(Clone, Debug, Default)]
pub struct SglangCacheAware {
    cfg: CacheAwareConfig,
    block_size: u32,
    /// Aggregated workers in registration order.
    ids: Vec<String>,
    trees: Vec<Tree>,
    in_flight: Vec<u64>,
    /// Request id → worker index, while in flight.
    placed: HashMap<String, usize>,
    tick: u64,
    next_eviction_us: u64,
}

impl SglangCacheAware {
    /// The policy with `cfg`, for prompts of `block_size` tokens per block.
    pub fn new(cfg: CacheAwareConfig, block_size: u32) -> SglangCacheAware {
        SglangCacheAware {
            cfg,
            block_size: block_size.max(1),
            next_eviction_us: cfg.eviction_interval_us,
            ..Default::default()
        }
    }

    /// The worker index for a request, and whether it came from the load balancer.
    pub fn choose(&self, hashes: &[u64], input_tokens: u32) -> Option<usize> {
        let n = self.ids.len();
        if n == 0 {
            return None;
        }
        let max = self.in_flight.iter().copied().max().unwrap_or(0);
        let min = self.in_flight.iter().copied().min().unwrap_or(0);
        let imbalanced = max.saturating_sub(min) > self.cfg.balance_abs_threshold
            && (max as f64) > (min as f64) * self.cfg.balance_rel_threshold;
        if imbalanced {
            return (0..n).min_by_key(|&i| (self.in_flight[i], i));
        }
        // Longest routed prefix; among equals the most recently routed one.
        let (best, len) = (0..n)
            .map(|i| (i, self.trees[i].matched(hashes)))
            .max_by_key(|&(i, m)| (m, self.trees[i].touched(hashes, m), std::cmp::Reverse(i)))
            .unwrap_or((0, 0));
        let tokens = f64::from(input_tokens.max(1));
        let rate = (len as f64 * f64::from(self.block_size)).min(tokens) / tokens;
        if len > 0 && rate > self.cfg.cache_threshold {
            return Some(best);
        }
        (0..n).min_by_key(|&i| (self.trees[i].blocks.len(), i))
    }

    fn maybe_evict(&mut self, now_us: u64) {
        if self.cfg.eviction_interval_us == 0 || now_us < self.next_eviction_us {
            return;
        }
        for t in &mut self.trees {
            t.evict_to(self.cfg.max_tree_blocks);
        }
        self.next_eviction_us = now_us.saturating_add(self.cfg.eviction_interval_us);
    }
}

impl RouterApi for SglangCacheAware {
    fn register(&mut self, spec: &WorkerSpec) -> Result<(), String> {
        if spec.role != Role::Aggregated {
            return Err(format!(
                "the sglang-cache-aware baseline routes aggregated workers only ({} is {:?})",
                spec.id, spec.role
            ));
        }
        if !self.ids.contains(&spec.id) {
            self.ids.push(spec.id.clone());
            self.trees.push(Tree::default());
            self.in_flight.push(0);
        }
        Ok(())
    }
    fn stored(&mut self, _: &str, _: Option<u64>, _: &[u64]) -> Result<(), String> {
        Ok(()) // the gateway reads no KV events
    }
    fn removed(&mut self, _: &str, _: &[u64]) -> Result<(), String> {
        Ok(())
    }
    fn route(&mut self, q: &RouteQuery, now_us: u64) -> Result<Routed, String> {
        self.maybe_evict(now_us);
        let w = self
            .choose(&q.hashes, q.input_tokens)
            .ok_or("no workers registered")?;
        self.tick += 1;
        self.trees[w].insert(&q.hashes, self.tick);
        self.in_flight[w] += 1;
        self.placed.insert(q.id.clone(), w);
        Ok(Routed {
            worker: self.ids[w].clone(),
            prefill_worker: None,
        })
    }
    fn first_token(&mut self, _: &str, _: u64) -> Result<(), String> {
        Ok(())
    }
    fn progress(&mut self, _: &str, _: u32, _: u64) -> Result<(), String> {
        Ok(())
    }
    fn finish(&mut self, id: &str, _: u64) -> Result<(), String> {
        if let Some(w) = self.placed.remove(id) {
            self.in_flight[w] = self.in_flight[w].saturating_sub(1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;

    fn q(id: &str, hashes: &[u64]) -> RouteQuery {
        RouteQuery {
            id: id.into(),
            hashes: hashes.to_vec(),
            input_tokens: hashes.len() as u32 * 128,
            expected_output_tokens: None,
            mode: Mode::Kv,
        }
    }

    fn policy(n: usize) -> SglangCacheAware {
        let mut p = SglangCacheAware::new(CacheAwareConfig::default(), 128);
        for i in 0..n {
            p.register(&WorkerSpec::new(format!("w{i}"))).unwrap();
        }
        p
    }

    #[test]
    fn a_conversation_sticks_and_new_prefixes_go_to_the_smallest_tree() {
        let mut p = policy(3);
        let a = p.route(&q("a1", &[1, 2, 3]), 0).unwrap().worker;
        // A new prefix goes to the smallest tree (another worker).
        let b = p.route(&q("b1", &[7, 8]), 0).unwrap().worker;
        assert_ne!(a, b);
        // The next turn of `a` matches 3 of 4 blocks (> 0.5): back to its worker.
        assert_eq!(p.route(&q("a2", &[1, 2, 3, 4]), 0).unwrap().worker, a);
        // A prompt matching only 1 of 4 blocks goes to the smallest tree (w2).
        assert_eq!(p.route(&q("c1", &[1, 9, 9, 9]), 0).unwrap().worker, "w2");
    }

    #[test]
    fn imbalance_goes_to_the_least_loaded_worker() {
        let mut p = policy(2);
        for i in 0..40 {
            // Same prefix: sticks to w0 while balanced... until w0 leads by 33.
            p.route(&q(&format!("r{i}"), &[1, 2]), 0).unwrap();
        }
        assert_eq!(p.in_flight, vec![33, 7]);
        p.finish("r0", 0).unwrap();
        p.finish("nope", 0).unwrap();
        assert_eq!(p.in_flight[0], 32);
    }

    #[test]
    fn eviction_keeps_the_most_recent_blocks() {
        let cfg = CacheAwareConfig {
            max_tree_blocks: 2,
            eviction_interval_us: 10,
            ..Default::default()
        };
        let mut p = SglangCacheAware::new(cfg, 128);
        p.register(&WorkerSpec::new("w0")).unwrap();
        p.route(&q("a", &[1, 2]), 0).unwrap();
        p.route(&q("b", &[3, 4]), 1).unwrap();
        p.route(&q("c", &[5]), 20).unwrap();
        assert!(!p.trees[0].blocks.contains_key(&1));
        assert!(p.trees[0].blocks.contains_key(&3) && p.trees[0].blocks.contains_key(&5));
    }
}
