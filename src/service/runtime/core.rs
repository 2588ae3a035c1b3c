//! One core: its index shard, active-block shard and request tracker, the handler for
//! messages from other cores, and the waiters of tasks expecting replies.
//!
//! All state is core-local (`RefCell`, never borrowed across an `.await`). Handlers are
//! synchronous; messages they produce go to an outbox that the run loop flushes, so a
//! full peer mailbox never blocks message handling (and two cores can never deadlock
//! waiting on each other's queues).
//!
//! The per-core operations live in submodules by concern: `index` (applying KV-event
//! batches, forgetting a worker), `requests` (commit, lifecycle calls, active-block
//! fan-out, replica calls, expiry) and `wait` (tasks waiting for replies).

mod dump;
mod index;
mod requests;
mod wait;

pub use requests::expiry_loop;
pub use wait::WaitReply;

use crate::index::{ApproxShard, IndexShard, PendingShard, ShardAnswer};
use crate::load::{ActiveBlocksShard, LoadTracker, NewRequest};
use crate::service::runtime::msg::{Lane, Msg, QueryAnswer, Reply, Retained, SpecAdd};
use crate::service::runtime::shared::Shared;
use crate::sync::board::Published;
use crate::types::{Tier, WorkerSlot};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use wait::Waits;

pub struct CoreState {
    pub index: IndexShard,
    pub active: ActiveBlocksShard,
    /// Pending-cached blocks of this shard (speculative indexing).
    pub speculative: PendingShard,
    /// Modelled blocks of this shard's approximate workers (`index::approx`).
    pub approx: ApproxShard,
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
    pub(in crate::service) fn mark(&mut self, slot: WorkerSlot) {
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

pub struct Core {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub st: RefCell<CoreState>,
    waits: Waits,
    outbox: RefCell<VecDeque<(usize, Msg)>>,
}

impl Core {
    /// Registers a waiter for a reply from another core and returns its query id.
    pub fn new_wait(&self) -> u64 {
        self.waits.register()
    }

    /// Resolves when the reply for `qid` has arrived.
    pub fn wait(&self, qid: u64) -> WaitReply<'_> {
        self.waits.wait(qid)
    }

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
                // Sharded, a worker's blocks spread over the cores; replicated, every
                // core's copy holds them all.
                approx: ApproxShard::new(
                    cfg.approximate_ttl_ms.saturating_mul(1000),
                    shared.budget_of(id).clone(),
                    1 << shared.shard_bits,
                ),
                tracker: LoadTracker::new(cfg.block_size, cfg),
                pending: HashSet::new(),
                retained: HashMap::new(),
                rng: SmallRng::seed_from_u64(0x6b76_726f_7574_6500 ^ id as u64),
                scratch: Vec::new(),
                dirty: Vec::new(),
                dirty_mark: vec![false; slots],
            }),
            waits: Waits::default(),
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

    // ---- sending -------------------------------------------------------------------

    /// Queues a message from a handler; flushed by the run loop.
    fn post(&self, to: usize, msg: Msg) {
        self.outbox.borrow_mut().push_back((to, msg));
    }

    /// Sends what the peers' mailboxes accept; returns true when the outbox is empty.
    pub fn flush(&self) -> bool {
        let mut ob = self.outbox.borrow_mut();
        while let Some((to, msg)) = ob.pop_front() {
            // This core's own updates ring no doorbell (`broadcast_active` wakes the
            // run loop locally).
            let sent = if to == self.id && matches!(msg, Msg::Active { .. }) {
                self.shared.mailbox(to, msg.lane()).push_quiet(msg)
            } else {
                self.shared.try_send(to, msg)
            };
            if let Err(m) = sent {
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

    /// Queries this core's shard: index matches, active-block reuse, pending
    /// (speculative) and modelled (approximate) blocks (and checks a request id is
    /// unknown here, if asked: `Some(true)` when free).
    pub fn local_query(&self, items: &[(u32, u64)], check_id: Option<&str>) -> QueryAnswer {
        let st = self.st.borrow();
        let mut answer = ShardAnswer::default();
        st.index.query(items, &mut answer);
        let mut reuse = Vec::new();
        st.active.count_reuse(items, &mut reuse);
        let mut spec = Vec::new();
        let now = self.shared.now_us();
        st.speculative.query(items, now, &mut spec);
        st.approx.query(items, now, &mut spec);
        let id_free = check_id.map(|id| !st.knows(id));
        QueryAnswer {
            answer,
            reuse,
            spec,
            id_free,
        }
    }

    /// Claims request id `id` on this core for a routing in progress; `false` when
    /// this core already routes or holds a request with that id, or (replicated) any
    /// core does.
    pub fn claim(&self, id: &str) -> bool {
        let mut st = self.st.borrow_mut();
        if st.knows(id) || !self.register(id) {
            return false;
        }
        st.pending.insert(id.to_string());
        true
    }

    /// Drops the claim of a routing that failed.
    pub fn release(&self, id: &str) {
        if self.st.borrow_mut().pending.remove(id) {
            self.unregister(id);
        }
    }

    /// Replicated: registers `id` as this core's in the service-wide register
    /// (`claims`); `false` when another core holds it. Always `true` when there is no
    /// register, and for the proxy's own ids (unique by construction).
    pub(crate) fn register(&self, id: &str) -> bool {
        match &self.shared.claims {
            Some(c) if !crate::ids::is_proxy_id(id) => c.claim(id, self.id),
            _ => true,
        }
    }

    /// Replicated: `id` no longer lives on this core (its routing failed or its
    /// request ended).
    pub(crate) fn unregister(&self, id: &str) {
        if let Some(c) = &self.shared.claims {
            if !crate::ids::is_proxy_id(id) {
                c.release(id, self.id);
            }
        }
    }

    /// Handles what other cores queued for this core without waking it (their
    /// active-block updates: `Msg::is_quiet`), with everything queued before those, so
    /// that a decision here counts every request committed elsewhere before it began.
    pub fn catch_up(&self) {
        let urgent = self.shared.mailbox(self.id, Lane::Urgent);
        if urgent.is_empty() {
            return;
        }
        // What is queued now, not what keeps arriving meanwhile.
        for _ in 0..urgent.len() {
            let Some(m) = urgent.pop() else { break };
            self.handle(m);
        }
        self.after_local();
    }

    /// Distinct active blocks of worker `slot` in this core's shard (every block,
    /// when replicated).
    pub fn unique_blocks(&self, slot: WorkerSlot) -> u64 {
        self.st.borrow().active.unique_blocks(slot)
    }

    /// Active requests plus reservations on this core.
    pub fn load_count(&self) -> usize {
        let st = self.st.borrow();
        st.tracker.active_requests() + st.pending.len()
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
                crate::service::runtime::answer_spin::query_arrived();
                let answer = self.local_query(&items, check_id.as_deref());
                self.post(
                    from,
                    Msg::Answer {
                        qid,
                        answer: Box::new(answer),
                    },
                );
            }
            Msg::Answer { qid, answer } => self.waits.complete(qid, Reply::Answer(*answer)),
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
            Msg::LifecycleDone { qid, result } => {
                self.waits.complete(qid, Reply::Lifecycle(result))
            }
            Msg::Snapshot(collect) => collect.put(self.id, self.dump()),
            Msg::Barrier { from, qid } => self.post(from, Msg::Applied { qid }),
            Msg::Applied { qid } => self.waits.complete(qid, Reply::Applied),
            Msg::Replica(op) => self.apply_replica(*op),
            Msg::Expect => {
                let waits = &self.shared.metrics.answer_waits;
                waits
                    .get_or_create(&crate::service::metrics::KindLabel { kind: "expected" })
                    .inc();
                crate::service::runtime::answer_spin::expect(Duration::from_micros(
                    self.shared.settings.answer_spin_us,
                ));
            }
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
            // Replicated: the other copies hold the same blocks; only core 0 counts them.
            let reports = self.shared.reports_index(self.id);
            let p = Published {
                agg: st.tracker.agg(slot),
                blocks_unique: if reports {
                    st.active.unique_blocks(slot)
                } else {
                    0
                },
                cached_blocks: if reports {
                    st.index.worker_blocks(slot)
                } else {
                    0
                },
            };
            self.shared.board.publish(self.id, slot, &p);
            let tiers =
                Tier::ALL.map(|t| u64::from(reports) * st.index.worker_tier_blocks(slot, t));
            self.shared
                .status
                .counters
                .publish_tiers(self.id, slot, tiers);
        }
    }
}
