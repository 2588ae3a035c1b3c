//! The admission queue of one model on one replica: requests that found no worker
//! below its busy threshold (or the proxy at its concurrency cap) wait here instead of
//! getting a 429 at once (docs/POLICIES.md "The queue").
//!
//! A pure state machine: no I/O, no clock (every call takes `now_us`), no threads
//! (`shared` puts it behind a lock for the cores). It decides the order, the bounds and
//! the outcomes; the caller owns the per-worker busy state and asks for the next
//! request when capacity frees ([`AdmissionQueue::pop`], [`AdmissionQueue::pop_where`]).
//!
//! **Order.** Each entry gets a [`Ticket`] at arrival: `(rank, deadline, arrival, seq)`,
//! compared in that order, lowest first, where
//! `rank = priority + floor(arrival_us / aging_us)`. So entries of one aging step are
//! served by priority class (vLLM's convention: lower first), then earliest deadline,
//! then arrival; and an entry that waits one more aging step outranks the next class
//! up. The key never changes while an entry waits, so the queue is one ordered map.
//!
//! **Aging bound.** With priorities clamped to `[-max_priority, max_priority]`, an
//! entry of priority `p` is passed only by entries that arrived before the end of the
//! aging step `p + max_priority` steps after its own: a request arriving more than
//! `(p + max_priority + 1) × aging_us` after it always ranks behind it. Its wait is
//! therefore bounded by that window plus the time to serve what arrived before the
//! window closed (at most `max_len` entries): no priority is starved forever. With
//! `aging_us = 0` there is no aging (strict priority, then deadline, then arrival);
//! the wait timeout still bounds every wait.
//!
//! **Bounds** (all checked before anything is stored): at most `max_len` entries; a
//! tenant holds at most `max(1, tenant_share × max_len)` of them; an entry leaves at
//! `min(arrival + max_wait_us, deadline)` at the latest (a request that can no longer
//! meet its deadline is not worth serving late). When the queue is full, a newcomer
//! that ranks before the last entry takes its place and the last entry is refused, so
//! a burst of low-priority requests cannot lock out a high-priority one.
//!
//! **Outcomes**: admitted ([`Admitted`], with the time waited), queued ([`Pushed`]),
//! refused ([`Refused`]: full or over the tenant's share), timed out
//! ([`AdmissionQueue::expire`]), cancelled ([`AdmissionQueue::cancel`], the client went
//! away: O(log n) by ticket). [`Counters`] count them by reason for the metrics.
//!
//! Guarantees: every operation is O(log n) (`pop_where`: O(k log n) for a scan of k);
//! memory is bounded by `max_len` entries; no operation panics on any input; each
//! entry leaves exactly once, by exactly one outcome.

use hashbrown::HashMap;
use std::collections::BTreeMap;

/// The queue's bounds and aging (`[admission]` settings; see `config`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueueConfig {
    /// Most entries queued at once (0 = nothing is ever queued).
    pub max_len: usize,
    /// The longest an entry may wait, µs.
    pub max_wait_us: u64,
    /// Share of `max_len` one tenant may hold, in (0, 1].
    pub tenant_share: f64,
    /// One priority class of aging per this many µs of waiting; 0 = no aging.
    pub aging_us: u64,
    /// Priorities are clamped to `[-max_priority, max_priority]`.
    pub max_priority: i32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_len: 1024,
            max_wait_us: 30_000_000,
            tenant_share: 0.5,
            aging_us: 1_000_000,
            max_priority: 10,
        }
    }
}

impl QueueConfig {
    /// Entries one tenant may hold: `max(1, floor(tenant_share × max_len))`.
    pub fn tenant_cap(&self) -> usize {
        let share = if self.tenant_share.is_finite() {
            self.tenant_share.clamp(0.0, 1.0)
        } else {
            1.0
        };
        ((share * self.max_len as f64) as usize).max(1)
    }

    /// `priority` clamped to the configured range.
    pub fn clamp_priority(&self, priority: i32) -> i32 {
        let m = self.max_priority.max(0);
        priority.clamp(-m, m)
    }
}

/// Where an entry stands in the queue; also the handle to cancel it. Ordered: the
/// lowest ticket is served first (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    /// Priority class plus the aging steps elapsed at arrival.
    pub rank: i64,
    /// The request's deadline, µs (`u64::MAX`: none).
    pub deadline_us: u64,
    pub arrival_us: u64,
    /// Arrival order on this queue (unique).
    pub seq: u64,
}

/// A request asking to wait.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry<T> {
    /// The caller's handle of the waiting request.
    pub item: T,
    /// Priority (lower is served first); clamped by the queue.
    pub priority: i32,
    /// Deadline, µs on the caller's clock, if the request has one.
    pub deadline_us: Option<u64>,
    /// The tenant (a hash of its identity), if tenants are configured.
    pub tenant: Option<u64>,
    pub arrival_us: u64,
}

