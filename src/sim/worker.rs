//! A simulated inference worker as a discrete-event state machine on virtual time.
//!
//! The worker does one thing at a time, like an engine's scheduler loop:
//! 1. admit transferred requests (disaggregated decode) into the decode batch while it
//!    has room — their KV arrives with them and is stored in the cache;
//! 2. else start the oldest queued prefill (FIFO), if the decode batch has room for it
//!    (prefill-only jobs need no room) — prefill has priority over decode, as in vLLM's
//!    default scheduler, so long prompts stall decoding;
//! 3. else run one decode step over the whole batch (one token per running request).
//!
//! Prefill looks up the longest cached prefix when it *starts* (that is when an engine
//! allocates blocks) and records `cached_tokens = prefix_blocks × block_size` capped at
//! the input; its duration comes from [`TimingModel`]. When it completes, the prompt's
//! blocks are stored (cache events) and the first token is out. Blocks of running
//! requests are pinned; only prompt blocks are cached (output token ids are unknown to
//! the simulator). Every output is stamped with its virtual time, and outputs come out
//! in time order.

use super::cache::{CacheEvent, KvCache};
use super::timing::TimingModel;
use super::SimRequest;
use crate::types::DeviceClass;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

/// Which part of a request a worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Prefill then decode (aggregated serving, or disaggregated fallback).
    Full,
    /// Prefill only; ends with [`Outcome::PrefillDone`] so the KV can move to a decode
    /// worker (or with `Finished` if the request wants a single token).
    PrefillOnly,
    /// Decode only: the KV was transferred and the first token already produced.
    DecodeOnly,
}

/// Something that happened on a worker at virtual time `at` (µs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Prefill finished and produced the first output token.
    FirstToken {
        id: String,
        at: u64,
        cached_tokens: u32,
    },
    /// The request has produced `output_tokens` tokens (every `block_size` tokens).
    Progress {
        id: String,
        at: u64,
        output_tokens: u32,
    },
    /// The request produced its last token.
    Finished { id: String, at: u64 },
    /// A prefill-only job finished; its KV is ready to hand to a decode worker.
    PrefillDone { id: String, at: u64 },
    /// The worker's cache changed.
    Cache { at: u64, event: CacheEvent },
}

impl Outcome {
    /// Virtual time of the outcome.
    pub fn at(&self) -> u64 {
        match self {
            Outcome::FirstToken { at, .. }
            | Outcome::Progress { at, .. }
            | Outcome::Finished { at, .. }
            | Outcome::PrefillDone { at, .. }
            | Outcome::Cache { at, .. } => *at,
        }
    }
}

/// Counters of one worker over a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Jobs submitted (any stage).
    pub jobs: u64,
    /// Prefills started.
    pub prefills: u64,
    /// Σ input tokens of started prefills.
    pub prefill_input_tokens: u64,
    /// Σ cached (hit) tokens of started prefills.
    pub hit_tokens: u64,
    /// Decode steps run.
    pub decode_steps: u64,
    /// Virtual µs spent prefilling or decoding.
    pub busy_us: u64,
}

#[derive(Clone, Debug)]
struct Job {
    id: String,
    input_tokens: u32,
    output_tokens: u32,
    hashes: Vec<u64>,
    stage: Stage,
}

#[derive(Debug)]
struct Running {
    job: Job,
    generated: u32,
    pinned: usize,
}

#[derive(Debug)]
enum Busy {
    Prefill {
        job: Job,
        cached_tokens: u32,
        pinned: usize,
        until: u64,
    },
    Decode {
        until: u64,
    },
}

impl Busy {
    fn until(&self) -> u64 {
        match self {
            Busy::Prefill { until, .. } | Busy::Decode { until } => *until,
        }
    }
}

/// One simulated worker (see the module docs for its scheduling).
#[derive(Debug)]
pub struct SimWorker {
    id: String,
    device: DeviceClass,
    timing: TimingModel,
    block_size: u32,
    cache: KvCache,
    prefill_q: VecDeque<Job>,
    decode_q: VecDeque<Job>,
    batch: Vec<Running>,
    busy: Option<Busy>,
    now: u64,
    rng: SmallRng,
    stats: WorkerStats,
}

impl SimWorker {
    /// A worker with an empty cache of `capacity_blocks`, idle at time 0. `seed` drives
    /// the timing jitter only.
    pub fn new(
        id: impl Into<String>,
        device: DeviceClass,
        capacity_blocks: usize,
        timing: TimingModel,
        block_size: u32,
        seed: u64,
    ) -> SimWorker {
        SimWorker {
            id: id.into(),
            device,
            timing,
            block_size: block_size.max(1),
            cache: KvCache::new(capacity_blocks),
            prefill_q: VecDeque::new(),
            decode_q: VecDeque::new(),
            batch: Vec::new(),
            busy: None,
            now: 0,
            rng: SmallRng::seed_from_u64(seed),
            stats: WorkerStats::default(),
        }
    }

    /// The worker's external id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The worker's cache (read-only).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Counters so far.
    pub fn stats(&self) -> &WorkerStats {
        &self.stats
    }

    /// Requests on the worker that have not finished (queued, prefilling or decoding).
    pub fn in_flight(&self) -> usize {
        let prefilling = matches!(self.busy, Some(Busy::Prefill { .. })) as usize;
        self.prefill_q.len() + self.decode_q.len() + self.batch.len() + prefilling
    }

    /// Queues a whole request (prefill then decode) arriving at `now_us`.
    pub fn submit(&mut self, req: &SimRequest, now_us: u64) {
        self.submit_stage(req, Stage::Full, now_us);
    }

