//! [`RouterApi`] implementations used by the bundled load tools.
//!
//! - [`EngineRouter`]: the in-process [`Engine`] on the driver's virtual time. Offline
//!   runs are deterministic for a seed.
//! - [`ServiceRouter`]: a running `kvroute serve` over its two binary protocols. One
//!   [`RequestClient`] acts as the frontend (route and lifecycle calls); every simulated
//!   worker gets its own [`EventPublisher`] connection, registers by its handshake and
//!   streams its stored / removed events plus a heartbeat every second.
//!
//! With a [`Pace`], `ServiceRouter` turns the offline driver into a real-time run: every
//! timed call first waits until the wall clock reaches `start + now_us / time_scale`
//! (sending heartbeats while it waits), so the router sees the simulated fleet's calls
//! at the simulated pace, compressed `time_scale` times. The simulated workers still
//! account in model time, so offline and real-time runs share one model; the pacing lag
//! (how late calls went out) is recorded so a run that could not keep up is visible.
//! Route-call latency is measured around the network round trip only.
//! Every wait is bounded: by the schedule, which ends with the workload.

use super::driver::{RouteQuery, Routed, RouterApi};
use super::restart_plan::{Life, RestartPlan, RestartState};
use crate::client::{ClientError, EventPublisher, RequestClient};
use crate::config::RouterConfig;
use crate::engine::{Engine, EngineLimits, KvEvent, RouteRequest};
use crate::types::{Tier, WorkerSpec};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The in-process engine as a [`RouterApi`].
pub struct EngineRouter {
    pub engine: Engine,
}

impl EngineRouter {
    /// An engine with 4 index shards and default limits.
    pub fn new(cfg: RouterConfig, seed: u64) -> Result<EngineRouter, String> {
        Ok(EngineRouter {
            engine: Engine::new(cfg, 2, EngineLimits::default(), seed)?,
        })
    }
}

fn route_request(q: &RouteQuery) -> RouteRequest {
    RouteRequest {
        request_id: q.id.clone(),
        block_hashes: Some(q.hashes.clone()),
        input_tokens: Some(q.input_tokens),
        expected_output_tokens: q.expected_output_tokens,
        mode: Some(q.mode),
        ..Default::default()
    }
}

impl RouterApi for EngineRouter {
    fn register(&mut self, spec: &WorkerSpec) -> Result<(), String> {
        self.engine
            .register(spec.clone())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    fn stored(&mut self, worker: &str, parent: Option<u64>, hashes: &[u64]) -> Result<(), String> {
        let ev = KvEvent::Stored {
            tier: Tier::Device,
            parent,
            block_hashes: hashes.to_vec(),
        };
        self.engine.apply(worker, &ev).map_err(|e| e.to_string())
    }
    fn removed(&mut self, worker: &str, hashes: &[u64]) -> Result<(), String> {
        let ev = KvEvent::Removed {
            tier: Tier::Device,
            block_hashes: hashes.to_vec(),
        };
        self.engine.apply(worker, &ev).map_err(|e| e.to_string())
    }
    fn route(&mut self, q: &RouteQuery, now_us: u64) -> Result<Routed, String> {
        let d = self
            .engine
            .route(&route_request(q), now_us)
            .map_err(|e| e.to_string())?;
        Ok(Routed {
            worker: d.decode_worker,
            prefill_worker: d.prefill_worker,
        })
    }
    fn first_token(&mut self, id: &str, now_us: u64) -> Result<(), String> {
        self.engine
            .first_token(id, now_us)
            .map_err(|e| e.to_string())
    }
    fn progress(&mut self, id: &str, output_tokens: u32, now_us: u64) -> Result<(), String> {
        self.engine
            .progress(id, output_tokens, now_us)
            .map_err(|e| e.to_string())
    }
    fn finish(&mut self, id: &str, now_us: u64) -> Result<(), String> {
        self.engine.finish(id, now_us).map_err(|e| e.to_string())
    }
    /// Approximate mode, as the service gives a worker registered with a url and no
    /// event source (unless the config turns it off).
    fn without_events(&mut self, worker: &str) -> Result<(), String> {
        let on = self.engine.config().approximate;
        self.engine
            .set_approximate(worker, on)
            .map_err(|e| e.to_string())
    }
}

/// Real-time pacing of a [`ServiceRouter`]: model µs `t` happens at wall time
/// `start + t / time_scale`.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub start: Instant,
    /// Wall-clock compression (> 0): 10 runs the model ten times faster than real time.
    pub time_scale: f64,
}

