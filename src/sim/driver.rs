//! The offline driver: replays a workload against a router and simulated workers on
//! virtual time, in-process.
//!
//! The router is reached only through [`RouterApi`], so the driver does not depend on
//! the engine (the engine, a test double or a network client can all implement it).
//! The loop is event-driven: at each step it takes the earlier of the next arrival and
//! the next worker event (workers first on ties, so a finished request releases its
//! load before a simultaneous arrival is routed; lower worker index first among
//! workers). On arrival it calls `route` and submits the request to the chosen worker;
//! with a prefill worker in the decision, the prefill worker runs the prefill and, when
//! it is done, the decode worker receives the request with its KV (stored into its
//! cache). Cache events are forwarded to the router as soon as they happen; outcomes
//! become lifecycle calls. Router errors are counted in the report, never fatal.
//!
//! A run is deterministic: the only randomness is the timing jitter, seeded from
//! `seed` per worker, and no hash-map iteration order leaks into the schedule.

use super::report::{Recorder, Report};
use super::timing::TimingModel;
use super::worker::{Outcome, SimWorker, Stage};
use super::{CacheEvent, SimRequest};
use crate::config::Mode;
use crate::types::{DeviceClass, Role, WorkerSpec};
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

/// What the driver needs from a router. Times are the run's virtual µs.
pub trait RouterApi {
    fn register(&mut self, spec: &WorkerSpec) -> Result<(), String>;
    fn stored(&mut self, worker: &str, parent: Option<u64>, hashes: &[u64]) -> Result<(), String>;
    fn removed(&mut self, worker: &str, hashes: &[u64]) -> Result<(), String>;
    fn route(&mut self, q: &RouteQuery, now_us: u64) -> Result<Routed, String>;
    fn first_token(&mut self, id: &str, now_us: u64) -> Result<(), String>;
    fn progress(&mut self, id: &str, output_tokens: u32, now_us: u64) -> Result<(), String>;
    fn finish(&mut self, id: &str, now_us: u64) -> Result<(), String>;
    /// Worker `worker` (registered) will publish no cache events (a fleet with
    /// `events = false`): the router may model its cache (approximate mode). Default:
    /// nothing to do.
    fn without_events(&mut self, worker: &str) -> Result<(), String> {
        let _ = worker;
        Ok(())
    }
}

/// A routing request as the simulated frontend sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteQuery {
    pub id: String,
    pub hashes: Vec<u64>,
    pub input_tokens: u32,
    /// The request's true output length when the fleet enables `osl_hint`.
    pub expected_output_tokens: Option<u32>,
    pub mode: Mode,
}

/// The router's answer: the (decode) worker, and a prefill worker when disaggregated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routed {
    pub worker: String,
    pub prefill_worker: Option<String>,
}

/// One simulated worker of the fleet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimWorkerSpec {
    pub id: String,
    #[serde(default)]
    pub device: DeviceClass,
    /// `aggregated`, `prefill` or `decode` (a `shared` store is not simulated).
    #[serde(default)]
    pub role: Role,
    #[serde(default)]
    pub topology: String,
    /// KV cache capacity in blocks.
    #[serde(default = "crate::types::default_capacity_blocks")]
    pub capacity_blocks: u64,
}

impl SimWorkerSpec {
    /// What the worker registers with the router.
    pub fn worker_spec(&self) -> WorkerSpec {
        WorkerSpec {
            role: self.role,
            device: self.device,
            topology: self.topology.clone(),
            capacity_blocks: self.capacity_blocks,
            ..WorkerSpec::new(self.id.clone())
        }
    }
}

/// The simulated fleet: its workers, their time model and the block size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSpec {
    pub workers: Vec<SimWorkerSpec>,
    #[serde(default)]
    pub timing: TimingModel,
    /// Tokens per block; must match the router's and the trace's. Default 128.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
    /// Whether the simulated frontend passes each request's true output length as its
    /// OSL hint. Default false (frontends rarely know it).
    #[serde(default)]
    pub osl_hint: bool,
    /// Whether the workers publish their cache events to the router. False: the
    /// router sees only its own routes (a fleet without KV events; approximate mode).
    /// Default true.
    #[serde(default = "yes")]
    pub events: bool,
}

fn default_block_size() -> u32 {
    crate::hash::DEFAULT_BLOCK_SIZE as u32
}

fn yes() -> bool {
    true
}

impl FleetSpec {
    /// `n` aggregated GPU workers `w0..w{n-1}` of `capacity_blocks` each, default timing.
    pub fn uniform(n: usize, capacity_blocks: u64) -> FleetSpec {
        FleetSpec {
            workers: (0..n)
                .map(|i| SimWorkerSpec {
                    id: format!("w{i}"),
                    device: DeviceClass::Gpu,
                    role: Role::Aggregated,
                    topology: String::new(),
                    capacity_blocks,
                })
                .collect(),
            timing: TimingModel::default(),
            block_size: default_block_size(),
            osl_hint: false,
            events: true,
        }
    }

