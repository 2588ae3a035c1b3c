//! An in-process router: the pure modules wired together, synchronously.
//!
//! `Engine` owns a registry, a sharded block index, one active-block shard per index
//! shard, a load tracker, and the selection state (rng, round-robin cursor). It is what
//! the offline simulator drives on virtual time and what tests use as the reference
//! behaviour; the service performs the same steps spread over cores (see `service`).
//! Time is always passed in (`now_us`), so runs are deterministic for a seed.

pub mod plan;
pub mod request;
mod shards;
pub mod views;

#[cfg(test)]
mod tests_approx;
#[cfg(test)]
mod tests_speculative;

pub use request::{BadRequest, CandidateOut, DpRankSpec, Prepared, RouteDecision, RouteRequest};
pub use views::{EventBatch, KvEvent, WorkerState, WorkerStatus};

use crate::config::{Mode, PrefillLoadModel, RouterConfig};
use crate::index::{
    shard_of, ApproxShard, Budget, MergeResult, PendingShard, ShardedIndex, Speculated,
};
use crate::load::{ActiveBlocksShard, LifecycleError, LoadTracker};
use crate::registry::{Registry, RegistryError, Upsert};
use crate::select::{
    decide_view, Affinity, Filters, Fleet, Hits, Loads, RequestShape, RouteError, RrState, Scratch,
    ViewInput,
};
use crate::types::{Role, Tier, WorkerSlot, WorkerSpec};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::HashMap;