/// One simulated worker's event connection and what its heartbeat reports.
pub(super) struct Publisher {
    pub(super) conn: EventPublisher,
    pub(super) spec: WorkerSpec,
    capacity: u64,
    used_blocks: u64,
    active: u32,
    /// Device blocks the worker holds (a full re-announce after a router restart).
    pub(super) blocks: HashSet<u64>,
    /// Events were dropped while the router was down: re-announce on reconnect.
    pub(super) lost: bool,
}

/// How often each simulated worker sends a heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// A running router over TCP as a [`RouterApi`] (see the module docs).
pub struct ServiceRouter {
    pub(super) api_addr: String,
    pub(super) events_addr: String,
    pub(super) auth_token: String,
    /// Epoch every worker registers with; a fresh one per run makes a reused router
    /// drop what it knew about workers of the same ids.
    epoch: u64,
    pub(super) api: RequestClient,
    pub(super) pubs: HashMap<String, Publisher>,
    /// Request id → worker whose `active` count it holds.
    placed: HashMap<String, String>,
    pace: Option<Pace>,
    last_heartbeat: Instant,
    latencies_us: Vec<f64>,
    lag_us: Vec<f64>,
    /// Called once per finished request (e.g. to advance a progress bar).
    pub on_finish: Option<Box<dyn FnMut()>>,
    /// A planned router restart and what happened around it.
    pub(super) restart: RestartState,
    /// Further router replicas (one NATS-replicated router, see `--cluster`): route
    /// calls go round-robin over `api` (replica 0) and these; each request's lifecycle
    /// calls go to the replica that routed it.
    more_apis: Vec<RequestClient>,
    /// Event ports of every replica: worker `i` (registration order) publishes to
    /// replica `i % n`, so the others learn its blocks only through the replicated log.
    more_events: Vec<String>,
    next_replica: usize,
    /// Request id → replica that routed it (only with more than one replica).
    routed_on: HashMap<String, usize>,
}

fn err(e: ClientError) -> String {
    e.to_string()
}

impl ServiceRouter {
    /// Connects the frontend client to `api_addr`; workers connect to `events_addr`
    /// when the driver registers them.
    pub fn connect(
        api_addr: &str,
        events_addr: &str,
        auth_token: &str,
        epoch: u64,
        pace: Option<Pace>,
    ) -> Result<ServiceRouter, String> {
        if let Some(p) = pace {
            if !(p.time_scale.is_finite() && p.time_scale > 0.0) {
                return Err("time_scale must be > 0".into());
            }
        }
        let api = RequestClient::connect(api_addr, auth_token).map_err(err)?;
        Ok(ServiceRouter {
            api_addr: api_addr.to_string(),
            events_addr: events_addr.to_string(),
            auth_token: auth_token.to_string(),
            epoch,
            api,
            pubs: HashMap::new(),
            placed: HashMap::new(),
            pace,
            last_heartbeat: Instant::now(),
            latencies_us: Vec::new(),
            lag_us: Vec::new(),
            on_finish: None,
            restart: RestartState::default(),
            more_apis: Vec::new(),
            more_events: Vec::new(),
            next_replica: 0,
            routed_on: HashMap::new(),
        })
    }

    /// Like [`ServiceRouter::connect`] against several replicas of one router (same
    /// `--cluster`): `apis[i]` and `events[i]` are replica `i`'s request and event
    /// ports. Route calls go round-robin over the replicas, lifecycle calls to the
    /// replica that routed, and each worker's event connection to one replica.
    pub fn connect_replicas(
        apis: &[String],
        events: &[String],
        auth_token: &str,
        epoch: u64,
        pace: Option<Pace>,
    ) -> Result<ServiceRouter, String> {
        let (Some(api0), Some(ev0)) = (apis.first(), events.first()) else {
            return Err("no router replica given".into());
        };
        if apis.len() != events.len() {
            return Err(format!(
                "{} request ports but {} event ports: give one of each per replica",
                apis.len(),
                events.len()
            ));
        }
        let mut r = ServiceRouter::connect(api0, ev0, auth_token, epoch, pace)?;
        for a in &apis[1..] {
            r.more_apis
                .push(RequestClient::connect(a, auth_token).map_err(err)?);
        }
        r.more_events = events[1..].to_vec();
        Ok(r)
    }

    /// How many router replicas this client spreads its calls over.
    pub fn replicas(&self) -> usize {
        1 + self.more_apis.len()
    }

