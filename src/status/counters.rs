//! What the routing pipeline records for the status page, on the hot path.
//!
//! Guarantees: recording is a few relaxed atomic adds per decision (per-worker routes,
//! prompt and cached blocks, one latency bucket) and never blocks: the ring of recent
//! decisions takes its lock with `try_lock` and skips the record when another core
//! holds it. Decisions are recorded with their explain record when the client asked for
//! `explain`, and otherwise at most one per core every [`SAMPLE_EVERY_US`] (the
//! router then computes the explain record for that one decision). All arrays are sized
//! once, from `max_workers` and the core count.

use super::model::{lat_bucket, DecisionRecord, Ring, SlotCount, LAT_BUCKETS, SILENT_AFTER_MS};
use crate::types::{Tier, WorkerSlot};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Decisions kept in the ring.
pub const RECENT_DECISIONS: usize = 50;
/// Least time between two sampled (not explicitly explained) decisions of one core.
pub const SAMPLE_EVERY_US: u64 = 50_000;

#[derive(Default)]
struct Slot {
    routes: AtomicU64,
    prompt_blocks: AtomicU64,
    cached_blocks: AtomicU64,
    /// 1 + milliseconds since start of the last cache event (0: never).
    last_event: AtomicU64,
    /// 1 + milliseconds since start of the last "routed without events" warning.
    warned: AtomicU64,
}

pub struct Counters {
    cores: usize,
    slots: Box<[Slot]>,
    /// Per core, per slot, per tier: entries in that core's index shard.
    tiers: Box<[AtomicU64]>,
    latency: Box<[AtomicU64]>,
    pub decisions: AtomicU64,
    pub route_errors: AtomicU64,
    recent: Mutex<Ring<DecisionRecord>>,
    seq: AtomicU64,
}

thread_local! {
    /// This core's time of its last sampled decision (µs since start), if any.
    static LAST_SAMPLE: Cell<Option<u64>> = const { Cell::new(None) };
}