/// Why an engine call failed. Each maps to one HTTP status / binary error code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("unknown worker {0:?}")]
    UnknownWorker(String),
    #[error("unknown request {0:?}")]
    UnknownRequest(String),
    #[error("request {0:?} is already active")]
    Duplicate(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Route(#[from] RouteError),
}

impl From<BadRequest> for EngineError {
    fn from(e: BadRequest) -> Self {
        EngineError::BadRequest(e.0)
    }
}

/// What a disaggregated request needs to be re-routed after a prefill failure.
#[derive(Clone, Debug)]
struct Retained {
    prepared: Prepared,
    mode: Mode,
    expected_output_tokens: Option<u32>,
}

/// Engine limits (the service passes its `Limits`).
#[derive(Clone, Copy, Debug)]
pub struct EngineLimits {
    pub max_workers: usize,
    pub max_blocks_per_worker: u64,
    pub max_hashes_per_request: usize,
}

impl Default for EngineLimits {
    fn default() -> Self {
        let l = crate::settings::Limits::default();
        EngineLimits {
            max_workers: l.max_workers,
            max_blocks_per_worker: l.max_blocks_per_worker,
            max_hashes_per_request: l.max_hashes_per_request,
        }
    }
}

/// The in-process router.
pub struct Engine {
    cfg: RouterConfig,
    limits: EngineLimits,
    registry: Registry,
    index: ShardedIndex,
    shard_bits: u32,
    active: Vec<ActiveBlocksShard>,
    /// Pending-cached (speculative) blocks, one store per index shard like the
    /// service's cores (`index::pending`).
    pending: Vec<PendingShard>,
    /// Buffers of the speculative overlaps of the request being routed.
    spec_matches: Vec<(u32, WorkerSlot)>,
    spec: Vec<Speculated>,
    tracker: LoadTracker,
    live: Vec<bool>,
    suspect: Vec<bool>,
    retained: HashMap<String, Retained>,
    rng: SmallRng,
    rr: RrState,
    merge: MergeResult,
    /// Static filter data of the registry and the workers' liveness and load, rebuilt
    /// on first use after a registry change, then updated as they change.
    view: Option<(Fleet, Loads)>,
    /// Workers whose distinct active blocks changed since the view was refreshed.
    dirty: Vec<WorkerSlot>,
    /// Workers whose prefill load decays with time (`prefill_load_model = predicted`).
    decaying: Vec<WorkerSlot>,
    hits: Hits,
    scratch: Scratch,
    /// Route-time prefix affinity (`affinity_max_entries`).
    affinity: Affinity,
    /// Approximate mode: the modelled caches, one store per index shard, and which
    /// workers are modelled (`shards`).
    approx: Vec<ApproxShard>,
    approximate: Vec<bool>,
}

impl Engine {
    /// An engine with `1 << shard_bits` index shards.
    pub fn new(
        cfg: RouterConfig,
        shard_bits: u32,
        limits: EngineLimits,
        seed: u64,
    ) -> Result<Engine, String> {
        cfg.validate()?;
        if shard_bits > 8 {
            return Err("at most 256 shards".into());
        }
        Ok(Engine {
            tracker: LoadTracker::new(cfg.block_size, &cfg),
            index: ShardedIndex::new(shard_bits),
            shard_bits,
            active: (0..1usize << shard_bits)
                .map(|_| ActiveBlocksShard::new())
                .collect(),
            pending: (0..1usize << shard_bits)
                .map(|_| {
                    PendingShard::new(
                        cfg.speculative_ttl_ms.saturating_mul(1000),
                        cfg.speculative_max_blocks,
                    )
                })
                .collect(),
            spec_matches: Vec::new(),
            spec: Vec::new(),
            registry: Registry::new(limits.max_workers),
            live: Vec::new(),
            suspect: Vec::new(),
            retained: HashMap::new(),
            rng: SmallRng::seed_from_u64(seed),
            rr: RrState::default(),
            merge: MergeResult::default(),
            view: None,
            dirty: Vec::new(),
            decaying: Vec::new(),
            hits: Hits::default(),
            scratch: Scratch::default(),
            affinity: Affinity::new(cfg.affinity_max_entries),
            approx: {
                let b = std::sync::Arc::new(Budget::new(limits.max_workers, u64::MAX));
                let ttl = cfg.approximate_ttl_ms.saturating_mul(1000);
                let n = 1usize << shard_bits;
                (0..n)
                    .map(|_| ApproxShard::new(ttl, b.clone(), n))
                    .collect()
            },
            approximate: Vec::new(),
            cfg,
            limits,
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Registers or updates a worker. A new epoch clears its cached blocks and drops the
    /// accounting of its in-flight requests (the restarted engine lost them). A new
    /// worker (or epoch) with a `url` is approximate (`approximate`, the admin door of
    /// the service: no event source) until its first event.
    pub fn register(&mut self, spec: WorkerSpec) -> Result<Upsert, EngineError> {
        let cap = spec.capacity_blocks.min(self.limits.max_blocks_per_worker);
        let modelled = self.cfg.approximate && spec.url.is_some();
        let up = self.registry.upsert(spec)?;
        self.view = None;
        let slot = up.slot();
        let n = self.registry.slot_bound();
        self.live.resize(n, false);
        self.suspect.resize(n, false);
        if let Upsert::NewEpoch(_) = up {
            self.forget_worker_state(slot);
        }
        self.index.set_worker_cap(slot, cap);
        for a in &mut self.approx {
            a.set_worker_cap(slot, cap);
        }
        if !matches!(up, Upsert::SameEpoch(_)) {
            self.flag_approximate(slot, modelled);
        }
        self.live[slot as usize] = true;
        self.suspect[slot as usize] = false;
        Ok(up)
    }

    /// Removes a worker with everything the router knew about it.
    pub fn deregister(&mut self, id: &str) -> Result<(), EngineError> {
        let slot = self
            .registry
            .remove(id)
            .ok_or_else(|| EngineError::UnknownWorker(id.into()))?;
        self.view = None;
        self.forget_worker_state(slot);
        self.live[slot as usize] = false;
        Ok(())
    }

    fn forget_worker_state(&mut self, slot: WorkerSlot) {
        self.index.clear_worker(slot);
        for f in self.tracker.remove_worker(slot) {
            self.retained.remove(&f.id);
            self.remove_active(f.decode_worker, &f.hashes);
        }
        for a in &mut self.active {
            a.clear_worker(slot);
        }
        for p in &mut self.pending {
            p.clear_worker(slot);
        }
        for a in &mut self.approx {
            a.clear_worker(slot);
        }
    }

    /// Marks a worker in or out of routing (heartbeat window).
    pub fn set_live(&mut self, id: &str, live: bool) -> Result<(), EngineError> {
        let slot = self.slot(id)?;
        self.live[slot as usize] = live;
        if let Some((_, loads)) = &mut self.view {
            loads.set_live(slot, live);
        }
        Ok(())
    }

    /// Marks a worker's index state suspect (its overlap counts as zero) or trusted.
    pub fn set_suspect(&mut self, id: &str, suspect: bool) -> Result<(), EngineError> {
        let slot = self.slot(id)?;
        self.suspect[slot as usize] = suspect;
        if let Some((_, loads)) = &mut self.view {
            loads.set_suspect(slot, suspect);
        }
        Ok(())
    }

    fn slot(&self, id: &str) -> Result<WorkerSlot, EngineError> {
        self.registry
            .slot(id)
            .ok_or_else(|| EngineError::UnknownWorker(id.into()))
    }

    /// Applies one cache event of worker `id`. The first event of an approximate
    /// worker switches it to exact (its modelled blocks are dropped).
    pub fn apply(&mut self, id: &str, ev: &KvEvent) -> Result<(), EngineError> {
        let slot = self.slot(id)?;
        if self.is_approximate(slot) {
            self.flag_approximate(slot, false);
        }
        match ev {
            KvEvent::Stored {
                tier, block_hashes, ..
            } => {
                self.index.stored(slot, *tier, block_hashes);
                self.each_pending(block_hashes, |p, h| p.confirm(slot, h));
            }
            KvEvent::Removed { tier, block_hashes } => {
                self.index.removed(slot, *tier, block_hashes);
                self.each_pending(block_hashes, |p, h| p.drop_hashes(slot, h));
            }
            KvEvent::Cleared { tier } => {
                match tier {
                    Some(t) => self.index.clear_tier(slot, *t),
                    None => {
                        for t in Tier::ALL {
                            self.index.clear_tier(slot, t);
                        }
                    }
                }
                for p in &mut self.pending {
                    p.clear_worker(slot);
                }
            }
        }
        Ok(())
    }

    /// Routes a request and starts tracking it.
    pub fn route(&mut self, req: &RouteRequest, now_us: u64) -> Result<RouteDecision, EngineError> {
        let prepared = req.prepare_with(
            self.cfg.block_size,
            self.cfg.lookahead_tokens,
            self.limits.max_hashes_per_request,
        )?;
        if self.tracker.get(&req.request_id).is_some() {
            return Err(EngineError::Duplicate(req.request_id.clone()));
        }
        let mode = req.mode.unwrap_or(self.cfg.mode);
        self.route_prepared(
            &req.request_id,
            prepared,
            mode,
            req.expected_output_tokens,
            req.explain,
            false,
            now_us,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn route_prepared(
        &mut self,
        id: &str,
        prepared: Prepared,
        mode: Mode,
        osl: Option<u32>,
        explain: bool,
        prefill_failed: bool,
        now_us: u64,
    ) -> Result<RouteDecision, EngineError> {
        let reg = &self.registry;
        let shared = |s: WorkerSlot| reg.get(s).is_some_and(|e| e.spec.role == Role::Shared);
        self.index.query(&prepared.hashes, shared, &mut self.merge);
        let reuse = self.reuse_counts(&prepared.hashes);
        self.speculate(&prepared.hashes, now_us);
        self.refresh_view(now_us);
        let Some((fleet, loads)) = &self.view else {
            return Err(RouteError::NoWorkers {
                model: prepared.filters.model.clone(),
            }
            .into());
        };
        plan::write_hits(&mut self.hits, fleet, &self.merge, reuse);
        plan::write_speculative(&mut self.hits, fleet, &self.spec);
        let near = self.affinity.lookup(&prepared.hashes);
        self.hits.set_affinity(fleet, near);
        let input = ViewInput {
            cfg: &self.cfg,
            mode,
            req: RequestShape {
                input_tokens: prepared.input_tokens,
                prompt_blocks: prepared.prompt_blocks,
            },
            filters: &prepared.filters,
            fleet,
            loads,
            hits: &self.hits,
            prefill_failed,
            explain,
        };
        let d = decide_view(&input, &mut self.rng, &mut self.rr, &mut self.scratch)?;
        self.affinity
            .note_decision(&prepared.hashes, prepared.filters.pin.is_some(), &d);
        let out = plan::to_output(&self.registry, id, &d, explain, &self.spec);
        let (sw, from) = plan::speculative_target(&d, &self.merge);
        self.tracker
            .on_route(plan::new_request(
                id,
                &d,
                &prepared,
                prepared.hashes.clone(),
                self.cfg.block_size,
                osl,
                now_us,
            ))
            .map_err(|e| lifecycle_err(e, id))?;
        self.add_active(d.decode_worker, &prepared.hashes);
        self.touch_approx(sw, &prepared.hashes, now_us);
        if let Some(rest) = prepared.hashes.get(from..) {
            let bits = self.shard_bits;
            let mut mine = Vec::new();
            for (s, p) in self.pending.iter_mut().enumerate() {
                mine.clear();
                mine.extend(rest.iter().copied().filter(|&h| shard_of(h, bits) == s));
                p.add(sw, &mine, now_us);
            }
        }
        if d.prefill_worker.is_some() {
            self.retained.insert(
                id.to_string(),
                Retained {
                    prepared,
                    mode,
                    expected_output_tokens: osl,
                },
            );
        }
        Ok(out)
    }

    /// Brings the view up to date: rebuilt after a registry change, else the load of
    /// every worker whose figures changed (and, under the `predicted` prefill load
    /// model, of every worker whose prefill load decays) is re-read.
    fn refresh_view(&mut self, now_us: u64) {
        let model = self.cfg.prefill_load_model;
        let mut changed = std::mem::take(&mut self.dirty);
        self.tracker.take_dirty(&mut changed);
        if self.view.is_none() {
            let fleet = Fleet::with_slots(self.registry.iter().map(|e| (e.slot, &e.spec)));
            let mut loads = Loads::new(&fleet);
            for e in self.registry.iter() {
                let s = e.slot as usize;
                loads.set_live(e.slot, self.live.get(s).copied().unwrap_or(false));
                loads.set_suspect(e.slot, self.suspect.get(s).copied().unwrap_or(false));
            }
            self.view = Some((fleet, loads));
            // New positions: the routed counts of the old layout no longer apply.
            self.scratch.forget_routed();
            changed.clear();
            changed.extend(self.registry.iter().map(|e| e.slot));
            self.decaying.clear();
        }
        if model == PrefillLoadModel::Predicted {
            changed.append(&mut self.decaying);
        }
        changed.sort_unstable();
        changed.dedup();
        if let Some((_, loads)) = &mut self.view {
            for &w in &changed {
                let agg = self.tracker.agg(w);
                let unique: u64 = self.active.iter().map(|a| a.unique_blocks(w)).sum();
                loads.set_load(w, &agg.load(model, now_us), unique as f64);
                if model == PrefillLoadModel::Predicted && agg.oldest_prefill.is_some() {
                    self.decaying.push(w);
                }
            }
        }
        changed.clear();
        self.dirty = changed;
    }

    /// First output token: prefill of the request is complete.
    pub fn first_token(&mut self, id: &str, now_us: u64) -> Result<(), EngineError> {
        self.tracker
            .on_first_token(id, now_us)
            .map(|_| ())
            .map_err(|e| lifecycle_err(e, id))
    }

    /// Output progress (total tokens generated so far).
    pub fn progress(
        &mut self,
        id: &str,
        output_tokens: u32,
        now_us: u64,
    ) -> Result<(), EngineError> {
        self.tracker
            .on_progress(id, output_tokens, now_us)
            .map_err(|e| lifecycle_err(e, id))
    }

    /// The request finished: all its load is released.
    pub fn finish(&mut self, id: &str, now_us: u64) -> Result<(), EngineError> {
        let f = self
            .tracker
            .on_finish(id, now_us)
            .map_err(|e| lifecycle_err(e, id))?;
        self.retained.remove(id);
        self.remove_active(f.decode_worker, &f.hashes);
        self.end_pending(f.prefill_worker.unwrap_or(f.decode_worker), &f.hashes);
        Ok(())
    }

    /// The prefill worker failed: release it and answer with a decode-only decision.
    pub fn prefill_failed(&mut self, id: &str, now_us: u64) -> Result<RouteDecision, EngineError> {
        let kept = self.retained.remove(id);
        let f = self
            .tracker
            .on_prefill_failed(id, now_us)
            .map_err(|e| lifecycle_err(e, id))?;
        self.remove_active(f.decode_worker, &f.hashes);
        self.end_pending(f.prefill_worker.unwrap_or(f.decode_worker), &f.hashes);
        let kept = kept.ok_or_else(|| {
            EngineError::BadRequest(format!("request {id:?} was not routed to a prefill worker"))
        })?;
        self.route_prepared(
            id,
            kept.prepared,
            kept.mode,
            kept.expected_output_tokens,
            false,
            true,
            now_us,
        )
    }

    /// Status of every worker.
    pub fn workers(&self, now_us: u64) -> Vec<WorkerStatus> {
        self.registry
            .iter()
            .map(|e| {
                let s = e.slot as usize;
                let load = self
                    .tracker
                    .agg(e.slot)
                    .load(self.cfg.prefill_load_model, now_us);
                let state = if !self.live.get(s).copied().unwrap_or(false) {
                    WorkerState::Down
                } else if self.suspect.get(s).copied().unwrap_or(false) {
                    WorkerState::Suspect
                } else {
                    WorkerState::Live
                };
                let unique: u64 = self.active.iter().map(|a| a.unique_blocks(e.slot)).sum();
                let mut w = WorkerStatus::new(
                    &e.spec,
                    state,
                    self.index.worker_blocks(e.slot),
                    &load,
                    if self.cfg.assume_kv_reuse {
                        unique as f64
                    } else {
                        load.blocks_total
                    },
                );
                if self.is_approximate(e.slot) {
                    w.approximate = true;
                    w.approximate_entries = Some(self.approx_entries(e.slot));
                }
                w
            })
            .collect()
    }

    /// Requests currently tracked.
    pub fn active_requests(&self) -> usize {
        self.tracker.active_requests()
    }

    /// Filters exposed for tests that build requests by hand.
    pub fn default_filters() -> Filters {
        Filters::default()
    }
}

fn lifecycle_err(e: LifecycleError, id: &str) -> EngineError {
    match e {
        LifecycleError::Duplicate => EngineError::Duplicate(id.into()),
        LifecycleError::UnknownRequest => EngineError::UnknownRequest(id.into()),
        LifecycleError::InvalidId => EngineError::BadRequest(format!("invalid request id {id:?}")),
    }
}
