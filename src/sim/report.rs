//! What a simulated (or real-time) run measured, and how it is shown.
//!
//! A [`Report`] is plain data (serde, for JSON output); [`Recorder`] builds one from
//! the lifecycle of each request, so the offline driver and the real-time tool compute
//! every figure the same way. [`table`] renders reports as a text table (one row per
//! mode) and [`svg_chart`] as a self-contained SVG.
//!
//! Definitions:
//! - `hit_rate` = Σ worker-measured cached tokens ÷ Σ input tokens, over requests whose
//!   prefill ran (compare with [`super::bound`]).
//! - `ttft_us` = first token − arrival; `e2e_us` = finish − arrival, over finished
//!   requests. Percentiles are nearest-rank.
//! - throughput = finished requests and their output tokens per second of the run's
//!   span (first arrival → last finish), virtual time offline.
//! - `imbalance` = max ÷ mean of jobs per worker, taken within each role pool
//!   (aggregated, prefill, decode; a disaggregated request is one job on its prefill
//!   worker and one on its decode worker) and the worst pool reported. 1.0 is a
//!   perfectly even spread; pools that received nothing are skipped.
//! - `imbalance_by_device` (fleets mixing CPU and GPU workers only): the same figure
//!   within each device class, with the class's mean and maximum jobs per worker, so a
//!   mixed fleet's spread can be read per class (a router that weighs device speed is
//!   *meant* to send CPU workers fewer requests, which the fleet-wide figure punishes).
//! - `events` = cache events (stored / removed batches) forwarded to the router.
//! - `decision_us` = route-call latency, filled by the real-time tool (or offline with
//!   [`super::driver::TimedRouter`]); `None` when not measured.

use crate::config::Mode;
use crate::types::{DeviceClass, Role};
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

mod svg;
mod text;

pub use svg::{svg_chart, svg_chart_with_bound};
pub use text::{device_table, table};

/// p50 / p90 / p99 (nearest-rank), maximum and sample count of a distribution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub count: u64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (all zero when empty). NaNs sort last.
    pub fn of(samples: &[f64]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let rank = |q: f64| s[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        Percentiles {
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: s[n - 1],
            count: n as u64,
        }
    }

    /// [`Percentiles::of`] integer samples (e.g. µs).
    pub fn of_u64(samples: &[u64]) -> Percentiles {
        let f: Vec<f64> = samples.iter().map(|&v| v as f64).collect();
        Percentiles::of(&f)
    }
}

/// Jobs received by one worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerCount {
    pub worker: String,
    pub role: Role,
    pub jobs: u64,
    #[serde(default)]
    pub device: DeviceClass,
}

/// Jobs per worker within one device class (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceImbalance {
    pub device: DeviceClass,
    pub workers: u64,
    pub jobs: u64,
    pub mean_jobs: f64,
    pub max_jobs: u64,
    /// Worst max ÷ mean over the class's role pools.
    pub imbalance: f64,
}

/// Per device class figures of `counts`, GPU first; empty unless both classes exist.
pub fn imbalance_by_device(counts: &[WorkerCount]) -> Vec<DeviceImbalance> {
    let classes = [DeviceClass::Gpu, DeviceClass::Cpu];
    let present = |d: DeviceClass| counts.iter().any(|c| c.device == d);
    if !classes.iter().all(|&d| present(d)) {
        return Vec::new();
    }
    classes
        .iter()
        .map(|&d| {
            let pool: Vec<WorkerCount> = counts.iter().filter(|c| c.device == d).cloned().collect();
            let jobs: u64 = pool.iter().map(|c| c.jobs).sum();
            DeviceImbalance {
                device: d,
                workers: pool.len() as u64,
                jobs,
                mean_jobs: jobs as f64 / pool.len().max(1) as f64,
                max_jobs: pool.iter().map(|c| c.jobs).max().unwrap_or(0),
                imbalance: imbalance(&pool),
            }
        })
        .collect()
}