    /// Checks the fleet can be simulated: at least one worker, valid unique ids, no
    /// `shared` role, valid timing and block size.
    pub fn validate(&self) -> Result<(), String> {
        if self.workers.is_empty() {
            return Err("fleet has no workers".into());
        }
        if self.block_size == 0 || self.block_size as usize > crate::hash::MAX_BLOCK_SIZE {
            return Err(format!(
                "block_size must be 1..={}",
                crate::hash::MAX_BLOCK_SIZE
            ));
        }
        self.timing.validate()?;
        let mut seen = HashMap::new();
        for w in &self.workers {
            w.worker_spec()
                .validate()
                .map_err(|e| format!("worker {}: {e}", w.id))?;
            if w.role == Role::Shared {
                return Err(format!("worker {}: shared stores are not simulated", w.id));
            }
            if seen.insert(w.id.as_str(), ()).is_some() {
                return Err(format!("duplicate worker id {}", w.id));
            }
        }
        Ok(())
    }
}

/// Splitmix64 step: independent per-worker seeds from one run seed.
fn mix_seed(seed: u64, i: u64) -> u64 {
    let mut z = seed ^ (i.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Replays `reqs` (any order; taken by arrival time) on `fleet` with routing `mode`.
/// Fails only if the fleet is invalid or a worker cannot register; everything else is
/// counted in the report.
pub fn run_offline(
    router: &mut impl RouterApi,
    fleet: &FleetSpec,
    reqs: &[SimRequest],
    mode: Mode,
    seed: u64,
) -> Result<Report, String> {
    fleet.validate()?;
    let mut sims = Vec::with_capacity(fleet.workers.len());
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, w) in fleet.workers.iter().enumerate() {
        router
            .register(&w.worker_spec())
            .map_err(|e| format!("register {}: {e}", w.id))?;
        if !fleet.events {
            router
                .without_events(&w.id)
                .map_err(|e| format!("register {}: {e}", w.id))?;
        }
        let cap = usize::try_from(w.capacity_blocks).unwrap_or(usize::MAX);
        sims.push(SimWorker::new(
            w.id.clone(),
            w.device,
            cap,
            fleet.timing.clone(),
            fleet.block_size,
            mix_seed(seed, i as u64),
        ));
        index.insert(w.id.as_str(), i);
    }
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by_key(|&i| reqs[i].arrival_us);
    let mut run = Run {
        router,
        rec: Recorder::new(),
        sims,
        index,
        handoff: HashMap::new(),
        reqs,
        events: fleet.events,
    };
    let mut next = 0;
    let mut outs = Vec::new();
    loop {
        let worker_next = run
            .sims
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.next_event_at().map(|t| (t, i)))
            .min();
        let arrival = order.get(next).map(|&i| (reqs[i].arrival_us, i));
        match (worker_next, arrival) {
            (None, None) => break,
            (Some((t, wi)), None) => run.step(wi, t, &mut outs),
            (Some((t, wi)), Some((at, _))) if t <= at => run.step(wi, t, &mut outs),
            (_, Some((at, ri))) => {
                run.arrive(ri, at, mode, fleet.osl_hint);
                next += 1;
            }
        }
    }
    let workers: Vec<(String, Role, DeviceClass)> = fleet
        .workers
        .iter()
        .map(|w| (w.id.clone(), w.role, w.device))
        .collect();
    Ok(run
        .rec
        .finish_with_devices(mode.name(), mode, seed, &workers))
}

/// State of one offline run.
struct Run<'a, R> {
    router: &'a mut R,
    rec: Recorder,
    sims: Vec<SimWorker>,
    index: HashMap<&'a str, usize>,
    /// Requests prefilling on a prefill worker: request index and decode worker.
    handoff: HashMap<String, (usize, usize)>,
    reqs: &'a [SimRequest],
    /// Cache events reach the router (`FleetSpec::events`).
    events: bool,
}

