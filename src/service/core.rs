//! One core: its index shard, active-block shard and request tracker, the handler for
//! messages from other cores, and the waiters of tasks expecting replies.
//!
//! All state is core-local (`RefCell`, never borrowed across an `.await`). Handlers are
//! synchronous; messages they produce go to an outbox that the run loop flushes, so a
//! full peer mailbox never blocks message handling (and two cores can never deadlock
//! waiting on each other's queues).

use super::ingest_slice::{IngestCursor, Piece};
use super::msg::{IndexOp, LifeOp, LifeOutcome, Msg, Reply, Retained, SpecAdd};
use super::shared::Shared;
use crate::engine::EngineError;
use crate::index::{IndexShard, PendingShard, ShardAnswer};
use crate::load::{ActiveBlocksShard, LifecycleError, LoadTracker, NewRequest};
use crate::sync::board::Published;
use crate::types::{Tier, WorkerSlot};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// [`Core::local_query`]'s answer: index matches, active-block reuse, pending
/// (position, worker) pairs, and whether the checked id is free here.
pub type LocalAnswer = (
    ShardAnswer,
    Vec<(WorkerSlot, u32)>,
    Vec<(u32, WorkerSlot)>,
    Option<bool>,
);

pub struct CoreState {
    pub index: IndexShard,
    pub active: ActiveBlocksShard,
    /// Pending-cached blocks of this shard (speculative indexing).
    pub speculative: PendingShard,
    pub tracker: LoadTracker,
    pub pending: HashSet<String>,
    pub retained: HashMap<String, Retained>,
    pub rng: SmallRng,
    scratch: Vec<u64>,
    dirty: Vec<WorkerSlot>,
    dirty_mark: Vec<bool>,
}

impl CoreState {
    /// Marks `slot`'s load figures for republishing on the board.
    pub(super) fn mark(&mut self, slot: WorkerSlot) {
        if let Some(m) = self.dirty_mark.get_mut(slot as usize) {
            if !*m {
                *m = true;
                self.dirty.push(slot);
            }
        }
    }

    /// This core routes (claimed, not yet committed) or holds a request `id`.
    fn knows(&self, id: &str) -> bool {
        self.pending.contains(id) || self.tracker.get(id).is_some()
    }
}

#[derive(Default)]
struct Waiter {
    reply: Option<Reply>,
    waker: Option<Waker>,
}

pub struct Core {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub st: RefCell<CoreState>,
    waiters: RefCell<HashMap<u64, Waiter>>,
    next_qid: Cell<u64>,
    outbox: RefCell<VecDeque<(usize, Msg)>>,
}

impl Core {
    pub fn new(id: usize, shared: Arc<Shared>, index: IndexShard) -> Core {
        let cfg = &shared.settings.router;
        let slots = shared.settings.limits.max_workers;
        let mut restored = vec![false; slots];
        index.for_each_live(|_, w, _| {
            if let Some(m) = restored.get_mut(w as usize) {
                *m = true;
            }
        });
        let core = Core {
            st: RefCell::new(CoreState {
                index,
                active: ActiveBlocksShard::new(),
                speculative: PendingShard::new(
                    cfg.speculative_ttl_ms.saturating_mul(1000),
                    cfg.speculative_max_blocks,
                ),
                tracker: LoadTracker::new(cfg.block_size, cfg),
                pending: HashSet::new(),
                retained: HashMap::new(),
                rng: SmallRng::seed_from_u64(0x6b76_726f_7574_6500 ^ id as u64),
                scratch: Vec::new(),
                dirty: Vec::new(),
                dirty_mark: vec![false; slots],
            }),
            waiters: RefCell::new(HashMap::new()),
            next_qid: Cell::new(1),
            outbox: RefCell::new(VecDeque::new()),
            id,
            shared,
        };
        // Restored entries: publish their workers' cached-block figures on first run.
        {
            let mut st = core.st.borrow_mut();
            for (slot, _) in restored.iter().enumerate().filter(|(_, r)| **r) {
                st.mark(slot as WorkerSlot);
            }
        }
        core
    }

