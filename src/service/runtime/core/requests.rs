//! Requests on one core: committing a routed request, lifecycle calls (first token,
//! progress, finish, prefill failure), the active-block updates they fan out to every
//! shard, the `--record` trace offer, a peer replica's routing / lifecycle calls
//! (`--cluster`), and the expiry of requests nobody calls about (`request_ttl_ms`).
//!
//! Guarantees: a request's active blocks are added on every shard when it is committed
//! and removed on every shard when it ends (finish, prefill failure or expiry), exactly
//! once, every shard applying them before its own next decision or answer (short
//! updates ring no doorbell: `Msg::is_quiet`; the committing core applies a long one
//! after its answer when its shard is the whole index); a committed request (a peer
//! replica's too) touches its prompt's blocks in the approximate model of every shard
//! when the worker prefilling it is approximate, and its end leaves them there; a
//! lifecycle call for a request that does not live on this core answers
//! `UnknownRequest` without side effects; a replica's calls are applied but never
//! published again; a request with no lifecycle call for `request_ttl_ms` leaves within
//! about an eighth of that more ([`expiry_loop`]), counted and logged.

use super::Core;
use crate::engine::EngineError;
use crate::load::{LifecycleError, NewRequest};
use crate::service::runtime::msg::{LifeOp, LifeOutcome, Msg, ReplicaOp, Retained, SpecAdd};
use crate::types::WorkerSlot;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Runs [`Core::expire_idle`] (and reclaims expired approximate-mode blocks) every
/// eighth of `request_ttl_ms` or `approximate_ttl_ms`, the shorter (50 ms to 5 s),
/// until shutdown.
pub async fn expiry_loop(core: Rc<Core>) {
    let ttl = core.shared.settings.request_ttl_ms;
    let approx_ttl = core.shared.settings.router.approximate_ttl_ms;
    let every = Duration::from_millis((ttl.min(approx_ttl) / 8).clamp(50, 5_000));
    loop {
        glommio::timer::sleep(every).await;
        if core
            .shared
            .stopping
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        core.expire_modelled();
        if core.expire_idle() > 0 {
            core.after_local();
        }
    }
}

impl Core {
    pub(super) fn commit(
        &self,
        req: NewRequest,
        retained: Option<Box<Retained>>,
        spec: Option<SpecAdd>,
    ) {
        crate::service::runtime::cluster_hooks::publish_route(&self.shared, &req);
        let hashes: Arc<[u64]> = Arc::from(req.hashes.as_slice());
        let slot = req.decode_worker;
        let id = req.id.clone();
        {
            let mut st = self.st.borrow_mut();
            st.pending.remove(&id);
            st.mark(slot);
            if let Some(p) = req.prefill_worker {
                st.mark(p);
            }
            if st.tracker.on_route(req).is_err() {
                // Claimed ids cannot be duplicates; only the claim to undo.
                drop(st);
                self.unregister(&id);
                return;
            }
            if let Some(r) = retained {
                st.retained.insert(id, *r);
            }
        }
        self.broadcast_active(slot, true, hashes, spec);
    }

    /// Sends an active-block update to every shard. A long one (a prompt of
    /// `LOUD_ACTIVE` blocks or more) goes through this core's own inbox too, quietly,
    /// when its shard is the whole index (one core, or `replicated`): it is applied
    /// after the caller's answer is on its way (thousands of table updates) and before
    /// this core's next decision (`Core::catch_up`) or answer, and the run loop, if
    /// parked, is woken locally to apply it. A request's add and removal carry the same
    /// hashes, so both take the same way and stay in order. Shorter updates (a pass
    /// through the run loop costs more than they do) and a sharded core's share are
    /// applied at once (sharded decisions read the shares through the load board).
    pub(super) fn broadcast_active(
        &self,
        slot: WorkerSlot,
        add: bool,
        hashes: Arc<[u64]>,
        spec: Option<SpecAdd>,
    ) {
        let whole = self.shared.cores == 1 || self.shared.replicated;
        let defer = whole && hashes.len() >= crate::service::runtime::msg::LOUD_ACTIVE;
        for to in 0..self.shared.cores {
            if to == self.id && !defer {
                self.apply_active(slot, add, &hashes, spec);
                continue;
            }
            self.post(
                to,
                Msg::Active {
                    slot,
                    add,
                    hashes: hashes.clone(),
                    spec,
                },
            );
        }
        if defer {
            crate::service::runtime::answer_spin::wake_run_loop();
        }
    }