/// Why a request was not queued (or was pushed out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The queue is full (`max_len`), and the request does not rank before the last
    /// entry (or it was that last entry, displaced by a better one).
    Full,
    /// Its tenant already holds its share of the queue.
    TenantShare,
}

impl Refusal {
    /// Metric label.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Full => "full",
            Refusal::TenantShare => "tenant_share",
        }
    }
}

/// A request that was not queued, returned to the caller.
#[derive(Clone, Debug, PartialEq)]
pub struct Refused<T> {
    pub reason: Refusal,
    pub item: T,
}

/// A request that was queued.
#[derive(Clone, Debug, PartialEq)]
pub struct Pushed<T> {
    pub ticket: Ticket,
    /// The entry this one displaced from a full queue: refused, [`Refusal::Full`].
    pub displaced: Option<Left<T>>,
}

/// A request that left the queue, and how long it waited.
#[derive(Clone, Debug, PartialEq)]
pub struct Left<T> {
    pub ticket: Ticket,
    pub item: T,
    pub tenant: Option<u64>,
    pub waited_us: u64,
}

/// A request taken from the queue to be routed now.
pub type Admitted<T> = Left<T>;

/// Outcomes so far, by reason (monotonic; the metrics read them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub queued: u64,
    pub admitted: u64,
    pub refused_full: u64,
    pub refused_tenant: u64,
    pub timed_out: u64,
    pub cancelled: u64,
}

#[derive(Clone, Debug)]
struct Slot<T> {
    item: T,
    tenant: Option<u64>,
    expires_us: u64,
}

/// One model's admission queue. See the module docs.
#[derive(Clone, Debug)]
pub struct AdmissionQueue<T> {
    cfg: QueueConfig,
    order: BTreeMap<Ticket, Slot<T>>,
    /// `(expires, seq)` → ticket, for the timeouts.
    expiry: BTreeMap<(u64, u64), Ticket>,
    /// Entries per tenant (only tenants with entries).
    tenants: HashMap<u64, usize>,
    next_seq: u64,
    counters: Counters,
}