    // ---- waiting for replies -------------------------------------------------------

    /// Registers a waiter and returns its query id.
    pub fn new_wait(&self) -> u64 {
        let q = self.next_qid.get();
        self.next_qid.set(q + 1);
        self.waiters.borrow_mut().insert(q, Waiter::default());
        q
    }

    /// Resolves when the reply for `qid` has arrived.
    pub fn wait(&self, qid: u64) -> WaitReply<'_> {
        WaitReply { core: self, qid }
    }

    fn complete(&self, qid: u64, reply: Reply) {
        let mut w = self.waiters.borrow_mut();
        if let Some(waiter) = w.get_mut(&qid) {
            waiter.reply = Some(reply);
            if let Some(k) = waiter.waker.take() {
                k.wake();
            }
        }
    }

    // ---- sending -------------------------------------------------------------------

    /// Queues a message from a handler; flushed by the run loop.
    fn post(&self, to: usize, msg: Msg) {
        self.outbox.borrow_mut().push_back((to, msg));
    }

    /// Sends what the peers' mailboxes accept; returns true when the outbox is empty.
    pub fn flush(&self) -> bool {
        let mut ob = self.outbox.borrow_mut();
        while let Some((to, msg)) = ob.pop_front() {
            if let Err(m) = self.shared.try_send(to, msg) {
                ob.push_front((to, m));
                return false;
            }
        }
        true
    }

    /// Sends from a task, waiting (backpressure) while the destination is full.
    pub async fn send(&self, to: usize, mut msg: Msg) {
        loop {
            match self.shared.try_send(to, msg) {
                Ok(()) => return,
                Err(m) => {
                    msg = m;
                    glommio::timer::sleep(Duration::from_micros(50)).await;
                }
            }
        }
    }

    // ---- local operations ----------------------------------------------------------

    /// Queries this core's shard: index matches, active-block reuse and pending
    /// (speculative) blocks (and checks a request id is unknown here, if asked:
    /// `Some(true)` when free).
    pub fn local_query(&self, items: &[(u32, u64)], check_id: Option<&str>) -> LocalAnswer {
        let st = self.st.borrow();
        let mut answer = ShardAnswer::default();
        st.index.query(items, &mut answer);
        let mut reuse = Vec::new();
        st.active.count_reuse(items, &mut reuse);
        let mut spec = Vec::new();
        st.speculative.query(items, self.shared.now_us(), &mut spec);
        let free = check_id.map(|id| !st.knows(id));
        (answer, reuse, spec, free)
    }

    /// Claims request id `id` on this core for a routing in progress; `false` when
    /// this core already routes or holds a request with that id.
    pub fn claim(&self, id: &str) -> bool {
        let mut st = self.st.borrow_mut();
        if st.knows(id) {
            return false;
        }
        st.pending.insert(id.to_string());
        true
    }

    /// Drops the claim of a routing that failed.
    pub fn release(&self, id: &str) {
        self.st.borrow_mut().pending.remove(id);
    }

    /// Active requests plus reservations on this core.
    pub fn load_count(&self) -> usize {
        let st = self.st.borrow();
        st.tracker.active_requests() + st.pending.len()
    }

    fn commit(&self, req: NewRequest, retained: Option<Box<Retained>>, spec: Option<SpecAdd>) {
        super::cluster_bridge::publish_route(&self.shared, &req);
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
                // Reserved ids cannot be duplicates; nothing to undo.
                return;
            }
            if let Some(r) = retained {
                st.retained.insert(id, *r);
            }
        }
        self.broadcast_active(slot, true, hashes, spec);
    }

    fn broadcast_active(
        &self,
        slot: WorkerSlot,
        add: bool,
        hashes: Arc<[u64]>,
        spec: Option<SpecAdd>,
    ) {
        for to in 0..self.shared.cores {
            if to == self.id {
                self.apply_active(slot, add, &hashes, spec);
            } else {
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
        }
    }

    fn apply_active(&self, slot: WorkerSlot, add: bool, hashes: &[u64], spec: Option<SpecAdd>) {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let bits = self.shared.shard_bits;
        // Branch-free: shard membership is a coin flip per hash with 2 cores, and the
        // filtering branch was ~8 % of a core's samples (`--cores 2`, 20k decisions/s).
        super::msg::select_slice(hashes, self.id, bits, &mut st.scratch);
        if add {
            st.active.add(slot, &st.scratch);
        } else {
            st.active.remove(slot, &st.scratch);
        }
        st.mark(slot);
        if let Some(sp) = spec {
            let rest = hashes.get(sp.from as usize..).unwrap_or(&[]);
            super::msg::select_slice(rest, self.id, bits, &mut st.scratch);
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
    fn apply_replica(&self, op: super::cluster_bridge::ReplicaOp) {
        use super::cluster_bridge::ReplicaOp;
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
                    let now = self.shared.now_us();
                    if st.tracker.restore(c, now).is_err() {
                        return;
                    }
                }
                self.broadcast_active(slot, true, hashes, None);
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

    /// Starts applying an index message slice by slice (`run_loop`); any other
    /// message is returned as is.
    pub fn begin_index(&self, msg: Msg) -> Result<IngestCursor, Msg> {
        let cur = IngestCursor::from_msg(msg)?;
        // Every core sees every index batch; core 0 notes it for the status page.
        if self.id == 0 && cur.ops().iter().any(|o| !matches!(o, IndexOp::SetCap(_))) {
            let now = self.shared.now_ms();
            self.shared.status.counters.cache_event(cur.slot(), now);
        }
        Ok(cur)
    }

    /// Applies the next slice of `cur`: at most `budget` of this shard's hashes
    /// (`ingest_slice`). Returns whether more remains. The slot's identity is checked
    /// before every slice, so a `Forget` handled between two slices drops the rest of
    /// a batch that was about the previous identity.
    pub fn apply_index_slice(&self, cur: &mut IngestCursor, budget: usize) -> bool {
        let slot = cur.slot();
        let current = self
            .shared
            .cells(slot)
            .map(|c| c.gen.load(Ordering::Acquire));
        if current != Some(cur.gen()) {
            return false; // about a previous identity of the slot
        }
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let bits = self.shared.shard_bits;
        let id = self.id;
        let metrics = &self.shared.metrics;
        let more = cur.step(
            budget,
            |hashes, out| hashes.select(id, bits, out),
            |piece| match piece {
                Piece::Stored(tier, hashes) => {
                    let o = st.index.stored(slot, tier, hashes);
                    if o.rejected > 0 {
                        metrics.index_refused(o.rejected, o.over_budget);
                    }
                    if !st.speculative.is_empty() {
                        st.speculative.confirm(slot, hashes);
                    }
                }
                Piece::Removed(tier, hashes) => {
                    st.index.removed(slot, tier, hashes);
                    if !st.speculative.is_empty() {
                        st.speculative.drop_hashes(slot, hashes);
                    }
                }
                Piece::Other(IndexOp::Cleared { tier }) => {
                    match tier {
                        Some(t) => st.index.clear_tier(slot, *t),
                        None => {
                            for t in Tier::ALL {
                                st.index.clear_tier(slot, t);
                            }
                        }
                    }
                    st.speculative.clear_worker(slot);
                }
                Piece::Other(IndexOp::SetCap(cap)) => st.index.set_worker_cap(slot, *cap),
                // Operations with hashes always come as `Stored` / `Removed` pieces.
                Piece::Other(IndexOp::Stored { .. } | IndexOp::Removed { .. }) => {}
            },
        );
        st.mark(slot);
        more
    }

    fn forget(&self, slot: WorkerSlot) {
        let mut st = self.st.borrow_mut();
        st.index.clear_worker(slot);
        st.active.clear_worker(slot);
        st.speculative.clear_worker(slot);
        for f in st.tracker.remove_worker(slot) {
            st.retained.remove(&f.id);
            // The decode worker's active blocks live in every shard: other shards drop
            // them on their own Forget (clear_worker) when decode_worker == slot; a
            // request that only prefilled on `slot` keeps its decode-side blocks.
            if f.decode_worker != slot {
                drop(st);
                self.broadcast_active(f.decode_worker, false, Arc::from(f.hashes.as_slice()), None);
                st = self.st.borrow_mut();
            }
        }
        st.mark(slot);
    }

    /// Handles one message from another core (or our own mailbox).
    pub fn handle(&self, msg: Msg) {
        match msg {
            m @ Msg::Index { .. } => {
                if let Ok(mut cur) = self.begin_index(m) {
                    while self.apply_index_slice(&mut cur, usize::MAX) {}
                }
            }
            Msg::Forget { slot } => self.forget(slot),
            Msg::Query {
                from,
                qid,
                items,
                check_id,
            } => {
                let (answer, reuse, spec, id_free) = self.local_query(&items, check_id.as_deref());
                self.post(
                    from,
                    Msg::Answer {
                        qid,
                        answer: Box::new(answer),
                        reuse,
                        spec,
                        id_free,
                    },
                );
            }
            Msg::Answer {
                qid,
                answer,
                reuse,
                spec,
                id_free,
            } => self.complete(
                qid,
                Reply::Answer {
                    answer: *answer,
                    reuse,
                    spec,
                    id_free,
                },
            ),
            Msg::Active {
                slot,
                add,
                hashes,
                spec,
            } => self.apply_active(slot, add, &hashes, spec),
            Msg::Lifecycle { from, qid, op, id } => {
                let result = self.lifecycle_local(op, &id);
                self.post(from, Msg::LifecycleDone { qid, result });
            }
            Msg::LifecycleDone { qid, result } => self.complete(qid, Reply::Lifecycle(result)),
            Msg::Snapshot(collect) => collect.put(self.id, super::persist::dump(self)),
            Msg::Barrier { from, qid } => self.post(from, Msg::Applied { qid }),
            Msg::Applied { qid } => self.complete(qid, Reply::Applied),
            Msg::Replica(op) => self.apply_replica(*op),
        }
    }

    /// Commits a request routed on this core (its home) and sends the active-block
    /// updates to the other shards.
    /// `spec`: where its prompt blocks become pending (speculative indexing).
    pub fn commit_here(&self, req: NewRequest, retained: Option<Retained>, spec: Option<SpecAdd>) {
        self.commit(req, retained.map(Box::new), spec);
        self.after_local();
    }

    /// After a handler ran inside a task (not the run loop): publish its load changes
    /// and send what it posted; if a peer is full, wake our run loop to retry.
    pub fn after_local(&self) {
        self.publish();
        if !self.flush() {
            self.shared.wake(self.id);
        }
    }

    /// Publishes the load figures of every worker touched since the last call.
    pub fn publish(&self) {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        for slot in st.dirty.drain(..) {
            if let Some(m) = st.dirty_mark.get_mut(slot as usize) {
                *m = false;
            }
            let p = Published {
                agg: st.tracker.agg(slot),
                blocks_unique: st.active.unique_blocks(slot),
                cached_blocks: st.index.worker_blocks(slot),
            };
            self.shared.board.publish(self.id, slot, &p);
            let tiers = Tier::ALL.map(|t| st.index.worker_tier_blocks(slot, t));
            self.shared
                .status
                .counters
                .publish_tiers(self.id, slot, tiers);
        }
    }
}

/// Future of [`Core::wait`].
pub struct WaitReply<'a> {
    core: &'a Core,
    qid: u64,
}

impl Future for WaitReply<'_> {
    type Output = Reply;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        let mut w = self.core.waiters.borrow_mut();
        match w.get_mut(&self.qid) {
            Some(waiter) => match waiter.reply.take() {
                Some(r) => {
                    w.remove(&self.qid);
                    Poll::Ready(r)
                }
                None => {
                    waiter.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            },
            // Never registered: cannot happen through the public API.
            None => Poll::Pending,
        }
    }
}

impl Drop for WaitReply<'_> {
    fn drop(&mut self) {
        // A cancelled wait (connection closed) must not leak its slot.
        if let Ok(mut w) = self.core.waiters.try_borrow_mut() {
            w.remove(&self.qid);
        }
    }
}
