//! The load tracker: the router's own accounting of in-flight work per worker, fed by
//! routing decisions and lifecycle notifications (DESIGN §1 "Active load model"). It
//! never talks to backends.
//!
//! Contributions of one request:
//! - on its prefill worker (`prefill_worker`, or `decode_worker` when `None`), until
//!   prefill completes: `prefill_requests += 1`, `prefill_tokens += effective_isl`, and
//!   under the `predicted` model an entry in the worker's ordered set of active prefills
//!   (its first entry is the published `oldest_prefill`);
//! - on its decode worker, until it leaves: `active_requests += 1`,
//!   `blocks_total += prompt_blocks`, and with `track_output_blocks` its weighted output
//!   placeholder blocks.
//!
//! Guarantees:
//! - exactly once: each contribution is added once and removed once, whatever order the
//!   lifecycle calls arrive in. Each request's contributions are derivable from its own
//!   state, so removal subtracts exactly what was added; a rejected call changes nothing;
//! - aggregates never underflow (saturating arithmetic, `debug_assert` in tests), and a
//!   worker's aggregate is zero again once all its requests left;
//! - memory is bounded by the active requests (one map entry each, holding its hashes)
//!   plus one small record per worker slot seen; the service caps active requests;
//! - costs: route / first token / progress / finish are O(1) expected, plus O(log n) in
//!   the worker's prefill set under `predicted`; `remove_worker` is O(active requests).
//!
//! In the service a request is owned by the core chosen by its id; every core has its
//! own tracker, and readers sum the per-core [`WorkerAgg`]s (see [`WorkerAgg::add`]).

pub use super::agg::{WorkerAgg, WorkerLoad};
pub use super::request::{CarriedRequest, Finished, LifecycleError, NewRequest, RequestInfo};

use super::agg::OldestPrefill;
use super::predictor::PrefillPredictor;
use super::request::{check_id, output_blocks_milli, FinishReason, Req};
use crate::config::{PrefillLoadModel, RouterConfig};
use crate::types::WorkerSlot;
use std::collections::BTreeMap;

type Map<K, V> = hashbrown::HashMap<K, V, ahash::RandomState>;

/// Per-worker state of one tracker.
#[derive(Clone, Debug, Default)]
struct WorkerState {
    agg: WorkerAgg,
    /// Active prefills on this worker by (routed_at_us, seq) → (tokens, predicted_us).
    /// Maintained only under the `predicted` model.
    prefills: BTreeMap<(u64, u64), (u64, u64)>,
    dirty: bool,
}

impl WorkerState {
    fn refresh_oldest(&mut self) {
        self.agg.oldest_prefill =
            self.prefills
                .first_key_value()
                .map(
                    |(&(started_us, _), &(tokens, predicted_us))| OldestPrefill {
                        started_us,
                        tokens,
                        predicted_us,
                    },
                );
    }
}

fn sub_u64(a: &mut u64, b: u64) {
    debug_assert!(*a >= b, "load aggregate underflow: {a} - {b}");
    *a = a.saturating_sub(b);
}

fn sub_u32(a: &mut u32, b: u32) {
    debug_assert!(*a >= b, "load aggregate underflow: {a} - {b}");
    *a = a.saturating_sub(b);
}

/// Per-worker slots and the dirty list, borrowed separately from the request map.
#[derive(Clone, Debug, Default)]
struct Workers {
    slots: Vec<WorkerState>,
    dirty: Vec<WorkerSlot>,
}

impl Workers {
    /// The worker's state, created on first use and marked dirty (the caller is about
    /// to change its aggregate).
    fn touch(&mut self, w: WorkerSlot) -> &mut WorkerState {
        let i = usize::from(w);
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, WorkerState::default);
        }
        let s = &mut self.slots[i];
        if !s.dirty {
            s.dirty = true;
            self.dirty.push(w);
        }
        s
    }

    fn add_prefill(&mut self, r: &Req, predicted: bool) {
        let s = self.touch(r.prefill_slot());
        let tokens = u64::from(r.effective_isl());
        s.agg.prefill_requests = s.agg.prefill_requests.saturating_add(1);
        s.agg.prefill_tokens = s.agg.prefill_tokens.saturating_add(tokens);
        if predicted {
            s.prefills.insert(r.prefill_key(), (tokens, r.predicted_us));
            s.refresh_oldest();
        }
    }

    fn remove_prefill(&mut self, r: &Req, predicted: bool) {
        let s = self.touch(r.prefill_slot());
        sub_u32(&mut s.agg.prefill_requests, 1);
        sub_u64(&mut s.agg.prefill_tokens, u64::from(r.effective_isl()));
        if predicted {
            let removed = s.prefills.remove(&r.prefill_key());
            debug_assert!(removed.is_some(), "prefill entry missing");
            s.refresh_oldest();
        }
    }

    fn add_decode(&mut self, r: &Req) {
        let s = self.touch(r.decode);
        s.agg.active_requests = s.agg.active_requests.saturating_add(1);
        s.agg.blocks_total = s
            .agg
            .blocks_total
            .saturating_add(u64::from(r.prompt_blocks));
        s.agg.output_blocks_milli = s.agg.output_blocks_milli.saturating_add(r.output_milli);
    }

    fn remove_decode(&mut self, r: &Req) {
        let s = self.touch(r.decode);
        sub_u32(&mut s.agg.active_requests, 1);
        sub_u64(&mut s.agg.blocks_total, u64::from(r.prompt_blocks));
        sub_u64(&mut s.agg.output_blocks_milli, r.output_milli);
    }

    fn set_output(&mut self, r: &mut Req, milli: u64) {
        if milli != r.output_milli {
            let s = self.touch(r.decode);
            sub_u64(&mut s.agg.output_blocks_milli, r.output_milli);
            s.agg.output_blocks_milli = s.agg.output_blocks_milli.saturating_add(milli);
            r.output_milli = milli;
        }
    }
}