    pub(super) fn apply_active(
        &self,
        slot: WorkerSlot,
        add: bool,
        hashes: &[u64],
        spec: Option<SpecAdd>,
    ) {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let bits = self.shared.shard_bits;
        st.mark(slot);
        // Approximate mode: the worker prefilling an added request caches its prompt.
        let modelled = spec.filter(|sp| add && self.approximate(sp.slot));
        if self.shared.cores == 1 || self.shared.replicated {
            // This core's shard owns every hash: no filter, no copy.
            if add {
                st.active.add(slot, hashes);
            } else {
                st.active.remove(slot, hashes);
            }
            if let Some(sp) = modelled {
                st.approx.touch(sp.slot, hashes, self.shared.now_us());
            }
            if let Some(sp) = spec {
                let rest = hashes.get(sp.from as usize..).unwrap_or(&[]);
                if add {
                    st.speculative.add(sp.slot, rest, sp.now_us);
                } else if !st.speculative.is_empty() {
                    st.speculative.drop_hashes(sp.slot, rest);
                }
            }
            return;
        }
        // Branch-free: shard membership is a coin flip per hash with 2 cores, and the
        // filtering branch was ~8 % of a core's samples (`--cores 2`, 20k decisions/s).
        crate::service::runtime::msg::select_slice(hashes, self.id, bits, &mut st.scratch);
        if add {
            st.active.add(slot, &st.scratch);
        } else {
            st.active.remove(slot, &st.scratch);
        }
        if let Some(sp) = modelled {
            st.approx.touch(sp.slot, &st.scratch, self.shared.now_us());
        }
        if let Some(sp) = spec {
            let rest = hashes.get(sp.from as usize..).unwrap_or(&[]);
            crate::service::runtime::msg::select_slice(rest, self.id, bits, &mut st.scratch);
            if add {
                st.speculative.add(sp.slot, &st.scratch, sp.now_us);
            } else if !st.speculative.is_empty() {
                st.speculative.drop_hashes(sp.slot, &st.scratch);
            }
        }
    }

    /// `--cluster`: applies a peer replica's routing or lifecycle call. A routed
    /// request is admitted like a restored one (its owner core holds the record, every
    /// shard its active blocks); a lifecycle call runs wherever the record lives (the
    /// other cores answer `UnknownRequest` without side effects). Nothing is
    /// published again.
    pub(super) fn apply_replica(&self, op: ReplicaOp) {
        match op {
            ReplicaOp::Route(c) => {
                let (slot, prefill) = (c.decode_worker, c.prefill_worker);
                let hashes: Arc<[u64]> = Arc::from(c.hashes.as_slice());
                {
                    let mut st = self.st.borrow_mut();
                    st.mark(slot);
                    if let Some(p) = prefill {
                        st.mark(p);
                    }
                    // Replicated: an id another core of ours holds is refused here
                    // as the tracker refuses one this core holds.
                    if st.knows(&c.id) || !self.register(&c.id) {
                        return;
                    }
                    let now = self.shared.now_us();
                    let id = c.id.clone();
                    if st.tracker.restore(c, now).is_err() {
                        drop(st);
                        self.unregister(&id);
                        return;
                    }
                }
                // Nothing becomes pending here (`from` past the end), but the prompt is
                // touched in the model of an approximate prefill-side worker.
                let touch = super::super::msg::SpecAdd {
                    slot: prefill.unwrap_or(slot),
                    from: hashes.len() as u32,
                    now_us: self.shared.now_us(),
                };
                self.broadcast_active(slot, true, hashes, Some(touch));
            }
            ReplicaOp::Life(op, id) => {
                let _ = self.lifecycle_local(op, &id);
            }
            ReplicaOp::Carry(tx) => {
                let now = self.shared.now_us();
                let _ = tx.send(self.st.borrow().tracker.carry(now));
            }
        }
    }

