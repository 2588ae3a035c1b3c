//! A proxied request waiting in its model's admission queue for a worker below its
//! busy threshold (docs/POLICIES.md "The queue"), on the core that accepted it.
//!
//! [`wait_turn`] enqueues the request (or puts a granted one that found every worker
//! busy again back in its place) and waits for the first of:
//! - a grant (capacity freed, `policies::Policies::freed`): [`Turn::Go`], route again;
//! - a displacement by a better request on a full queue: 429 `queue_full`;
//! - its time limit (`max_wait_ms`, or its deadline header if sooner): it leaves the
//!   queue, 429 `queue_timeout` with `retry-after` (also when the limit passed while a
//!   grant it held was trying the workers);
//! - its client going away (`watch`): it leaves the queue at once ([`Turn::Left`]);
//! - a nudge from the periodic tick ([`TICK`]) to the queue's best waiter: a try in its
//!   place (`SharedQueue::nudge`), in case capacity freed without a proxied request
//!   ending on this replica: [`Turn::Go`] too.
//!
//! The turn is [`Held`] while the request tries the workers: served, it leaves the
//! queue ([`Held::served`]); bounced, it goes back to [`wait_turn`] as `prior`; dropped
//! on any other way out (an error, the client gone), it leaves the queue and a grant it
//! held passes to the next waiter.
//!
//! [`wait_for_slot`] does the same for a request that found the proxy at
//! `proxy.max_concurrent`, in the replica's slot queue.
//!
//! A grant that reaches a request as it leaves is passed on to the next waiter
//! (`SharedQueue::leave`), so no freed capacity is lost. Every path out of the queue
//! updates the depth gauge and counts its reason.

use super::policies::{Front, Policies, Queue, Wake};
use super::respond::{overloaded, Resp};
use super::state::ProxyShared;
use super::watch::Gone;
use crate::admission::queue::{Entry, Refusal};
use crate::admission::shared::{Grant, Leave, Waiter, WaiterState, Waiting};
use crate::admission::Ticket;
use futures_lite::FutureExt;
use std::sync::Arc;
use std::time::Duration;

/// How often a waiting request checks that the queue's best waiter got a try.
pub const TICK: Duration = Duration::from_millis(100);

/// How a wait ended.
pub enum Turn {
    /// Capacity freed for this request (a grant), or the tick nudged it: route it again
    /// (give the turn back to [`wait_turn`] if every worker is busy after all).
    Go(Held),
    /// Answer this (429).
    Answer(Resp),
    /// The client went away; the request left the queue.
    Left,
}

enum Event {
    Woken,
    Gone,
    Tick,
}

fn full() -> Resp {
    overloaded(
        "queue_full",
        "every worker is busy and the admission queue is full; retry later",
        1,
    )
}

fn timed_out(waited_ms: u64) -> Resp {
    overloaded(
        "queue_timeout",
        &format!(
            "every worker stayed busy for the {waited_ms} ms this request waited; retry later"
        ),
        1,
    )
}

/// A request's turn from its queue, held while it tries the workers (see the module
/// docs).
pub struct Held {
    grant: Option<Grant<Wake>>,
    queue: Arc<Queue>,
    model: Box<str>,
    state: Arc<ProxyShared>,
}

impl Held {
    /// How long the request waited for this turn, µs.
    pub fn waited_us(&self) -> u64 {
        self.grant.as_ref().map_or(0, |g| g.waited_us)
    }

    /// A worker took the request: it leaves the queue if it tried in its place, and
    /// its wait is measured.
    pub fn served(mut self) {
        let (Some(g), Some(p)) = (self.grant.take(), self.state.policies.get()) else {
            return;
        };
        p.admitted(&g);
        p.deliver(self.queue.served(&g, p.now_us()));
        p.show_depth(&self.model, &self.queue);
    }

    fn ticket(&self) -> Option<Ticket> {
        self.grant.as_ref().map(|g| g.ticket)
    }

