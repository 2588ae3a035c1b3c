//! One logical admission queue per model for all the cores of a replica, and the
//! wake-up protocol that hands freed capacity to the request that goes next
//! (docs/POLICIES.md "Across cores").
//!
//! A request enters on any core and capacity frees on any core (a request ends where
//! it was proxied), so per-core queues would serve by core, not by priority: a core
//! with an idle queue would let its own newcomers pass a higher-priority request
//! queued on another core. So the [`AdmissionQueue`] of a model is shared: it sits
//! behind a mutex held for one O(log n) operation at a time, and is touched only when
//! the model is saturated. Two atomics keep the unsaturated path off the lock:
//! `queued` (a mirror of the length, written under the lock) and `frees` (a count of
//! capacity releases, the *epoch*).
//!
//! Protocol (checked by the loom models of `tests/loom_admission.rs`):
//! - **arrival**: read [`SharedQueue::epoch`], then try to route. If that finds every
//!   eligible worker busy, [`SharedQueue::enqueue`] with the epoch read; it answers
//!   `recheck` when the epoch moved meanwhile (a release the request may have missed),
//!   and the caller then calls [`SharedQueue::kick`], which grants the best waiter
//!   (possibly another one). With an empty queue (`len() == 0`) a request routes
//!   directly; with a non-empty one it queues behind the others.
//! - **release**: publish the freed capacity (the load figures the router reads), then
//!   [`SharedQueue::freed`]: bumps the epoch and, if anyone waits, grants the best
//!   waiter. The epoch bump and the post-enqueue epoch read are both read-modify-writes
//!   (`AcqRel`), so of a release and an enqueue that race, at least one sees the other:
//!   either the release finds the entry, or the arrival sees the bump and kicks. No
//!   release is lost while someone waits.
//! - **grant**: a [`Grant`] is a "try now" for one waiter, made under the lock by
//!   moving its [`Waiter`] from waiting to granted. The caller delivers it to the
//!   waiter's core, which reads the epoch and routes; if the router still finds every
//!   worker busy, [`SharedQueue::retry`] puts the entry back with its ticket (its place)
//!   and rechecks as an arrival does.
//! - **nudge**: the safety net's periodic try ([`SharedQueue::nudge`]) wakes the best
//!   waiter that is not already trying *without* taking it out of the queue. While it
//!   tries it keeps its place, so a release meanwhile still finds it first and grants
//!   it: a speculative try cannot let a worse waiter take the capacity a release frees
//!   (a grant would take it out, and the release would go to the next one). A nudged
//!   try that a worker takes leaves the queue then ([`SharedQueue::served`]), and a
//!   grant that reached it while it tried passes to the next waiter; one that bounces
//!   simply waits on in its place (`retry`).
//! - **leaving**: a client that goes away, or a waiter whose own timer fires, calls
//!   [`SharedQueue::leave`]: it moves the waiter from waiting to gone and removes the
//!   entry (O(log n)). If a grant got there first, the grant is not wasted: `leave`
//!   passes it to the next waiter.
//! - **outcomes decided under the lock** (displaced from a full queue, expired by
//!   [`SharedQueue::expire`]) move the waiter to `refused` / `expired` and are returned
//!   to the caller, who tells the waiter's core.
//!
//! Each waiter's state moves exactly once away from waiting (a compare-and-swap), so
//! every request has exactly one outcome even when a grant, a displacement, an expiry
//! and the client's departure race.
//!
//! What it does not guarantee: order between a request that routes directly (it read
//! `len() == 0`) and one being queued at that moment (the direct one may go first);
//! and the router's busy figures are the router's, so a grant may find the capacity
//! taken again (then the entry keeps its place and waits for the next release).

use super::queue::{AdmissionQueue, Entry, Left, QueueConfig, Refused, Ticket};
use crate::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
#[cfg(loom)]
use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::{Arc, Mutex, MutexGuard};

const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const GONE: u8 = 2;
const REFUSED: u8 = 3;
const EXPIRED: u8 = 4;

/// A waiter's nudge (`Waiter::nudge`): none; nudged, not yet acted on; trying.
const IDLE: u8 = 0;
const NUDGED: u8 = 1;
const TRYING: u8 = 2;