impl<T> AdmissionQueue<T> {
    pub fn new(cfg: QueueConfig) -> AdmissionQueue<T> {
        AdmissionQueue {
            cfg,
            order: BTreeMap::new(),
            expiry: BTreeMap::new(),
            tenants: HashMap::new(),
            next_seq: 0,
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &QueueConfig {
        &self.cfg
    }

    /// Entries waiting.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Entries of `tenant` waiting.
    pub fn tenant_len(&self, tenant: u64) -> usize {
        self.tenants.get(&tenant).copied().unwrap_or(0)
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// The ticket an entry arriving now would get (its place in the order).
    pub fn ticket_for(&self, priority: i32, deadline_us: Option<u64>, arrival_us: u64) -> Ticket {
        let p = i64::from(self.cfg.clamp_priority(priority));
        let epoch = arrival_us.checked_div(self.cfg.aging_us).unwrap_or(0);
        Ticket {
            rank: p.saturating_add(i64::try_from(epoch).unwrap_or(i64::MAX)),
            deadline_us: deadline_us.unwrap_or(u64::MAX),
            arrival_us,
            seq: self.next_seq,
        }
    }

    /// Queues `e`, or says why not. On a full queue, `e` takes the place of the last
    /// entry if it ranks before it ([`Pushed::displaced`]).
    pub fn push(&mut self, e: Entry<T>) -> Result<Pushed<T>, Refused<T>> {
        let ticket = self.ticket_for(e.priority, e.deadline_us, e.arrival_us);
        self.insert(ticket, e.item, e.tenant, e.arrival_us)
    }

    /// Puts an entry taken by [`AdmissionQueue::pop`] back with its own ticket (its
    /// place in the order), e.g. when the router found every worker busy after all.
    /// Bounds apply as to a new entry.
    pub fn requeue(&mut self, a: Admitted<T>) -> Result<Pushed<T>, Refused<T>> {
        self.insert(a.ticket, a.item, a.tenant, a.ticket.arrival_us)
    }

    fn insert(
        &mut self,
        ticket: Ticket,
        item: T,
        tenant: Option<u64>,
        arrival_us: u64,
    ) -> Result<Pushed<T>, Refused<T>> {
        if let Some(t) = tenant {
            if self.tenant_len(t) >= self.cfg.tenant_cap() {
                self.counters.refused_tenant += 1;
                return Err(Refused {
                    reason: Refusal::TenantShare,
                    item,
                });
            }
        }
        let mut displaced = None;
        if self.order.len() >= self.cfg.max_len {
            match self.order.last_key_value().map(|(k, _)| *k) {
                Some(last) if ticket < last => {
                    displaced = self.remove(last, arrival_us);
                    self.counters.refused_full += 1;
                }
                _ => {
                    self.counters.refused_full += 1;
                    return Err(Refused {
                        reason: Refusal::Full,
                        item,
                    });
                }
            }
        }
        let limit = ticket.arrival_us.saturating_add(self.cfg.max_wait_us);
        let expires_us = limit.min(ticket.deadline_us);
        self.next_seq = self.next_seq.max(ticket.seq.saturating_add(1));
        self.expiry.insert((expires_us, ticket.seq), ticket);
        if let Some(t) = tenant {
            *self.tenants.entry(t).or_insert(0) += 1;
        }
        self.order.insert(
            ticket,
            Slot {
                item,
                tenant,
                expires_us,
            },
        );
        self.counters.queued += 1;
        Ok(Pushed { ticket, displaced })
    }

    /// Removes `ticket`'s entry (no counter), its waiting time measured at `now_us`.
    fn remove(&mut self, ticket: Ticket, now_us: u64) -> Option<Left<T>> {
        let slot = self.order.remove(&ticket)?;
        self.expiry.remove(&(slot.expires_us, ticket.seq));
        if let Some(t) = slot.tenant {
            if let Some(n) = self.tenants.get_mut(&t) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.tenants.remove(&t);
                }
            }
        }
        Some(Left {
            ticket,
            item: slot.item,
            tenant: slot.tenant,
            waited_us: now_us.saturating_sub(ticket.arrival_us),
        })
    }

    /// The entry that goes next, if any.
    pub fn peek(&self) -> Option<(&Ticket, &T)> {
        self.order.first_key_value().map(|(k, s)| (k, &s.item))
    }

    /// Takes the entry that goes next (capacity freed for it).
    pub fn pop(&mut self, now_us: u64) -> Option<Admitted<T>> {
        let first = *self.order.first_key_value()?.0;
        let a = self.remove(first, now_us)?;
        self.counters.admitted += 1;
        Some(a)
    }

    /// Takes the first entry, in order, among the first `max_scan` for which `fits`
    /// holds (the capacity that freed suits it: e.g. the freed worker is in its
    /// allow-list). Entries scanned past keep their place.
    pub fn pop_where(
        &mut self,
        now_us: u64,
        max_scan: usize,
        mut fits: impl FnMut(&T) -> bool,
    ) -> Option<Admitted<T>> {
        let pick = self
            .order
            .iter()
            .take(max_scan)
            .find(|(_, s)| fits(&s.item))
            .map(|(k, _)| *k)?;
        let a = self.remove(pick, now_us)?;
        self.counters.admitted += 1;
        Some(a)
    }

    /// Takes `ticket`'s entry, served in its place (it tried without leaving the queue
    /// and a worker took it): counted admitted. `None` if the ticket is not queued.
    pub fn take(&mut self, ticket: Ticket, now_us: u64) -> Option<Admitted<T>> {
        let a = self.remove(ticket, now_us)?;
        self.counters.admitted += 1;
        Some(a)
    }

    /// The client went away: its entry leaves at once (O(log n)). `None` if the ticket
    /// is not queued (already admitted, expired or cancelled).
    pub fn cancel(&mut self, ticket: Ticket, now_us: u64) -> Option<Left<T>> {
        let l = self.remove(ticket, now_us)?;
        self.counters.cancelled += 1;
        Some(l)
    }

    /// When the next entry times out, if any (for the caller's timer).
    pub fn next_expiry(&self) -> Option<u64> {
        self.expiry.first_key_value().map(|((t, _), _)| *t)
    }

    /// Moves every entry whose time is up at `now_us` (wait timeout or deadline) to
    /// `out`, earliest first.
    pub fn expire(&mut self, now_us: u64, out: &mut Vec<Left<T>>) {
        while let Some((&(at, _), &ticket)) = self.expiry.first_key_value() {
            if at > now_us {
                break;
            }
            match self.remove(ticket, now_us) {
                Some(l) => {
                    self.counters.timed_out += 1;
                    out.push(l);
                }
                None => {
                    // Unreachable by construction (both maps change together); never
                    // loop on a stale index entry.
                    self.expiry.remove(&(at, ticket.seq));
                }
            }
        }
    }

    /// Every waiting entry, in order (for status pages and tests).
    pub fn iter(&self) -> impl Iterator<Item = (&Ticket, &T)> {
        self.order.iter().map(|(k, s)| (k, &s.item))
    }
}

#[cfg(test)]
mod tests;