/// Everything one run measured (see the module docs for definitions).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Row / series name; defaults to the mode's name.
    pub label: String,
    pub mode: Mode,
    pub seed: u64,
    /// Requests offered.
    pub requests: u64,
    /// Requests that produced their last token.
    pub finished: u64,
    /// Failed router calls (route, events, lifecycle) and rejected decisions.
    pub errors: u64,
    /// The first few error messages, for diagnosis.
    pub error_samples: Vec<String>,
    pub input_tokens: u64,
    pub hit_tokens: u64,
    pub hit_rate: f64,
    pub ttft_us: Percentiles,
    pub e2e_us: Percentiles,
    /// First arrival → last finish, µs.
    pub duration_us: u64,
    pub throughput_rps: f64,
    pub output_tok_per_s: f64,
    pub jobs_per_worker: Vec<WorkerCount>,
    pub imbalance: f64,
    /// Mixed CPU/GPU fleets: imbalance within each device class (else empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imbalance_by_device: Vec<DeviceImbalance>,
    pub decision_us: Option<Percentiles>,
    pub events: u64,
    pub events_per_s: f64,
    /// Disaggregated fleets: requests whose prefill ran on a prefill worker, and the
    /// prompt blocks their KV transfers moved to the decode workers.
    #[serde(default)]
    pub remote_prefills: u64,
    #[serde(default)]
    pub transferred_blocks: u64,
    /// Per request that got its first token: arrival and tokens (for windowed hit
    /// rates, e.g. around a router restart). Not serialized.
    #[serde(skip)]
    pub hit_samples: Vec<HitSample>,
}

/// One request's hit figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HitSample {
    pub arrival_us: u64,
    pub input_tokens: u32,
    pub hit_tokens: u32,
}

/// Hit rate (cached ÷ input tokens) of the requests arriving in `[from_us, to_us)`, and
/// how many there were.
pub fn hit_rate_between(samples: &[HitSample], from_us: u64, to_us: u64) -> (f64, usize) {
    let (mut hit, mut input, mut n) = (0u64, 0u64, 0usize);
    for s in samples
        .iter()
        .filter(|s| s.arrival_us >= from_us && s.arrival_us < to_us)
    {
        hit += u64::from(s.hit_tokens);
        input += u64::from(s.input_tokens);
        n += 1;
    }
    let rate = if input == 0 {
        0.0
    } else {
        hit as f64 / input as f64
    };
    (rate, n)
}

impl Report {
    /// The name used for this run in tables and charts.
    pub fn name(&self) -> &str {
        if self.label.is_empty() {
            self.mode.name()
        } else {
            &self.label
        }
    }

    /// Fills `decision_us` from route-call latencies in µs.
    pub fn set_decision_latencies(&mut self, samples_us: &[f64]) {
        self.decision_us = Some(Percentiles::of(samples_us));
    }
}

/// Error messages kept in a report.
const ERROR_SAMPLES: usize = 8;

#[derive(Clone, Debug)]
struct Track {
    arrival: u64,
    input_tokens: u32,
    output_tokens: u32,
    first_token: Option<u64>,
    done: bool,
}