    /// Replica `i`'s request client (0 is `api`).
    pub(super) fn client(&mut self, i: usize) -> &mut RequestClient {
        match i.checked_sub(1).and_then(|j| self.more_apis.get_mut(j)) {
            Some(c) => c,
            None => &mut self.api,
        }
    }

    /// The replica that routed request `id` (lifecycle calls go there).
    pub(super) fn replica_of(&self, id: &str) -> usize {
        self.routed_on.get(id).copied().unwrap_or(0)
    }

    /// Forgets which replica routed `id` (its last lifecycle call is going out).
    pub(super) fn routed_on_forget(&mut self, id: &str) {
        self.routed_on.remove(id);
    }

    /// The event port worker number `i` (registration order) publishes to.
    fn events_for(&self, i: usize) -> &str {
        match (i % self.replicas()).checked_sub(1) {
            Some(j) => &self.more_events[j],
            None => &self.events_addr,
        }
    }

    /// Restarts the router at a model time (see `sim::service_restart`).
    pub fn plan_restart(&mut self, plan: RestartPlan) {
        self.restart.plan = Some(plan);
    }

    /// Latency of every route call (network round trip), µs.
    pub fn latencies_us(&self) -> &[f64] {
        &self.latencies_us
    }

    /// How late each paced call went out relative to its schedule, µs.
    pub fn lag_us(&self) -> &[f64] {
        &self.lag_us
    }