    fn into_grant(mut self) -> Option<Grant<Wake>> {
        self.grant.take()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let (Some(g), Some(p)) = (self.grant.take(), self.state.policies.get()) else {
            return;
        };
        if let Leave::PassedOn(n) = self.queue.leave(g.ticket, &g.item.waiter, p.now_us()) {
            p.deliver(n);
        }
        p.show_depth(&self.model, &self.queue);
    }
}

/// Waits for this request's turn in `q` (the queue of `model`): enqueued anew, or back
/// in its place with `prior` (a turn that found every worker busy). `seen`: the
/// queue's epoch read before the routing attempt that found every worker busy.
pub async fn wait_turn(
    st: &Arc<ProxyShared>,
    model: &str,
    q: &Arc<Queue>,
    front: &Front,
    seen: u64,
    prior: Option<Held>,
    gone: &mut Gone,
) -> Turn {
    // The callers wait only where the proxy has policies.
    let Some(p) = st.policies.get() else {
        return Turn::Answer(full());
    };
    // Its time ran out while it tried (a turn that bounced off busy workers): it
    // leaves (the dropped turn passes a grant on) instead of taking its place again, so
    // turns that keep bouncing cannot hold a request past its time limit.
    if let Some(t) = prior.as_ref().and_then(Held::ticket) {
        if p.now_us() >= until(p, &t) {
            drop(prior);
            return expired(p, model, q, t);
        }
    }
    let prior = prior.and_then(Held::into_grant);
    let wake: Wake;
    let waiter: Arc<Waiter>;
    let ticket: Ticket;
    match prior {
        Some(g) => {
            wake = g.item.item.clone();
            waiter = g.item.waiter.clone();
            ticket = g.ticket;
            match q.retry(g, seen) {
                Ok(r) => {
                    p.deliver(r.displaced);
                    if r.recheck {
                        p.deliver(q.kick(p.now_us()));
                    }
                }
                Err(r) => return refused(p, model, q, r.reason),
            }
        }
        None => {
            wake = Arc::new(tokio::sync::Notify::new());
            let e = Entry {
                item: wake.clone(),
                priority: front.hints.priority,
                deadline_us: front.hints.deadline_us,
                tenant: front.tenant.map(|t| t.id),
                arrival_us: p.now_us(),
            };
            match q.enqueue(e, seen) {
                Ok(enq) => {
                    p.metrics.queued.inc();
                    p.deliver(enq.displaced);
                    if enq.recheck {
                        p.deliver(q.kick(p.now_us()));
                    }
                    waiter = enq.waiter;
                    ticket = enq.ticket;
                }
                Err(r) => return refused(p, model, q, r.reason),
            }
        }
    }
    p.show_depth(model, q);
    let until_us = until(p, &ticket);
    let held = |waiter, wake| Held {
        grant: Some(Grant {
            ticket,
            item: Waiting { waiter, item: wake },
            tenant: front.tenant.map(|t| t.id),
            waited_us: p.now_us().saturating_sub(ticket.arrival_us),
        }),
        queue: q.clone(),
        model: model.into(),
        state: st.clone(),
    };
    loop {
        match waiter.state() {
            WaiterState::Granted => {
                waiter.clear_nudge();
                p.show_depth(model, q);
                return Turn::Go(held(waiter, wake));
            }
            WaiterState::Waiting if waiter.take_nudge() => return Turn::Go(held(waiter, wake)),
            WaiterState::Refused => {
                p.metrics.drop_reason("full");
                p.show_depth(model, q);
                return Turn::Answer(full());
            }
            WaiterState::Expired => return expired(p, model, q, ticket),
            WaiterState::Gone => return Turn::Left,
            WaiterState::Waiting => {}
        }
        let now = p.now_us();
        if now >= until_us {
            return match q.leave(ticket, &waiter, now) {
                Leave::Removed => expired(p, model, q, ticket),
                Leave::PassedOn(g) => {
                    p.deliver(g);
                    expired(p, model, q, ticket)
                }
                Leave::AlreadyOut(WaiterState::Refused) => {
                    p.metrics.drop_reason("full");
                    Turn::Answer(full())
                }
                Leave::AlreadyOut(_) => expired(p, model, q, ticket),
            };
        }
        let nap = Duration::from_micros(until_us - now).min(TICK);
        let ev = async {
            wake.notified().await;
            Event::Woken
        }
        .or(async {
            (&mut *gone).await;
            Event::Gone
        })
        .or(async {
            glommio::timer::sleep(nap).await;
            Event::Tick
        })
        .await;
        match ev {
            Event::Woken => {}
            Event::Tick => p.tick(q, TICK.as_micros() as u64),
            Event::Gone => {
                match q.leave(ticket, &waiter, p.now_us()) {
                    Leave::PassedOn(g) => p.deliver(g),
                    Leave::Removed | Leave::AlreadyOut(_) => {}
                }
                p.metrics.drop_reason("client_gone");
                p.show_depth(model, q);
                return Turn::Left;
            }
        }
    }
}