/// Accumulates a run's observations into a [`Report`].
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    reqs: HashMap<String, Track>,
    requests: u64,
    errors: u64,
    error_samples: Vec<String>,
    input_tokens: u64,
    hit_tokens: u64,
    ttft: Vec<u64>,
    e2e: Vec<u64>,
    output_tokens: u64,
    first_arrival: Option<u64>,
    last_finish: u64,
    jobs: HashMap<String, u64>,
    events: u64,
    decisions: Vec<f64>,
    hits: Vec<HitSample>,
    remote_prefills: u64,
    transferred_blocks: u64,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// A request was offered at `at`.
    pub fn arrived(&mut self, id: &str, at: u64, input_tokens: u32, output_tokens: u32) {
        self.requests += 1;
        self.first_arrival = Some(self.first_arrival.map_or(at, |f| f.min(at)));
        self.reqs.insert(
            id.to_string(),
            Track {
                arrival: at,
                input_tokens,
                output_tokens: output_tokens.max(1),
                first_token: None,
                done: false,
            },
        );
    }

    /// A worker received a job (one per stage).
    pub fn job(&mut self, worker: &str) {
        *self.jobs.entry_ref(worker).or_insert(0) += 1;
    }

    /// The request's first token came out; `cached_tokens` as measured by the worker.
    /// Repeats and unknown ids are ignored.
    pub fn first_token(&mut self, id: &str, at: u64, cached_tokens: u32) {
        if let Some(t) = self.reqs.get_mut(id) {
            if t.first_token.is_none() {
                t.first_token = Some(at);
                self.ttft.push(at.saturating_sub(t.arrival));
                self.input_tokens += t.input_tokens as u64;
                self.hit_tokens += cached_tokens.min(t.input_tokens) as u64;
                self.hits.push(HitSample {
                    arrival_us: t.arrival,
                    input_tokens: t.input_tokens,
                    hit_tokens: cached_tokens.min(t.input_tokens),
                });
            }
        }
    }

    /// The request finished. Repeats and unknown ids are ignored.
    pub fn finished(&mut self, id: &str, at: u64) {
        if let Some(t) = self.reqs.get_mut(id) {
            if !t.done {
                t.done = true;
                self.e2e.push(at.saturating_sub(t.arrival));
                self.output_tokens += t.output_tokens as u64;
                self.last_finish = self.last_finish.max(at);
            }
        }
    }

    /// A router call failed or a decision was unusable.
    pub fn error(&mut self, msg: String) {
        self.errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push(msg);
        }
    }

    /// A remote prefill handed `blocks` prompt blocks to its decode worker.
    pub fn transfer(&mut self, blocks: usize) {
        self.remote_prefills += 1;
        self.transferred_blocks += blocks as u64;
    }

    /// A cache event was forwarded to the router.
    pub fn event(&mut self) {
        self.events += 1;
    }

    /// One route call took `us` µs.
    pub fn decision(&mut self, us: f64) {
        self.decisions.push(us);
    }

    /// The report. `workers` lists the fleet (id, role) so idle workers count in the
    /// imbalance.
    pub fn finish(self, label: &str, mode: Mode, seed: u64, workers: &[(String, Role)]) -> Report {
        let all: Vec<(String, Role, DeviceClass)> = workers
            .iter()
            .map(|(w, r)| (w.clone(), *r, DeviceClass::Gpu))
            .collect();
        self.finish_with_devices(label, mode, seed, &all)
    }

    /// [`Recorder::finish`] with each worker's device class, for the per-class imbalance.
    pub fn finish_with_devices(
        self,
        label: &str,
        mode: Mode,
        seed: u64,
        workers: &[(String, Role, DeviceClass)],
    ) -> Report {
        let start = self.first_arrival.unwrap_or(0);
        let duration_us = self.last_finish.saturating_sub(start);
        let secs = duration_us as f64 / 1e6;
        let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let jobs_per_worker: Vec<WorkerCount> = workers
            .iter()
            .map(|(w, role, device)| WorkerCount {
                worker: w.clone(),
                role: *role,
                jobs: self.jobs.get(w.as_str()).copied().unwrap_or(0),
                device: *device,
            })
            .collect();
        Report {
            label: if label.is_empty() {
                mode.name().to_string()
            } else {
                label.to_string()
            },
            mode,
            seed,
            requests: self.requests,
            finished: self.e2e.len() as u64,
            errors: self.errors,
            error_samples: self.error_samples,
            input_tokens: self.input_tokens,
            hit_tokens: self.hit_tokens,
            hit_rate: if self.input_tokens == 0 {
                0.0
            } else {
                self.hit_tokens as f64 / self.input_tokens as f64
            },
            ttft_us: Percentiles::of_u64(&self.ttft),
            e2e_us: Percentiles::of_u64(&self.e2e),
            duration_us,
            throughput_rps: per_s(self.e2e.len() as u64),
            output_tok_per_s: per_s(self.output_tokens),
            imbalance: imbalance(&jobs_per_worker),
            imbalance_by_device: imbalance_by_device(&jobs_per_worker),
            jobs_per_worker,
            decision_us: (!self.decisions.is_empty()).then(|| Percentiles::of(&self.decisions)),
            events: self.events,
            events_per_s: per_s(self.events),
            remote_prefills: self.remote_prefills,
            transferred_blocks: self.transferred_blocks,
            hit_samples: self.hits,
        }
    }
}

/// Worst max ÷ mean of jobs per worker over the role pools (see the module docs).
pub fn imbalance(counts: &[WorkerCount]) -> f64 {
    let mut worst: f64 = 0.0;
    for role in [Role::Aggregated, Role::Prefill, Role::Decode] {
        let pool: Vec<u64> = counts
            .iter()
            .filter(|c| c.role == role)
            .map(|c| c.jobs)
            .collect();
        let total: u64 = pool.iter().sum();
        if total == 0 {
            continue;
        }
        let mean = total as f64 / pool.len() as f64;
        let max = pool.iter().copied().max().unwrap_or(0) as f64;
        worst = worst.max(max / mean);
    }
    worst
}

#[cfg(test)]
mod tests;