impl<R: RouterApi> Run<'_, R> {
    fn check(&mut self, what: &str, r: Result<(), String>) {
        if let Err(e) = r {
            self.rec.error(format!("{what}: {e}"));
        }
    }

    /// Advances worker `wi` to `t` and forwards what happened.
    fn step(&mut self, wi: usize, t: u64, outs: &mut Vec<Outcome>) {
        self.sims[wi].advance(t, outs);
        for o in outs.drain(..) {
            self.forward(wi, o);
        }
    }

    fn arrive(&mut self, ri: usize, now: u64, mode: Mode, osl_hint: bool) {
        let reqs = self.reqs;
        let req = &reqs[ri];
        self.rec
            .arrived(&req.id, now, req.input_tokens, req.output_tokens);
        let q = RouteQuery {
            id: req.id.clone(),
            hashes: req.hashes.clone(),
            input_tokens: req.input_tokens,
            expected_output_tokens: osl_hint.then_some(req.output_tokens),
            mode,
        };
        let routed = match self.router.route(&q, now) {
            Ok(r) => r,
            Err(e) => return self.rec.error(format!("route {}: {e}", req.id)),
        };
        let Some(&d) = self.index.get(routed.worker.as_str()) else {
            return self.rec.error(format!(
                "route {}: unknown worker {}",
                req.id, routed.worker
            ));
        };
        let p = match routed.prefill_worker.as_deref() {
            None => None,
            Some(p) => match self.index.get(p) {
                Some(&p) => Some(p).filter(|&p| p != d),
                None => {
                    return self
                        .rec
                        .error(format!("route {}: unknown prefill worker {p}", req.id))
                }
            },
        };
        match p {
            Some(p) => {
                self.sims[p].submit_stage(req, Stage::PrefillOnly, now);
                self.rec.job(self.sims[p].id());
                self.handoff.insert(req.id.clone(), (ri, d));
            }
            None => {
                self.sims[d].submit(req, now);
                self.rec.job(self.sims[d].id());
            }
        }
    }

    fn forward(&mut self, wi: usize, o: Outcome) {
        match o {
            Outcome::Cache { .. } if !self.events => {}
            Outcome::Cache { event, .. } => {
                self.rec.event();
                let w = self.sims[wi].id();
                let r = match &event {
                    CacheEvent::Stored { parent, hashes } => self.router.stored(w, *parent, hashes),
                    CacheEvent::Removed { hashes } => self.router.removed(w, hashes),
                };
                self.check("cache event", r);
            }
            Outcome::FirstToken {
                id,
                at,
                cached_tokens,
            } => {
                self.rec.first_token(&id, at, cached_tokens);
                let r = self.router.first_token(&id, at);
                self.check("first_token", r);
            }
            Outcome::Progress {
                id,
                at,
                output_tokens,
            } => {
                let r = self.router.progress(&id, output_tokens, at);
                self.check("progress", r);
            }
            Outcome::Finished { id, at } => {
                self.handoff.remove(&id);
                self.rec.finished(&id, at);
                let r = self.router.finish(&id, at);
                self.check("finish", r);
            }
            Outcome::PrefillDone { id, at } => {
                if let Some((ri, d)) = self.handoff.remove(&id) {
                    self.sims[d].submit_stage(&self.reqs[ri], Stage::DecodeOnly, at);
                    self.rec.job(self.sims[d].id());
                }
            }
        }
    }
}

/// Wraps a router to measure each `route` call with a caller-supplied clock (e.g.
/// nanoseconds from `Instant`), keeping this module clock-free. Feed
/// [`TimedRouter::latencies_us`] to [`Report::set_decision_latencies`].
pub struct TimedRouter<R, C> {
    pub inner: R,
    clock: C,
    samples_us: Vec<f64>,
}

impl<R: RouterApi, C: FnMut() -> u64> TimedRouter<R, C> {
    /// `clock` returns a monotonic time in nanoseconds.
    pub fn new(inner: R, clock: C) -> Self {
        TimedRouter {
            inner,
            clock,
            samples_us: Vec::new(),
        }
    }

    /// Latency of every `route` call so far, in µs.
    pub fn latencies_us(&self) -> &[f64] {
        &self.samples_us
    }
}

impl<R: RouterApi, C: FnMut() -> u64> RouterApi for TimedRouter<R, C> {
    fn register(&mut self, spec: &WorkerSpec) -> Result<(), String> {
        self.inner.register(spec)
    }
    fn stored(&mut self, worker: &str, parent: Option<u64>, hashes: &[u64]) -> Result<(), String> {
        self.inner.stored(worker, parent, hashes)
    }
    fn removed(&mut self, worker: &str, hashes: &[u64]) -> Result<(), String> {
        self.inner.removed(worker, hashes)
    }
    fn route(&mut self, q: &RouteQuery, now_us: u64) -> Result<Routed, String> {
        let t0 = (self.clock)();
        let r = self.inner.route(q, now_us);
        let t1 = (self.clock)();
        self.samples_us.push(t1.saturating_sub(t0) as f64 / 1000.0);
        r
    }
    fn first_token(&mut self, id: &str, now_us: u64) -> Result<(), String> {
        self.inner.first_token(id, now_us)
    }
    fn progress(&mut self, id: &str, output_tokens: u32, now_us: u64) -> Result<(), String> {
        self.inner.progress(id, output_tokens, now_us)
    }
    fn finish(&mut self, id: &str, now_us: u64) -> Result<(), String> {
        self.inner.finish(id, now_us)
    }
    fn without_events(&mut self, worker: &str) -> Result<(), String> {
        self.inner.without_events(worker)
    }
}

#[cfg(test)]
mod tests;