impl Counters {
    pub fn new(cores: usize, max_workers: usize) -> Counters {
        Counters {
            cores,
            slots: (0..max_workers).map(|_| Slot::default()).collect(),
            tiers: (0..cores * max_workers * Tier::ALL.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            latency: (0..LAT_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            decisions: AtomicU64::new(0),
            route_errors: AtomicU64::new(0),
            recent: Mutex::new(Ring::new(RECENT_DECISIONS)),
            seq: AtomicU64::new(0),
        }
    }

    /// A routing call ended: `decided` (ok or fallback) or an error, after `ns`.
    pub fn on_route(&self, decided: bool, ns: u64) {
        if decided {
            self.decisions.fetch_add(1, Relaxed);
        } else {
            self.route_errors.fetch_add(1, Relaxed);
        }
        self.latency[lat_bucket(ns)].fetch_add(1, Relaxed);
    }

    /// A decision sent a request to `worker` (once per worker taking part).
    pub fn routed(&self, worker: WorkerSlot) {
        if let Some(s) = self.slots.get(worker as usize) {
            s.routes.fetch_add(1, Relaxed);
        }
    }

    /// The prompt of a decision runs on `worker`: `prompt` blocks, `cached` found there.
    pub fn prefilled(&self, worker: WorkerSlot, prompt: u64, cached: u64) {
        if let Some(s) = self.slots.get(worker as usize) {
            s.prompt_blocks.fetch_add(prompt, Relaxed);
            s.cached_blocks.fetch_add(cached, Relaxed);
        }
    }

    /// A new identity (or epoch) takes the slot: its routing counters start at zero.
    pub fn reset(&self, worker: WorkerSlot) {
        if let Some(s) = self.slots.get(worker as usize) {
            s.routes.store(0, Relaxed);
            s.prompt_blocks.store(0, Relaxed);
            s.cached_blocks.store(0, Relaxed);
            s.last_event.store(0, Relaxed);
            s.warned.store(0, Relaxed);
        }
    }

    /// A decision just sent a request to `worker` at `now_ms`: `None` if the worker
    /// sent a KV cache event within [`SILENT_AFTER_MS`]; otherwise it is silent (the
    /// decision was load-only for it) and the answer says whether to log a warning now
    /// (at most one per worker per [`SILENT_AFTER_MS`]; concurrent callers race for it
    /// and one wins).
    pub fn routed_silent(&self, worker: WorkerSlot, now_ms: u64) -> Option<bool> {
        let s = self.slots.get(worker as usize)?;
        let last = s.last_event.load(Relaxed);
        if last != 0 && now_ms.saturating_sub(last - 1) < SILENT_AFTER_MS {
            return None;
        }
        let warned = s.warned.load(Relaxed);
        let due = warned == 0 || now_ms.saturating_sub(warned - 1) >= SILENT_AFTER_MS;
        Some(
            due && s
                .warned
                .compare_exchange(warned, now_ms + 1, Relaxed, Relaxed)
                .is_ok(),
        )
    }

    /// A cache event of `worker` reached the index at `now_ms`.
    pub fn cache_event(&self, worker: WorkerSlot, now_ms: u64) {
        if let Some(s) = self.slots.get(worker as usize) {
            s.last_event.store(now_ms + 1, Relaxed);
        }
    }

    /// Core `core` publishes `worker`'s index entries per tier in its shard.
    pub fn publish_tiers(&self, core: usize, worker: WorkerSlot, per_tier: [u64; 3]) {
        let base = (core * self.slots.len() + worker as usize) * 3;
        for (i, v) in per_tier.into_iter().enumerate() {
            if let Some(c) = self.tiers.get(base + i) {
                c.store(v, Relaxed);
            }
        }
    }

    /// `worker`'s index entries per tier, summed over cores.
    pub fn tiers(&self, worker: WorkerSlot) -> [u64; 3] {
        let mut out = [0; 3];
        for core in 0..self.cores {
            let base = (core * self.slots.len() + worker as usize) * 3;
            for (i, o) in out.iter_mut().enumerate() {
                *o += self.tiers.get(base + i).map_or(0, |c| c.load(Relaxed));
            }
        }
        out
    }

    /// Milliseconds since start of `worker`'s last cache event.
    pub fn last_event_ms(&self, worker: WorkerSlot) -> Option<u64> {
        let v = self.slots.get(worker as usize)?.last_event.load(Relaxed);
        v.checked_sub(1)
    }

    pub fn slot_count(&self, worker: WorkerSlot, gen: u64) -> SlotCount {
        self.slots
            .get(worker as usize)
            .map_or(SlotCount::default(), |s| SlotCount {
                gen,
                routes: s.routes.load(Relaxed),
                prompt_blocks: s.prompt_blocks.load(Relaxed),
                cached_blocks: s.cached_blocks.load(Relaxed),
            })
    }

    pub fn latency_counts(&self) -> Vec<u64> {
        self.latency.iter().map(|c| c.load(Relaxed)).collect()
    }

    /// Whether this core records the decision it is about to make at `now_us`
    /// (`explain`: the client asked for the explain record anyway).
    pub fn sample(&self, explain: bool, now_us: u64) -> bool {
        LAST_SAMPLE.with(|last| {
            let due = explain
                || last
                    .get()
                    .is_none_or(|t| now_us.saturating_sub(t) >= SAMPLE_EVERY_US);
            if due {
                last.set(Some(now_us));
            }
            due
        })
    }

    /// Adds a decision to the ring (skipped if another core holds the ring right now).
    pub fn record(&self, mut r: DecisionRecord) {
        if let Ok(mut ring) = self.recent.try_lock() {
            r.seq = self.seq.fetch_add(1, Relaxed);
            ring.push(r);
        }
    }

    /// The recorded decisions, newest first.
    pub fn recent(&self) -> Vec<DecisionRecord> {
        match self.recent.lock() {
            Ok(ring) => ring.iter().rev().cloned().collect(),
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_workers_are_reported_and_warned_once_a_minute() {
        let c = Counters::new(1, 2);
        assert_eq!(c.routed_silent(0, 5), Some(true), "never sent an event");
        assert_eq!(c.routed_silent(0, 6), Some(false), "warned already");
        c.cache_event(0, 10);
        assert_eq!(c.routed_silent(0, 10 + SILENT_AFTER_MS - 1), None);
        assert_eq!(c.routed_silent(0, 10 + SILENT_AFTER_MS), Some(true));
        assert_eq!(c.routed_silent(9, 0), None, "out of range");
        c.reset(0);
        assert_eq!(
            c.routed_silent(0, 20),
            Some(true),
            "a new identity is warned anew"
        );
    }

    #[test]
    fn sampling_gate_per_thread() {
        let c = Counters::new(1, 4);
        assert!(c.sample(false, 1_000));
        assert!(!c.sample(false, 1_000 + SAMPLE_EVERY_US - 1));
        assert!(
            c.sample(true, 1_000 + SAMPLE_EVERY_US - 1),
            "explain always records"
        );
        assert!(c.sample(false, 10 * SAMPLE_EVERY_US));
    }

    #[test]
    fn slots_tiers_and_reset() {
        let c = Counters::new(2, 4);
        c.routed(1);
        c.routed(1);
        c.prefilled(1, 10, 4);
        c.routed(99); // out of range: ignored
        c.cache_event(1, 0);
        c.publish_tiers(0, 1, [3, 2, 1]);
        c.publish_tiers(1, 1, [1, 0, 0]);
        assert_eq!(c.tiers(1), [4, 2, 1]);
        assert_eq!(c.last_event_ms(1), Some(0));
        assert_eq!(c.last_event_ms(2), None);
        let n = c.slot_count(1, 7);
        assert_eq!(
            (n.gen, n.routes, n.prompt_blocks, n.cached_blocks),
            (7, 2, 10, 4)
        );
        c.reset(1);
        assert_eq!(c.slot_count(1, 8).routes, 0);
        assert_eq!(c.last_event_ms(1), None);
    }

    #[test]
    fn ring_is_bounded_newest_first() {
        let c = Counters::new(1, 1);
        for i in 0..(RECENT_DECISIONS + 5) {
            c.record(DecisionRecord {
                seq: 0,
                t_ms: i as u64,
                mode: "kv",
                prompt_blocks: 1,
                input_tokens: 1,
                candidates_total: 0,
                decision: crate::engine::RouteDecision {
                    request_id: format!("r{i}"),
                    decode_worker: "w".into(),
                    prefill_worker: None,
                    dp_rank: 0,
                    overlap: Default::default(),
                    cost: 0.0,
                    fallback: "none".into(),
                    candidates: Some(Vec::new()),
                    local_prefill: None,
                    affinity: None,
                },
            });
        }
        let r = c.recent();
        assert_eq!(r.len(), RECENT_DECISIONS);
        assert_eq!(
            r[0].decision.request_id,
            format!("r{}", RECENT_DECISIONS + 4)
        );
        assert!(r[0].seq > r[1].seq);
    }
}
