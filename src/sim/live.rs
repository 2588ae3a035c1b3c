//! One simulated worker of `kvroute-sim fleet` on the wall clock, sans I/O: its KV
//! cache ([`KvCache`]), its admission (concurrency bound), the time a request's
//! prefill and each decode step take ([`TimingModel`], divided by the time scale), and
//! the counters `GET /stats` reports.
//!
//! Model: prefills run one at a time per worker (a request waits for the prefills
//! admitted before it), costing `prefill_us` of its *uncached* prompt tokens; blocks
//! transferred by a remote prefill (NIXL `do_remote_prefill`) count as cached. A decode
//! step costs `decode_step_us(running)`, so every stream slows down as the batch
//! grows. A request's prompt blocks are stored when it is admitted (vLLM allocates
//! them at schedule time) and pinned until it finishes.
//!
//! Guarantees: at most `max_active` requests are admitted at once (the rest are
//! refused and counted); every admitted request's pins are released by
//! [`LiveWorker::finish`]; the cache events of every admission are returned exactly
//! (see [`KvCache::insert`]), so a router fed them mirrors the cache.

use super::cache::{CacheEvent, KvCache};
use super::timing::TimingModel;
use crate::types::DeviceClass;
use serde::Serialize;

/// Counters of one worker (`GET /stats`). Monotonic except `active`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LiveStats {
    pub requests: u64,
    pub prompt_blocks: u64,
    /// Prompt blocks found in the cache at admission (prefix hits).
    pub cached_blocks: u64,
    /// Prompt blocks received from a remote prefill (not counted as hits).
    pub transferred_blocks: u64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub active: u64,
    /// Requests refused with 429 (concurrency bound).
    pub rejected: u64,
    /// Requests failed on purpose (`--fail-rate`, `--die-after-chunks`).
    pub injected_failures: u64,
    pub finished: u64,
}

/// What admitting a request decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    /// Sequence hashes of the prompt's complete blocks.
    pub hashes: Vec<u64>,
    /// Prompt blocks that were already cached.
    pub cached_blocks: usize,
    /// Wall-clock µs from now until the first token (queued prefills + this prefill).
    pub first_token_in_us: u64,
    /// Cache changes to publish.
    pub events: Vec<CacheEvent>,
    /// Blocks pinned for this request (pass back to [`LiveWorker::finish`]).
    pinned: Vec<u64>,
}

impl Admission {
    /// The pinned hashes (for [`LiveWorker::finish`]).
    pub fn pinned(&self) -> &[u64] {
        &self.pinned
    }
}

/// One worker's live state.
#[derive(Debug)]
pub struct LiveWorker {
    cache: KvCache,
    timing: TimingModel,
    block_size: usize,
    time_scale: f64,
    max_active: usize,
    /// Wall-clock µs at which the prefill queue is free.
    prefill_free_at: u64,
    stats: LiveStats,
}

impl LiveWorker {
    /// `time_scale` > 0: model time runs this many times faster than the wall clock.
    pub fn new(
        capacity_blocks: usize,
        block_size: usize,
        timing: TimingModel,
        time_scale: f64,
        max_active: usize,
    ) -> LiveWorker {
        LiveWorker {
            cache: KvCache::new(capacity_blocks),
            timing,
            block_size: block_size.max(1),
            time_scale: if time_scale > 0.0 { time_scale } else { 1.0 },
            max_active: max_active.max(1),
            prefill_free_at: 0,
            stats: LiveStats::default(),
        }
    }