    /// Sends a heartbeat from every worker if one is due; answers to the workers are
    /// drained without blocking long. Errors are returned, not fatal.
    pub fn heartbeat_if_due(&mut self) -> Result<(), String> {
        if self.restart.is_down() || self.last_heartbeat.elapsed() < HEARTBEAT_EVERY {
            return Ok(());
        }
        self.last_heartbeat = Instant::now();
        let mut first_err = None;
        for (id, p) in self.pubs.iter_mut() {
            p.conn.heartbeat(p.active, p.used_blocks, p.capacity);
            if let Err(e) = p.conn.flush() {
                first_err.get_or_insert(format!("heartbeat {id}: {e}"));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Waits (heartbeating) until the wall clock reaches model time `now_us`.
    fn wait_for(&mut self, now_us: u64) -> Result<(), String> {
        self.restart_step(now_us)?;
        let Some(p) = self.pace else {
            return self.heartbeat_if_due();
        };
        let target = p.start + Duration::from_secs_f64(now_us as f64 / 1e6 / p.time_scale);
        loop {
            self.heartbeat_if_due()?;
            let now = Instant::now();
            if now >= target {
                self.lag_us.push((now - target).as_secs_f64() * 1e6);
                return Ok(());
            }
            std::thread::sleep((target - now).min(Duration::from_millis(100)));
        }
    }

    fn publisher(&mut self, worker: &str) -> Result<&mut Publisher, String> {
        self.pubs
            .get_mut(worker)
            .ok_or_else(|| format!("unknown worker {worker}"))
    }

    fn release(&mut self, id: &str) {
        if let Some(w) = self.placed.remove(id) {
            if let Some(p) = self.pubs.get_mut(&w) {
                p.active = p.active.saturating_sub(1);
            }
        }
    }
}

impl RouterApi for ServiceRouter {
    fn register(&mut self, spec: &WorkerSpec) -> Result<(), String> {
        let spec = WorkerSpec {
            epoch: self.epoch,
            ..spec.clone()
        };
        let capacity = spec.capacity_blocks;
        let addr = self.events_for(self.pubs.len()).to_string();
        let conn =
            EventPublisher::connect(addr.as_str(), spec.clone(), &self.auth_token).map_err(err)?;
        self.pubs.insert(
            spec.id.clone(),
            Publisher {
                conn,
                spec,
                capacity,
                used_blocks: 0,
                active: 0,
                blocks: HashSet::new(),
                lost: false,
            },
        );
        Ok(())
    }
    fn stored(&mut self, worker: &str, parent: Option<u64>, hashes: &[u64]) -> Result<(), String> {
        let down = self.restart.is_down();
        let p = self.publisher(worker)?;
        p.used_blocks += hashes.len() as u64;
        p.blocks.extend(hashes.iter().copied());
        if down {
            p.lost = true;
            return Ok(());
        }
        p.conn.stored(Tier::Device, parent, hashes);
        p.conn.flush().map_err(err)
    }
    fn removed(&mut self, worker: &str, hashes: &[u64]) -> Result<(), String> {
        let down = self.restart.is_down();
        let p = self.publisher(worker)?;
        p.used_blocks = p.used_blocks.saturating_sub(hashes.len() as u64);
        for h in hashes {
            p.blocks.remove(h);
        }
        if down {
            p.lost = true;
            return Ok(());
        }
        p.conn.removed(Tier::Device, hashes);
        p.conn.flush().map_err(err)
    }
    fn route(&mut self, q: &RouteQuery, now_us: u64) -> Result<Routed, String> {
        self.wait_for(now_us)?;
        if self.restart.is_down() {
            self.restart.stats.lost_routes += 1;
            return Err("router restarting: no decision (request lost)".into());
        }
        let req = route_request(q);
        let replica = self.next_replica % self.replicas();
        self.next_replica = self.next_replica.wrapping_add(1);
        if self.replicas() > 1 {
            self.routed_on.insert(q.id.clone(), replica);
        }
        let t0 = Instant::now();
        let d = self.client(replica).route(&req);
        self.latencies_us.push(t0.elapsed().as_secs_f64() * 1e6);
        let d = d.map_err(err)?;
        if let Some(p) = self.pubs.get_mut(&d.decode_worker) {
            p.active += 1;
            self.placed.insert(q.id.clone(), d.decode_worker.clone());
        }
        Ok(Routed {
            worker: d.decode_worker,
            prefill_worker: d.prefill_worker,
        })
    }
    fn first_token(&mut self, id: &str, now_us: u64) -> Result<(), String> {
        self.wait_for(now_us)?;
        self.lifecycle(Life::FirstToken, id)
    }
    fn progress(&mut self, id: &str, output_tokens: u32, now_us: u64) -> Result<(), String> {
        self.wait_for(now_us)?;
        self.lifecycle(Life::Progress(output_tokens), id)
    }
    fn finish(&mut self, id: &str, now_us: u64) -> Result<(), String> {
        self.wait_for(now_us)?;
        self.release(id);
        if let Some(f) = self.on_finish.as_mut() {
            f();
        }
        self.lifecycle(Life::Finish, id)
    }
    /// Its workers speak the event protocol (an event source): use `kvroute-sim fleet
    /// --events none` and `replay` for a fleet without events in real time.
    fn without_events(&mut self, _worker: &str) -> Result<(), String> {
        Err("workers without events run offline only here (real time: kvroute-sim fleet --events none)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;
    use crate::sim::{run_offline, FleetSpec, SimRequest};

    fn reqs(n: usize) -> Vec<SimRequest> {
        // Two conversations growing turn by turn: later turns extend earlier prompts.
        (0..n)
            .map(|i| {
                let conv = (i % 2) as u64;
                let blocks = 4 + i / 2;
                let hashes = (0..blocks as u64)
                    .map(|b| crate::hash::mix_external_id(conv * 1000 + b))
                    .collect();
                SimRequest {
                    id: format!("r{i}"),
                    arrival_us: i as u64 * 500_000,
                    input_tokens: blocks as u32 * 128,
                    output_tokens: 20,
                    hashes,
                    session: Some(conv),
                }
            })
            .collect()
    }

    #[test]
    fn engine_router_runs_offline_with_hits_and_no_errors() {
        let fleet = FleetSpec::uniform(4, 1000);
        let r = reqs(40);
        let mut er = EngineRouter::new(RouterConfig::default(), 1).unwrap();
        let rep = run_offline(&mut er, &fleet, &r, Mode::Kv, 1).unwrap();
        assert_eq!(
            (rep.errors, rep.finished),
            (0, 40),
            "{:?}",
            rep.error_samples
        );
        assert!(rep.hit_rate > 0.5, "hit rate {}", rep.hit_rate);
        assert_eq!(er.engine.active_requests(), 0);
        // Round-robin scatters the conversations: fewer hits than kv.
        let mut rr = EngineRouter::new(RouterConfig::default(), 1).unwrap();
        let base = run_offline(&mut rr, &fleet, &r, Mode::RoundRobin, 1).unwrap();
        assert!(base.hit_rate < rep.hit_rate);
    }

    #[test]
    fn engine_router_reports_unknown_workers_and_requests() {
        let mut er = EngineRouter::new(RouterConfig::default(), 1).unwrap();
        assert!(er.stored("nope", None, &[1]).is_err());
        assert!(er.finish("nope", 0).is_err());
    }

    #[test]
    fn service_router_fails_cleanly_without_a_router() {
        // Port 1 on loopback: nothing listens there.
        assert!(ServiceRouter::connect("127.0.0.1:1", "127.0.0.1:1", "", 1, None).is_err());
    }
}