    /// Runs a lifecycle call on this core; `UnknownRequest` (without side effects)
    /// when the request does not live here.
    pub fn lifecycle_local(&self, op: LifeOp, id: &str) -> Result<LifeOutcome, EngineError> {
        let now = self.shared.now_us();
        let map = |e: LifecycleError| match e {
            LifecycleError::Duplicate => EngineError::Duplicate(id.into()),
            LifecycleError::UnknownRequest => EngineError::UnknownRequest(id.into()),
            LifecycleError::InvalidId => {
                EngineError::BadRequest(format!("invalid request id {id:?}"))
            }
        };
        let mut osl = None;
        let finished = {
            let mut st = self.st.borrow_mut();
            if let Some(info) = st.tracker.get(id) {
                osl = info.expected_output_tokens;
                let (d, p) = (info.decode_worker, info.prefill_worker);
                st.mark(d);
                if let Some(p) = p {
                    st.mark(p);
                }
            }
            match op {
                LifeOp::FirstToken => {
                    st.tracker.on_first_token(id, now).map_err(map)?;
                    return Ok(LifeOutcome::Done);
                }
                LifeOp::Progress(n) => {
                    st.tracker.on_progress(id, n, now).map_err(map)?;
                    return Ok(LifeOutcome::Done);
                }
                LifeOp::Finish => {
                    let f = st.tracker.on_finish(id, now).map_err(map)?;
                    st.retained.remove(id);
                    (f, None)
                }
                LifeOp::PrefillFailed => {
                    let kept = st.retained.remove(id);
                    let f = st.tracker.on_prefill_failed(id, now).map_err(map)?;
                    (f, kept)
                }
            }
        };
        let (f, kept) = finished;
        // Ended here: the id is free again (a prefill failure's reroute claims anew).
        self.unregister(id);
        // A request that ended was prefilled: its worker's events have confirmed its
        // blocks by now, or will never do so; either way they stop being pending.
        let spec = SpecAdd {
            slot: f.prefill_worker.unwrap_or(f.decode_worker),
            from: 0,
            now_us: now,
        };
        let hashes: Arc<[u64]> = Arc::from(f.hashes.as_slice());
        if op == LifeOp::Finish {
            self.record(&f, osl, &hashes);
        }
        self.broadcast_active(f.decode_worker, false, hashes, Some(spec));
        match (op, kept) {
            (LifeOp::PrefillFailed, Some(r)) => Ok(LifeOutcome::Reroute(Box::new(r))),
            (LifeOp::PrefillFailed, None) => Err(EngineError::BadRequest(format!(
                "request {id:?} was not routed to a prefill worker"
            ))),
            _ => Ok(LifeOutcome::Done),
        }
    }

    /// Ends this core's requests with no lifecycle call for `request_ttl_ms`
    /// (`LoadTracker::expire`): their load and active blocks are released as a finish
    /// releases them (the trace records nothing: they did not finish), their ids are
    /// free again, and they are counted (`kvroute_requests_expired_total{reason="ttl"}`)
    /// and logged. Not published to peer replicas: each replica expires its own copy
    /// on the same lifecycle calls, and one that missed calls must not end a live
    /// request on the others. Returns how many expired.
    pub fn expire_idle(&self) -> usize {
        let sh = &self.shared;
        let now = sh.now_us();
        let ttl_ms = sh.settings.request_ttl_ms;
        let gone = {
            let mut st = self.st.borrow_mut();
            let gone = st.tracker.expire(now, ttl_ms.saturating_mul(1000));
            for f in &gone {
                st.retained.remove(&f.id);
                st.mark(f.decode_worker);
                if let Some(p) = f.prefill_worker {
                    st.mark(p);
                }
            }
            gone
        };
        for f in &gone {
            self.unregister(&f.id);
            let spec = SpecAdd {
                slot: f.prefill_worker.unwrap_or(f.decode_worker),
                from: 0,
                now_us: now,
            };
            let hashes: Arc<[u64]> = Arc::from(f.hashes.as_slice());
            self.broadcast_active(f.decode_worker, false, hashes, Some(spec));
        }
        if let Some(f) = gone.first() {
            sh.metrics.expired("ttl", gone.len() as u64);
            eprintln!(
                "kvroute: expired {} in-flight request(s) on core {} with no lifecycle call \
                 for request_ttl_ms ({ttl_ms} ms; e.g. {:?}); their load is released",
                gone.len(),
                self.id,
                f.id
            );
        }
        gone.len()
    }

    /// Whether worker `slot`'s cache is modelled (approximate mode).
    fn approximate(&self, slot: WorkerSlot) -> bool {
        self.shared
            .cells(slot)
            .is_some_and(|c| c.approximate.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Reclaims this shard's approximate-mode blocks past their idle TTL (and their
    /// budget; queries never report them anyway).
    pub fn expire_modelled(&self) {
        let now = self.shared.now_us();
        self.st.borrow_mut().approx.expire(now);
    }

    /// `--record`: offers the ended request to the trace writer (never blocks).
    fn record(&self, f: &crate::load::Finished, osl: Option<u32>, hashes: &Arc<[u64]>) {
        let Some(r) = self.shared.recorder.get() else {
            return;
        };
        let e = crate::record::Ended {
            routed_at_us: f.routed_at_us,
            input_tokens: f.input_tokens,
            output_tokens: f.output_tokens,
            expected_output_tokens: osl,
            first_token: f.first_token_us.is_some(),
            hashes: hashes.clone(),
        };
        if !r.offer(e) {
            self.shared.metrics.record_dropped.inc();
        }
    }
}