    pub fn stats(&self) -> &LiveStats {
        &self.stats
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn scaled(&self, model_us: u64) -> u64 {
        (model_us as f64 / self.time_scale).round().max(0.0) as u64
    }

    /// Admits a request of prompt `tokens` at wall-clock `now_us`, of which the first
    /// `transferred` blocks come from a remote prefill; `None` (counted) when
    /// `max_active` requests are already running.
    pub fn admit(&mut self, tokens: &[u32], transferred: usize, now_us: u64) -> Option<Admission> {
        if self.stats.active as usize >= self.max_active {
            self.stats.rejected += 1;
            return None;
        }
        let hashes = crate::hash::sequence_hashes(tokens, self.block_size);
        let cached = self.cache.lookup(&hashes);
        let mut events = Vec::new();
        self.cache.insert(&hashes, &mut events);
        let pinned_n = self.cache.pin(&hashes);
        let pinned = hashes[..pinned_n].to_vec();
        let transferred = transferred.min(hashes.len()).max(cached);
        let skip_tokens = (transferred * self.block_size).min(tokens.len()) as u32;
        let prefill = self
            .timing
            .prefill_us(tokens.len() as u32, skip_tokens, DeviceClass::Gpu);
        let start = self.prefill_free_at.max(now_us);
        self.prefill_free_at = start + self.scaled(prefill);
        self.stats.requests += 1;
        self.stats.active += 1;
        self.stats.prompt_blocks += hashes.len() as u64;
        self.stats.cached_blocks += cached as u64;
        self.stats.transferred_blocks += (transferred - cached) as u64;
        self.stats.prompt_tokens += tokens.len() as u64;
        Some(Admission {
            hashes,
            cached_blocks: cached,
            first_token_in_us: self.prefill_free_at - now_us,
            events,
            pinned,
        })
    }

    /// Wall-clock µs of one decode step with the current batch (every running request).
    pub fn decode_step_us(&self) -> u64 {
        let batch = (self.stats.active as usize).clamp(1, self.timing.max_batch as usize);
        self.scaled(self.timing.decode_step_us(batch, DeviceClass::Gpu))
    }

    /// Counts generated tokens.
    pub fn produced(&mut self, tokens: u32) {
        self.stats.output_tokens += tokens as u64;
    }

    /// Counts a failure injected on purpose.
    pub fn injected_failure(&mut self) {
        self.stats.injected_failures += 1;
    }

    /// Ends an admitted request: releases its pins and its slot.
    pub fn finish(&mut self, a: &Admission) {
        self.cache.unpin(&a.pinned);
        self.stats.active = self.stats.active.saturating_sub(1);
        self.stats.finished += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(max_active: usize) -> LiveWorker {
        LiveWorker::new(64, 4, TimingModel::default(), 1.0, max_active)
    }

    #[test]
    fn second_identical_prompt_hits_and_prefills_faster() {
        let mut w = w(8);
        let toks: Vec<u32> = (0..40).collect();
        let a = w.admit(&toks, 0, 0).unwrap();
        assert_eq!((a.hashes.len(), a.cached_blocks), (10, 0));
        assert!(
            matches!(&a.events[..], [CacheEvent::Stored { parent: None, hashes }] if hashes.len() == 10)
        );
        w.finish(&a);
        let now = a.first_token_in_us + 1;
        let b = w.admit(&toks, 0, now).unwrap();
        assert_eq!(b.cached_blocks, 10);
        assert!(b.events.is_empty());
        assert!(b.first_token_in_us < a.first_token_in_us);
        assert_eq!((w.stats().prompt_blocks, w.stats().cached_blocks), (20, 10));
    }

    #[test]
    fn prefills_queue_and_transferred_blocks_skip_cost() {
        let mut w = w(8);
        let toks: Vec<u32> = (0..400).collect();
        let a = w.admit(&toks, 0, 0).unwrap();
        let other: Vec<u32> = (1000..1400).collect();
        let b = w.admit(&other, 0, 0).unwrap();
        assert!(b.first_token_in_us > a.first_token_in_us);
        let mut fresh = super::LiveWorker::new(64, 4, TimingModel::default(), 1.0, 8);
        let c = fresh.admit(&other, 100, 0).unwrap();
        assert!(c.first_token_in_us < a.first_token_in_us);
        assert_eq!(fresh.stats().transferred_blocks, 100);
    }

    #[test]
    fn admission_is_bounded_and_finish_releases() {
        let mut w = w(1);
        let a = w.admit(&[1, 2, 3, 4], 0, 0).unwrap();
        assert!(w.admit(&[1, 2, 3, 4], 0, 0).is_none());
        assert_eq!(w.stats().rejected, 1);
        assert_eq!(w.cache().pinned(), 1);
        w.finish(&a);
        assert_eq!((w.stats().active, w.cache().pinned()), (0, 0));
        assert!(w.admit(&[1, 2, 3, 4], 0, 0).is_some());
    }

    #[test]
    fn time_scale_divides_durations() {
        let slow = LiveWorker::new(8, 4, TimingModel::default(), 1.0, 4);
        let fast = LiveWorker::new(8, 4, TimingModel::default(), 10.0, 4);
        assert_eq!(slow.decode_step_us() / 10, fast.decode_step_us());
    }
}