/// One core's accounting of in-flight requests and per-worker load.
#[derive(Clone, Debug)]
pub struct LoadTracker {
    block_size: u32,
    model: PrefillLoadModel,
    track_output_blocks: bool,
    predictor: PrefillPredictor,
    requests: Map<String, Req>,
    workers: Workers,
    next_seq: u64,
}

impl LoadTracker {
    /// A tracker for blocks of `block_size` tokens, using `cfg.prefill_load_model`,
    /// `cfg.track_output_blocks`, `cfg.prefill_fallback_us` and
    /// `cfg.predictor_min_samples`.
    pub fn new(block_size: u32, cfg: &RouterConfig) -> Self {
        LoadTracker {
            block_size: block_size.max(1),
            model: cfg.prefill_load_model,
            track_output_blocks: cfg.track_output_blocks,
            predictor: PrefillPredictor::new(cfg.prefill_fallback_us, cfg.predictor_min_samples),
            requests: Map::default(),
            workers: Workers::default(),
            next_seq: 0,
        }
    }

    fn predicted(&self) -> bool {
        self.model == PrefillLoadModel::Predicted
    }

    /// Accounts a routing decision: the request's prefill load on its prefill worker and
    /// its prompt blocks on its decode worker.
    pub fn on_route(&mut self, r: NewRequest) -> Result<(), LifecycleError> {
        check_id(&r.id)?;
        // One hash lookup for the duplicate check and the insertion.
        let slot = match self.requests.entry(r.id) {
            hashbrown::hash_map::Entry::Occupied(_) => return Err(LifecycleError::Duplicate),
            hashbrown::hash_map::Entry::Vacant(v) => v,
        };
        let effective_isl = r.input_tokens.saturating_sub(r.cached_tokens);
        let predicted = self.model == PrefillLoadModel::Predicted;
        let predicted_us = if predicted {
            self.predictor.predict(effective_isl, r.cached_tokens)
        } else {
            0
        };
        let req = Req {
            decode: r.decode_worker,
            prefill: r.prefill_worker,
            input_tokens: r.input_tokens,
            cached_tokens: r.cached_tokens,
            prompt_blocks: r.prompt_blocks,
            hashes: r.hashes,
            osl: r.expected_output_tokens,
            routed_at_us: r.now_us,
            last_call_us: r.now_us,
            seq: self.next_seq,
            in_prefill: true,
            first_token_us: None,
            output_tokens: 0,
            output_milli: 0,
            predicted_us,
            carried: false,
            pinned: r.pinned,
        };
        self.next_seq += 1;
        self.workers.add_prefill(&req, predicted);
        self.workers.add_decode(&req);
        slot.insert(req);
        Ok(())
    }

    /// Prefill complete. Returns `Ok(true)` the first time, `Ok(false)` on a duplicate
    /// call (or after progress already implied it). The first call feeds the predictor
    /// with `(effective_isl, cached_tokens, now_us - routed_at)`; a clock earlier than
    /// the routing time gives no sample.
    pub fn on_first_token(&mut self, id: &str, now_us: u64) -> Result<bool, LifecycleError> {
        check_id(id)?;
        let predicted = self.predicted();
        let r = self
            .requests
            .get_mut(id)
            .ok_or(LifecycleError::UnknownRequest)?;
        r.last_call_us = r.last_call_us.max(now_us);
        if !r.in_prefill {
            return Ok(false);
        }
        self.workers.remove_prefill(r, predicted);
        r.in_prefill = false;
        r.first_token_us = Some(now_us);
        if let Some(d) = now_us.checked_sub(r.routed_at_us).filter(|_| !r.carried) {
            self.predictor
                .observe(r.effective_isl(), r.cached_tokens, d);
        }
        Ok(true)
    }