/// Where a waiting request stands, as its own core sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaiterState {
    Waiting,
    /// Granted a try: route now.
    Granted,
    /// It left (client gone or its own timer).
    Gone,
    /// Displaced from a full queue: answer 429.
    Refused,
    /// The queue timed it out: answer 429.
    Expired,
}

/// The shared state of one waiting request (its core keeps an `Arc` of it).
#[derive(Debug)]
pub struct Waiter {
    state: AtomicU8,
    /// The tick's nudge, apart from `state`: a nudged waiter is still waiting, queued.
    nudge: AtomicU8,
}

impl Waiter {
    fn new() -> Waiter {
        Waiter {
            state: AtomicU8::new(WAITING),
            nudge: AtomicU8::new(IDLE),
        }
    }

    /// Takes a nudge (see the module docs): true if the waiter was nudged, and is now
    /// trying in its place.
    pub fn take_nudge(&self) -> bool {
        self.nudge
            .compare_exchange(NUDGED, TRYING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Nudges the waiter unless it is trying already (its try would miss the nudge).
    fn offer_nudge(&self) -> bool {
        match self
            .nudge
            .compare_exchange(IDLE, NUDGED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == NUDGED,
        }
    }

    /// Forgets a nudge (the waiter was granted instead, or its try ended).
    pub fn clear_nudge(&self) {
        self.nudge.store(IDLE, Ordering::Release);
    }

    pub fn state(&self) -> WaiterState {
        match self.state.load(Ordering::Acquire) {
            WAITING => WaiterState::Waiting,
            GRANTED => WaiterState::Granted,
            GONE => WaiterState::Gone,
            REFUSED => WaiterState::Refused,
            _ => WaiterState::Expired,
        }
    }

    /// Moves the waiter from waiting to `to`; false if it had already left waiting.
    fn settle(&self, to: u8) -> bool {
        self.state
            .compare_exchange(WAITING, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// What the queue holds per waiting request.
#[derive(Debug)]
pub struct Waiting<T> {
    pub waiter: Arc<Waiter>,
    pub item: T,
}

/// A waiter that left the queue by a decision taken under the lock (granted, refused,
/// expired), to be told on its core.
pub type Notice<T> = Left<Waiting<T>>;

/// A "try now" for one waiter (see the module docs).
pub type Grant<T> = Notice<T>;

/// A request that was queued.
#[derive(Debug)]
pub struct Enqueued<T> {
    pub ticket: Ticket,
    pub waiter: Arc<Waiter>,
    /// The epoch moved since the caller read it: call [`SharedQueue::kick`].
    pub recheck: bool,
    /// The entry this one displaced from a full queue (now [`WaiterState::Refused`]).
    pub displaced: Option<Notice<T>>,
}

/// What [`SharedQueue::leave`] did.
#[derive(Debug)]
pub enum Leave<T> {
    /// The entry was removed (or was already out): the request is no longer queued.
    Removed,
    /// A grant had reached the waiter first; it was passed on to this next waiter
    /// (`None`: nobody else waits).
    PassedOn(Option<Grant<T>>),
    /// The waiter had already been refused or expired by the queue.
    AlreadyOut(WaiterState),
}

/// One model's admission queue shared by the cores. See the module docs.
#[derive(Debug)]
pub struct SharedQueue<T> {
    inner: Mutex<AdmissionQueue<Waiting<T>>>,
    queued: AtomicUsize,
    frees: AtomicU64,
    /// 1 + when the last grant was made (0: none yet); written under the lock.
    last_grant: AtomicU64,
}

impl<T> SharedQueue<T> {
    pub fn new(cfg: QueueConfig) -> SharedQueue<T> {
        SharedQueue {
            inner: Mutex::new(AdmissionQueue::new(cfg)),
            queued: AtomicUsize::new(0),
            frees: AtomicU64::new(0),
            last_grant: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, AdmissionQueue<Waiting<T>>> {
        // A panic while holding the lock cannot leave the queue half-changed (its
        // operations do not panic); take it over rather than propagate the poison.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish_len(&self, q: &AdmissionQueue<Waiting<T>>) {
        self.queued.store(q.len(), Ordering::Release);
    }

    /// Requests waiting (a lock-free read, as of the last change).
    pub fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity epoch: read it before trying to route.
    pub fn epoch(&self) -> u64 {
        self.frees.load(Ordering::Acquire)
    }

    /// Queues a request that found no capacity (`seen`: the epoch read before trying).
    pub fn enqueue(&self, e: Entry<T>, seen: u64) -> Result<Enqueued<T>, Refused<T>> {
        let waiter = Arc::new(Waiter::new());
        let entry = Entry {
            item: Waiting {
                waiter: waiter.clone(),
                item: e.item,
            },
            priority: e.priority,
            deadline_us: e.deadline_us,
            tenant: e.tenant,
            arrival_us: e.arrival_us,
        };
        let pushed = {
            let mut q = self.lock();
            let r = q.push(entry);
            self.publish_len(&q);
            r
        };
        match pushed {
            Ok(p) => Ok(Enqueued {
                ticket: p.ticket,
                waiter,
                recheck: self.moved_since(seen),
                displaced: p.displaced.filter(|d| d.item.waiter.settle(REFUSED)),
            }),
            Err(r) => Err(Refused {
                reason: r.reason,
                item: r.item.item,
            }),
        }
    }

    /// Whether a release happened since `seen` (a read-modify-write, so that it is
    /// ordered against a racing release's bump; see the module docs).
    fn moved_since(&self, seen: u64) -> bool {
        #[cfg(loom)]
        if crate::sync::faults::active(crate::sync::faults::Fault::AdmissionSkipRecheck) {
            return false;
        }
        self.frees.fetch_add(0, Ordering::AcqRel) != seen
    }

    /// Capacity was released (after the router's figures show it): grants the best
    /// waiter, if any. Deliver the grant to its core.
    pub fn freed(&self, now_us: u64) -> Option<Grant<T>> {
        self.frees.fetch_add(1, Ordering::AcqRel);
        if self.is_empty() {
            return None;
        }
        self.kick(now_us)
    }

    /// Grants the best waiter, if any (after a `recheck`, or a grant that found its
    /// waiter gone). Entries whose waiter left meanwhile are dropped on the way.
    pub fn kick(&self, now_us: u64) -> Option<Grant<T>> {
        self.kick_where(now_us, usize::MAX, |_| true)
    }

    /// [`SharedQueue::kick`] for the first of the next `max_scan` waiters that `fits`
    /// the freed capacity (e.g. whose allow-list holds the worker that freed).
    pub fn kick_where(
        &self,
        now_us: u64,
        max_scan: usize,
        mut fits: impl FnMut(&T) -> bool,
    ) -> Option<Grant<T>> {
        let mut q = self.lock();
        let mut grant = None;
        while let Some(a) = q.pop_where(now_us, max_scan, |w| fits(&w.item)) {
            if a.item.waiter.settle(GRANTED) {
                self.last_grant
                    .store(now_us.saturating_add(1), Ordering::Release);
                grant = Some(a);
                break;
            }
            // Its waiter left and is about to find it gone: drop it, try the next.
        }
        self.publish_len(&q);
        grant
    }

    /// A granted request found every worker busy after all: it takes its place again
    /// (its ticket) and waits for the next release. `seen`: the epoch read before the
    /// attempt. A refusal (the queue filled up meanwhile) leaves the waiter
    /// [`WaiterState::Refused`]. A nudged try (still waiting, in its place) has nothing
    /// to put back: any release during its try found it there. Nor has one the queue
    /// refused or timed out while it tried: its waiter's state says so.
    pub fn retry(&self, g: Grant<T>, seen: u64) -> Result<Requeued<T>, Refused<T>> {
        g.item.waiter.clear_nudge();
        if g.item.waiter.state() != WaiterState::Granted {
            return Ok(Requeued {
                recheck: false,
                displaced: None,
            });
        }
        // Back to waiting before it is visible in the queue again; no one else can
        // change a granted waiter's state.
        g.item.waiter.state.store(WAITING, Ordering::Release);
        let waiter = g.item.waiter.clone();
        let pushed = {
            let mut q = self.lock();
            let r = q.requeue(g);
            self.publish_len(&q);
            r
        };
        match pushed {
            Ok(p) => Ok(Requeued {
                recheck: self.moved_since(seen),
                displaced: p.displaced.filter(|d| d.item.waiter.settle(REFUSED)),
            }),
            Err(r) => {
                waiter.settle(REFUSED);
                Err(Refused {
                    reason: r.reason,
                    item: r.item.item,
                })
            }
        }
    }

    /// The safety net's tick: nudges the best of the first `max_scan` waiters that is
    /// not already trying (see the module docs) and returns its item, to be woken. It
    /// stays in its place. Nothing within `quiet_us` of the last grant: a grant in
    /// flight is a try already, and a nudge to a worse waiter could beat it to the
    /// capacity it was given.
    pub fn nudge(&self, now_us: u64, quiet_us: u64, max_scan: usize) -> Option<T>
    where
        T: Clone,
    {
        #[cfg(loom)]
        if crate::sync::faults::active(crate::sync::faults::Fault::AdmissionNudgeTakes) {
            return self.kick(now_us).map(|g| g.item.item);
        }
        let q = self.lock();
        let last = self.last_grant.load(Ordering::Acquire);
        if last != 0 && now_us.saturating_sub(last - 1) < quiet_us {
            return None;
        }
        let (_, w) = q
            .iter()
            .take(max_scan)
            .find(|(_, w)| w.waiter.state() == WaiterState::Waiting && w.waiter.offer_nudge())?;
        Some(w.item.clone())
    }

    /// A worker took the request `g` let try. A nudged one leaves the queue now
    /// (counted admitted); a grant that reached it while it tried was not what let it
    /// through, and passes to the next waiter (returned, to be delivered).
    pub fn served(&self, g: &Grant<T>, now_us: u64) -> Option<Grant<T>> {
        let w = &g.item.waiter;
        let nudged = w.nudge.swap(IDLE, Ordering::AcqRel) == TRYING;
        if w.settle(GONE) {
            let mut q = self.lock();
            q.take(g.ticket, now_us);
            self.publish_len(&q);
            return None;
        }
        if nudged && w.state() == WaiterState::Granted {
            w.state.store(GONE, Ordering::Release);
            return self.kick(now_us);
        }
        None
    }

    /// The request leaves the queue (client gone, or its own timer): O(log n). A grant
    /// that had reached it is passed on (see [`Leave`]).
    pub fn leave(&self, ticket: Ticket, waiter: &Waiter, now_us: u64) -> Leave<T> {
        if waiter.settle(GONE) {
            let mut q = self.lock();
            q.cancel(ticket, now_us);
            self.publish_len(&q);
            return Leave::Removed;
        }
        match waiter.state() {
            WaiterState::Granted => {
                waiter.state.store(GONE, Ordering::Release);
                #[cfg(loom)]
                if crate::sync::faults::active(crate::sync::faults::Fault::AdmissionDropGrant) {
                    return Leave::PassedOn(None);
                }
                Leave::PassedOn(self.kick(now_us))
            }
            s => Leave::AlreadyOut(s),
        }
    }

    /// Times out the entries whose time is up (a sweep, besides the waiters' own
    /// timers); the waiters are [`WaiterState::Expired`] and returned to be told.
    pub fn expire(&self, now_us: u64, out: &mut Vec<Notice<T>>) {
        let mut timed_out = Vec::new();
        {
            let mut q = self.lock();
            q.expire(now_us, &mut timed_out);
            self.publish_len(&q);
        }
        // A waiter that left meanwhile is not told twice.
        out.extend(
            timed_out
                .into_iter()
                .filter(|n| n.item.waiter.settle(EXPIRED)),
        );
    }

    /// The queue's counters (a lock).
    pub fn counters(&self) -> super::queue::Counters {
        self.lock().counters()
    }

    /// Runs `f` on the queue under the lock (status pages, tests).
    pub fn with<R>(&self, f: impl FnOnce(&AdmissionQueue<Waiting<T>>) -> R) -> R {
        f(&self.lock())
    }
}

/// What [`SharedQueue::retry`] did.
#[derive(Debug)]
pub struct Requeued<T> {
    /// The epoch moved since the caller read it: call [`SharedQueue::kick`].
    pub recheck: bool,
    pub displaced: Option<Notice<T>>,
}

#[cfg(all(test, not(loom)))]
mod tests;