/// When a request's wait ends: `max_wait_ms` after its arrival, or its deadline if
/// sooner (µs on the queues' clock).
fn until(p: &Policies, t: &Ticket) -> u64 {
    let max_wait = p.settings.max_wait_ms.saturating_mul(1000);
    t.arrival_us.saturating_add(max_wait).min(t.deadline_us)
}

fn refused(p: &Policies, model: &str, q: &Queue, why: Refusal) -> Turn {
    p.metrics.drop_reason(why.name());
    p.show_depth(model, q);
    Turn::Answer(match why {
        Refusal::Full => full(),
        Refusal::TenantShare => overloaded(
            "queue_tenant_share",
            "every worker is busy and this tenant already holds its share of the admission queue; retry later",
            1,
        ),
    })
}

fn expired(p: &Policies, model: &str, q: &Queue, ticket: Ticket) -> Turn {
    p.metrics.drop_reason("timeout");
    p.show_depth(model, q);
    let waited = p.now_us().saturating_sub(ticket.arrival_us) / 1000;
    Turn::Answer(timed_out(waited))
}

/// The depth gauge's label of the slot queue (`proxy.max_concurrent`).
pub const SLOTS_LABEL: &str = "(proxy.max_concurrent)";

/// How waiting for a proxied-request slot ended.
pub enum Slot {
    Admitted(super::state::Admitted),
    /// Answer this (429, or nothing to read: the client left).
    Answer(Resp),
    /// No queueing (off, or a malformed hint): the usual immediate 429.
    Off,
}

/// `proxy.max_concurrent` is reached (and `admission.queue_at_max_concurrent` is on):
/// the request waits for a slot in the replica's
/// slot queue, ordered by the hints of its headers (the body is not read yet, so it
/// holds no memory beyond its connection), with the bounds and answers of the model
/// queues. A slot freed when a proxied request ends goes to the best waiter.
pub async fn wait_for_slot(
    sh: &super::front::Front,
    headers: &hyper::HeaderMap,
    watch: &std::rc::Rc<super::watch::ClientWatch>,
) -> Slot {
    let on = |p: &&Policies| p.queueing() && p.settings.queue_at_max_concurrent;
    let Some(p) = sh.state.policies.get().filter(on) else {
        return Slot::Off;
    };
    let Some(front) = p.front_of_headers(headers) else {
        return Slot::Off;
    };
    let max = sh.handle.settings().proxy.max_concurrent;
    let q = p.slots().clone();
    let mut gone = watch.gone();
    let mut prior: Option<Held> = None;
    loop {
        let seen = q.epoch();
        if prior.is_some() || q.is_empty() {
            if let Some(a) = ProxyShared::admit(&sh.state, max) {
                if let Some(h) = prior.take() {
                    h.served();
                }
                return Slot::Admitted(a);
            }
        }
        match wait_turn(
            &sh.state,
            SLOTS_LABEL,
            &q,
            &front,
            seen,
            prior.take(),
            &mut gone,
        )
        .await
        {
            Turn::Go(g) => prior = Some(g),
            Turn::Answer(r) => return Slot::Answer(r),
            Turn::Left => {
                return Slot::Answer(super::respond::error(
                    hyper::StatusCode::from_u16(499).unwrap_or(hyper::StatusCode::BAD_REQUEST),
                    "invalid_request_error",
                    "client_closed_request",
                    "the client closed the connection",
                ))
            }
        }
    }
}