    /// Output progress: `output_tokens` is the total generated so far; values not above
    /// the last one are ignored (out-of-order notifications). A positive count implies
    /// the first token if it had not arrived (prefill load is released, but the
    /// predictor is not fed: the delay is only an upper bound of the prefill duration).
    /// `output_tokens = 0` carries no information and changes nothing but the
    /// request's TTL, which every lifecycle call restarts (a keep-alive).
    pub fn on_progress(
        &mut self,
        id: &str,
        output_tokens: u32,
        now_us: u64,
    ) -> Result<(), LifecycleError> {
        check_id(id)?;
        let predicted = self.predicted();
        let r = self
            .requests
            .get_mut(id)
            .ok_or(LifecycleError::UnknownRequest)?;
        r.last_call_us = r.last_call_us.max(now_us);
        if output_tokens == 0 {
            return Ok(());
        }
        if r.in_prefill {
            self.workers.remove_prefill(r, predicted);
            r.in_prefill = false;
            r.first_token_us = Some(now_us);
        }
        if output_tokens > r.output_tokens {
            r.output_tokens = output_tokens;
            if self.track_output_blocks {
                let milli = output_blocks_milli(output_tokens, self.block_size, r.osl);
                self.workers.set_output(r, milli);
            }
        }
        Ok(())
    }

    /// The request finished: removes every contribution it still has (prefill load too
    /// if no first token arrived) and hands back what the caller must undo elsewhere.
    /// A second finish is `UnknownRequest`. `now_us` is accepted for symmetry with the
    /// other calls; accounting does not depend on it.
    pub fn on_finish(&mut self, id: &str, now_us: u64) -> Result<Finished, LifecycleError> {
        let _ = now_us;
        self.take(id, FinishReason::Finished)
    }

    /// Prefill failed (disaggregated): accounted like a finish, so the frontend can
    /// route the same id again for its aggregated fallback.
    pub fn on_prefill_failed(&mut self, id: &str, now_us: u64) -> Result<Finished, LifecycleError> {
        let _ = now_us;
        self.take(id, FinishReason::PrefillFailed)
    }

    fn take(&mut self, id: &str, reason: FinishReason) -> Result<Finished, LifecycleError> {
        check_id(id)?;
        let (id, r) = self
            .requests
            .remove_entry(id)
            .ok_or(LifecycleError::UnknownRequest)?;
        self.release(&r);
        Ok(r.into_finished(id, reason))
    }

    fn release(&mut self, r: &Req) {
        if r.in_prefill {
            self.workers.remove_prefill(r, self.predicted());
        }
        self.workers.remove_decode(r);
    }

    /// Every active request, for a warm-restart snapshot taken at `now_us`.
    pub fn carry(&self, now_us: u64) -> Vec<CarriedRequest> {
        self.requests
            .iter()
            .map(|(id, r)| CarriedRequest {
                id: id.clone(),
                decode_worker: r.decode,
                prefill_worker: r.prefill,
                input_tokens: r.input_tokens,
                cached_tokens: r.cached_tokens,
                prompt_blocks: r.prompt_blocks,
                hashes: r.hashes.clone(),
                expected_output_tokens: r.osl,
                in_prefill: r.in_prefill,
                output_tokens: r.output_tokens,
                age_us: now_us.saturating_sub(r.routed_at_us),
                first_token_age_us: r.first_token_us.map(|t| now_us.saturating_sub(t)),
                idle_us: now_us.saturating_sub(r.last_call_us),
                pinned: r.pinned,
                local: !r.carried,
            })
            .collect()
    }

    /// Removes every request with no lifecycle call (nor routing) for `ttl_us` or more
    /// at `now_us` (their caller is gone: nothing else would ever end them), releasing
    /// every contribution as a finish does; their records come back with reason
    /// `Expired`, in no particular order. O(active requests).
    pub fn expire(&mut self, now_us: u64, ttl_us: u64) -> Vec<Finished> {
        let gone: Vec<(String, Req)> = self
            .requests
            .extract_if(|_, r| now_us.saturating_sub(r.last_call_us) >= ttl_us)
            .collect();
        let mut out = Vec::with_capacity(gone.len());
        for (id, r) in gone {
            self.release(&r);
            out.push(r.into_finished(id, FinishReason::Expired));
        }
        out
    }