    /// Queues one stage of a request arriving at `now_us`.
    pub fn submit_stage(&mut self, req: &SimRequest, stage: Stage, now_us: u64) {
        let job = Job {
            id: req.id.clone(),
            input_tokens: req.input_tokens,
            output_tokens: req.output_tokens.max(1),
            hashes: req.hashes.clone(),
            stage,
        };
        self.stats.jobs += 1;
        self.now = self.now.max(now_us);
        match stage {
            Stage::DecodeOnly => self.decode_q.push_back(job),
            Stage::Full | Stage::PrefillOnly => self.prefill_q.push_back(job),
        }
    }

    /// When the worker next needs [`SimWorker::advance`]: the end of its current
    /// operation, or now if it is idle with work to start; `None` if idle and empty.
    pub fn next_event_at(&self) -> Option<u64> {
        match &self.busy {
            Some(b) => Some(b.until()),
            None if self.prefill_q.is_empty()
                && self.decode_q.is_empty()
                && self.batch.is_empty() =>
            {
                None
            }
            None => Some(self.now),
        }
    }

    /// Runs every operation that completes or starts at or before `until_us`, appending
    /// outcomes in time order.
    pub fn advance(&mut self, until_us: u64, out: &mut Vec<Outcome>) {
        loop {
            match self.busy.take() {
                Some(b) if b.until() <= until_us => {
                    self.now = self.now.max(b.until());
                    self.complete(b, out);
                }
                Some(b) => {
                    self.busy = Some(b);
                    return;
                }
                None => {
                    if self.now > until_us || !self.start_next(out) {
                        return;
                    }
                }
            }
        }
    }

    fn room(&self) -> bool {
        self.batch.len() < self.timing.max_batch as usize
    }

    fn duration(&mut self, us: u64) -> u64 {
        let u: f64 = self.rng.random();
        let d = self.timing.jittered(us, u);
        self.stats.busy_us += d;
        d
    }

    fn emit_cache(&self, events: Vec<CacheEvent>, out: &mut Vec<Outcome>) {
        let at = self.now;
        out.extend(events.into_iter().map(|event| Outcome::Cache { at, event }));
    }

    /// Starts the next operation at `self.now`; false if there is nothing to do.
    fn start_next(&mut self, out: &mut Vec<Outcome>) -> bool {
        while self.room() {
            let Some(job) = self.decode_q.pop_front() else {
                break;
            };
            let mut events = Vec::new();
            self.cache.insert(&job.hashes, &mut events);
            self.emit_cache(events, out);
            let pinned = self.cache.pin(&job.hashes);
            self.batch.push(Running {
                job,
                generated: 1,
                pinned,
            });
        }
        let can_prefill = match self.prefill_q.front() {
            Some(j) => j.stage == Stage::PrefillOnly || self.room(),
            None => false,
        };
        if can_prefill {
            let Some(job) = self.prefill_q.pop_front() else {
                return false;
            };
            let blocks = self.cache.lookup(&job.hashes);
            let pinned = self.cache.pin(&job.hashes[..blocks]);
            let cached_tokens =
                (blocks as u64 * self.block_size as u64).min(job.input_tokens as u64) as u32;
            self.stats.prefills += 1;
            self.stats.prefill_input_tokens += job.input_tokens as u64;
            self.stats.hit_tokens += cached_tokens as u64;
            let base = self
                .timing
                .prefill_us(job.input_tokens, cached_tokens, self.device);
            let until = self.now + self.duration(base);
            self.busy = Some(Busy::Prefill {
                job,
                cached_tokens,
                pinned,
                until,
            });
            return true;
        }
        if self.batch.is_empty() {
            return false;
        }
        self.stats.decode_steps += 1;
        let base = self.timing.decode_step_us(self.batch.len(), self.device);
        let until = self.now + self.duration(base);
        self.busy = Some(Busy::Decode { until });
        true
    }

    fn complete(&mut self, busy: Busy, out: &mut Vec<Outcome>) {
        let at = self.now;
        match busy {
            Busy::Prefill {
                job,
                cached_tokens,
                pinned,
                ..
            } => {
                let mut events = Vec::new();
                self.cache.insert(&job.hashes, &mut events);
                self.emit_cache(events, out);
                let keep = if job.stage == Stage::Full && job.output_tokens > 1 {
                    self.cache.pin(&job.hashes)
                } else {
                    0
                };
                self.cache.unpin(&job.hashes[..pinned]);
                out.push(Outcome::FirstToken {
                    id: job.id.clone(),
                    at,
                    cached_tokens,
                });
                let mut running = Running {
                    job,
                    generated: 1,
                    pinned: keep,
                };
                if self.token_done(&mut running, out) {
                    return;
                }
                if running.job.stage == Stage::PrefillOnly {
                    out.push(Outcome::PrefillDone {
                        id: running.job.id,
                        at,
                    });
                } else {
                    self.batch.push(running);
                }
            }
            Busy::Decode { .. } => {
                let batch = std::mem::take(&mut self.batch);
                for mut r in batch {
                    r.generated += 1;
                    if !self.token_done(&mut r, out) {
                        self.batch.push(r);
                    }
                }
            }
        }
    }

    /// Reports progress after a new token; finishes (and unpins) the request if that
    /// was its last token. Returns whether it finished.
    fn token_done(&mut self, r: &mut Running, out: &mut Vec<Outcome>) -> bool {
        let at = self.now;
        if r.generated.is_multiple_of(self.block_size) {
            out.push(Outcome::Progress {
                id: r.job.id.clone(),
                at,
                output_tokens: r.generated,
            });
        }
        if r.generated < r.job.output_tokens {
            return false;
        }
        self.cache.unpin(&r.job.hashes[..r.pinned]);
        r.pinned = 0;
        out.push(Outcome::Finished {
            id: r.job.id.clone(),
            at,
        });
        true
    }
}

#[cfg(test)]
mod tests;