    /// Re-admits a request carried across a restart, at `now_us` of the new clock: it
    /// contributes exactly what it did when carried (prefill load if still in prefill,
    /// its prompt blocks and output placeholder blocks on its decode worker), and later
    /// lifecycle calls treat it like any other. Routing times before the new clock's
    /// start are clamped to 0; under `predicted` its prefill gets a fresh prediction.
    /// Its TTL runs from `now_us - idle_us`.
    pub fn restore(&mut self, c: CarriedRequest, now_us: u64) -> Result<(), LifecycleError> {
        check_id(&c.id)?;
        let slot = match self.requests.entry(c.id) {
            hashbrown::hash_map::Entry::Occupied(_) => return Err(LifecycleError::Duplicate),
            hashbrown::hash_map::Entry::Vacant(v) => v,
        };
        let predicted = self.model == PrefillLoadModel::Predicted;
        let effective_isl = c.input_tokens.saturating_sub(c.cached_tokens);
        let mut req = Req {
            decode: c.decode_worker,
            prefill: c.prefill_worker,
            input_tokens: c.input_tokens,
            cached_tokens: c.cached_tokens,
            prompt_blocks: c.prompt_blocks,
            hashes: c.hashes,
            osl: c.expected_output_tokens,
            routed_at_us: now_us.saturating_sub(c.age_us),
            last_call_us: now_us.saturating_sub(c.idle_us),
            seq: self.next_seq,
            in_prefill: c.in_prefill,
            first_token_us: c.first_token_age_us.map(|a| now_us.saturating_sub(a)),
            output_tokens: c.output_tokens,
            output_milli: 0,
            predicted_us: if predicted {
                self.predictor.predict(effective_isl, c.cached_tokens)
            } else {
                0
            },
            carried: true,
            pinned: c.pinned,
        };
        self.next_seq += 1;
        if req.in_prefill {
            self.workers.add_prefill(&req, predicted);
        }
        self.workers.add_decode(&req);
        if self.track_output_blocks && req.output_tokens > 0 {
            let milli = output_blocks_milli(req.output_tokens, self.block_size, req.osl);
            self.workers.set_output(&mut req, milli);
        }
        slot.insert(req);
        Ok(())
    }

    /// Worker `w` was removed (or re-registered with a new epoch): every request
    /// decoding on it leaves the tracker (their records are returned, in no particular
    /// order, so hashes can be removed from active-block shards); requests still in
    /// prefill on it but decoding elsewhere stay, with their prefill load released (a
    /// later `on_prefill_failed` or `on_finish` still works). Afterwards `agg(w)` is
    /// zero. O(active requests).
    pub fn remove_worker(&mut self, w: WorkerSlot) -> Vec<Finished> {
        let predicted = self.predicted();
        let gone: Vec<(String, Req)> = self.requests.extract_if(|_, r| r.decode == w).collect();
        let mut out = Vec::with_capacity(gone.len());
        for (id, r) in gone {
            self.release(&r);
            out.push(r.into_finished(id, FinishReason::WorkerRemoved));
        }
        for r in self.requests.values_mut() {
            if r.in_prefill && r.prefill_slot() == w {
                self.workers.remove_prefill(r, predicted);
                r.in_prefill = false;
            }
        }
        if let Some(s) = self.workers.slots.get(usize::from(w)) {
            debug_assert!(s.agg.is_zero() && s.prefills.is_empty(), "{:?}", s.agg);
            if !s.agg.is_zero() || !s.prefills.is_empty() {
                let s = self.workers.touch(w);
                s.agg = WorkerAgg::default();
                s.prefills.clear();
            }
        }
        out
    }

    /// This tracker's additive aggregate for worker `w` (zero if unknown).
    pub fn agg(&self, w: WorkerSlot) -> WorkerAgg {
        self.workers
            .slots
            .get(usize::from(w))
            .map(|s| s.agg)
            .unwrap_or_default()
    }

    /// This tracker's own view of `w`'s load at `now_us` (a single-core service or
    /// tests; a multi-core reader sums [`WorkerAgg`]s first, then calls
    /// [`WorkerAgg::load`]).
    pub fn load(&self, w: WorkerSlot, now_us: u64) -> WorkerLoad {
        self.agg(w).load(self.model, now_us)
    }

    /// Appends the workers whose aggregate changed since the previous call (each once)
    /// and resets the change marks, so the service republishes only those.
    pub fn take_dirty(&mut self, out: &mut Vec<WorkerSlot>) {
        for &w in &self.workers.dirty {
            if let Some(s) = self.workers.slots.get_mut(usize::from(w)) {
                s.dirty = false;
            }
        }
        out.append(&mut self.workers.dirty);
    }

    /// Number of active requests in this tracker.
    pub fn active_requests(&self) -> usize {
        self.requests.len()
    }

    /// Snapshot of an active request.
    pub fn get(&self, id: &str) -> Option<RequestInfo> {
        self.requests.get(id).map(Req::info)
    }

    /// The prefill-duration predictor (fed by first tokens).
    pub fn predictor(&self) -> &PrefillPredictor {
        &self.predictor
    }

    /// The prefill load model this tracker maintains.
    pub fn model(&self) -> PrefillLoadModel {
        self.model
    }

    /// Tokens per block used for output placeholder blocks.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
}
