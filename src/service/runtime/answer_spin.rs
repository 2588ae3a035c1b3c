//! Keeping a core awake while it awaits an answer from another core (`answer_spin_us`).
//!
//! With `--cores 2` every decision scatters its query to the other core's shard and
//! waits for the answer. If the asking core's run loop parks meanwhile, the answer
//! must ring its doorbell and the answer then pays a wake-up of the asking core (tens
//! of µs on a VM) on top of the other core's. So while one of this core's cross-core
//! queries is outstanding and younger than `answer_spin_us`, the run loop keeps
//! polling its inbox (yielding to its other tasks and to the executor's rings)
//! instead of parking; the answering core then finds it awake and rings no doorbell.
//!
//! Guarantees:
//! - the spin is bounded: it ends `answer_spin_us` after the *youngest* outstanding
//!   query was sent, whether or not the answer came (the loop then parks as before,
//!   and the answer wakes it through the doorbell: nothing is ever lost);
//! - a wait that is cancelled (its task dropped: the connection closed) ends its entry
//!   through [`Awaiting`]'s `Drop`, so entries never accumulate and a dead wait never
//!   keeps a core spinning past the bound;
//! - `answer_spin_us = 0` disables it (the loop behaves exactly as before).
//!
//! A run loop already parked when a task begins to wait is woken for it through
//! [`next_wait`] (a local waker, no system call), so it spins for that answer too.
//!
//! The other side of the round trip: a proxied request tokenizes its prompt before it
//! routes, and the core that owns the other shard would sleep through that and pay a
//! wake-up when the query comes. So the accepting core announces the query first
//! (`Msg::Expect`, sent before tokenizing: its doorbell wakes the other core while the
//! prompt is tokenized), and a core with an announced query not yet arrived spins the
//! same way, for at most `answer_spin_us` after the announcement ([`Expected`]).
//!
//! [`Outstanding`] is the pure bookkeeping (unit-tested here); the per-core instance
//! lives in a thread local (one executor per thread) so the router and the run loop
//! share it without passing it around.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The outstanding waits of one core, each with the time it began.
#[derive(Debug, Default)]
pub struct Outstanding {
    next: u64,
    /// Ticket → start. Tickets grow with time (one core, one clock), so the last
    /// entry is the youngest wait.
    live: BTreeMap<u64, Instant>,
}

impl Outstanding {
    /// Registers a wait begun at `now`; returns its ticket for [`Outstanding::end`].
    pub fn begin(&mut self, now: Instant) -> u64 {
        let t = self.next;
        self.next += 1;
        // A clock that stepped back must not make an older ticket look younger.
        let now = match self.live.last_key_value() {
            Some((_, &last)) if last > now => last,
            _ => now,
        };
        self.live.insert(t, now);
        t
    }

    /// The wait of `ticket` ended (answered or cancelled). Unknown tickets are ignored.
    pub fn end(&mut self, ticket: u64) {
        self.live.remove(&ticket);
    }

    /// Waits not yet ended.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Until when the consumer should stay awake for an answer: `bound` after the
    /// youngest outstanding wait began, or `None` (park as usual) when nothing is
    /// outstanding or the spin is disabled (`bound` zero).
    pub fn spin_until(&self, bound: Duration) -> Option<Instant> {
        if bound.is_zero() {
            return None;
        }
        let (_, &start) = self.live.last_key_value()?;
        start.checked_add(bound)
    }

    /// `true` while some wait is outstanding and younger than `bound` at `now`.
    pub fn should_spin(&self, bound: Duration, now: Instant) -> bool {
        self.spin_until(bound).is_some_and(|until| now < until)
    }
}

/// Queries other cores announced to this core but have not sent yet.
///
/// Guarantees: the spin ends `bound` after the youngest announcement, whether or not
/// its query came; then every announcement is forgotten, so a request that never
/// routes (a prompt that fails to tokenize, a closed connection) cannot keep the core
/// awake, and the count never grows without bound.
#[derive(Debug, Default)]
pub struct Expected {
    count: u32,
    until: Option<Instant>,
    /// Announced queries forgotten at the bound, not yet taken by
    /// [`Expected::take_expired`].
    expired: u64,
}

impl Expected {
    /// A query was announced at `now`; `bound` zero disables the spin.
    pub fn announce(&mut self, now: Instant, bound: Duration) {
        let Some(end) = now.checked_add(bound).filter(|_| !bound.is_zero()) else {
            return;
        };
        self.count = self.count.saturating_add(1);
        self.until = Some(self.until.map_or(end, |u| u.max(end)));
    }

    /// A query arrived: one announcement fewer to stay awake for.
    pub fn arrived(&mut self) {
        self.count = self.count.saturating_sub(1);
        if self.count == 0 {
            self.until = None;
        }
    }

    /// `true` while an announced query is awaited and the bound has not passed;
    /// forgets every announcement once it has.
    pub fn should_spin(&mut self, now: Instant) -> bool {
        match self.until {
            Some(u) if now < u => true,
            Some(_) => {
                self.expired += u64::from(self.count);
                self.count = 0;
                self.until = None;
                false
            }
            None => false,
        }
    }

    /// Announced queries not yet arrived (and not expired).
    pub fn pending(&self) -> u32 {
        self.count
    }

    /// Announced queries that never came within the bound, since the last call.
    pub fn take_expired(&mut self) -> u64 {
        std::mem::take(&mut self.expired)
    }
}

/// This core's waits, and the run loop's waker while it is parked.
#[derive(Default)]
struct Local {
    outstanding: Outstanding,
    expected: Expected,
    /// Waits begun so far, plus local wake-ups ([`wake_run_loop`]): a parked run loop
    /// wakes when it moves.
    begun: u64,
    /// The run loop, parked on its doorbell and on [`next_wait`].
    parked: Option<Waker>,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

/// One cross-core wait of this core's tasks, outstanding until dropped.
#[must_use = "the wait is outstanding only while the guard lives"]
pub struct Awaiting {
    ticket: u64,
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        let t = self.ticket;
        // `try_with`: a guard dropped during thread teardown must not panic.
        let _ = LOCAL.try_with(|l| l.borrow_mut().outstanding.end(t));
    }
}

/// Marks the start of a cross-core wait on this core (the query was or is about to
/// be sent); it ends when the returned guard is dropped. A run loop parked meanwhile
/// is woken (same thread: no system call) so that it spins for the answer instead of
/// leaving it to ring the doorbell.
pub fn awaiting() -> Awaiting {
    let now = Instant::now();
    let (ticket, parked) = LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        l.begun = l.begun.wrapping_add(1);
        (l.outstanding.begin(now), l.parked.take())
    });
    if let Some(w) = parked {
        w.wake();
    }
    Awaiting { ticket }
}

/// Wakes this core's run loop if it is parked (same thread: no system call), for
/// work a task queued in the core's own inbox without ringing its doorbell.
pub fn wake_run_loop() {
    let parked = LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        l.begun = l.begun.wrapping_add(1);
        l.parked.take()
    });
    if let Some(w) = parked {
        w.wake();
    }
}

/// Whether this core's run loop should keep polling instead of parking now: an
/// answer or an announced query is on its way.
pub fn should_spin(bound: Duration) -> bool {
    if bound.is_zero() {
        return false;
    }
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        let now = Instant::now();
        // `|`, not `||`: an expired announcement is forgotten (and counted) on every
        // look, whatever the answers do.
        l.outstanding.should_spin(bound, now) | l.expected.should_spin(now)
    })
}

/// Another core announced a query to this core (`Msg::Expect`): stay awake for it for
/// at most `bound`.
pub fn expect(bound: Duration) {
    LOCAL.with(|l| l.borrow_mut().expected.announce(Instant::now(), bound));
}

/// A query from another core arrived (announced or not).
pub fn query_arrived() {
    LOCAL.with(|l| l.borrow_mut().expected.arrived());
}

/// Announced queries that never came within the bound, since the last call (the run
/// loop counts them in `kvroute_answer_waits_total{kind="expect_expired"}`).
pub fn take_expired() -> u64 {
    LOCAL.with(|l| l.borrow_mut().expected.take_expired())
}

/// Waits outstanding on this core.
pub fn outstanding() -> usize {
    LOCAL.with(|l| l.borrow().outstanding.len())
}

/// Resolves once a task of this core begins a cross-core wait, or queues work in the
/// core's own inbox ([`wake_run_loop`]), after this call: the run loop parks on it
/// next to its doorbell.
pub fn next_wait() -> NextWait {
    NextWait {
        seen: LOCAL.with(|l| l.borrow().begun),
    }
}

/// Future of [`next_wait`].
pub struct NextWait {
    seen: u64,
}

impl Future for NextWait {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            if l.begun != self.seen {
                return Poll::Ready(());
            }
            l.parked = Some(cx.waker().clone());
            Poll::Pending
        })
    }
}

impl Drop for NextWait {
    fn drop(&mut self) {
        // Woken by the doorbell instead: no stale waker is left behind.
        let _ = LOCAL.try_with(|l| l.borrow_mut().parked = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn spins_only_while_a_wait_is_outstanding_and_young() {
        let t0 = Instant::now();
        let mut o = Outstanding::default();
        assert!(!o.should_spin(us(100), t0), "nothing outstanding");
        let a = o.begin(t0);
        assert!(o.should_spin(us(100), t0 + us(99)));
        assert!(!o.should_spin(us(100), t0 + us(100)), "bound reached");
        assert!(!o.should_spin(Duration::ZERO, t0), "disabled");
        o.end(a);
        assert!(!o.should_spin(us(100), t0 + us(1)), "answered");
        assert!(o.is_empty());
    }

    #[test]
    fn the_youngest_outstanding_wait_sets_the_bound() {
        let t0 = Instant::now();
        let mut o = Outstanding::default();
        let a = o.begin(t0);
        let b = o.begin(t0 + us(50));
        assert_eq!(o.spin_until(us(100)), Some(t0 + us(150)));
        o.end(b);
        // Only the older one is left: its own bound applies again.
        assert_eq!(o.spin_until(us(100)), Some(t0 + us(100)));
        assert!(!o.should_spin(us(100), t0 + us(120)));
        o.end(a);
        assert_eq!(o.spin_until(us(100)), None);
    }

    #[test]
    fn ends_out_of_order_and_unknown_tickets_are_harmless() {
        let t0 = Instant::now();
        let mut o = Outstanding::default();
        let a = o.begin(t0);
        let b = o.begin(t0 + us(1));
        o.end(a);
        o.end(a);
        o.end(12345);
        assert_eq!(o.len(), 1);
        assert_eq!(o.spin_until(us(10)), Some(t0 + us(11)));
        o.end(b);
        assert!(o.is_empty());
    }

    #[test]
    fn a_clock_stepping_back_does_not_shorten_the_spin() {
        let t0 = Instant::now() + us(1000);
        let mut o = Outstanding::default();
        let _a = o.begin(t0);
        let _b = o.begin(t0 - us(500));
        assert_eq!(o.spin_until(us(100)), Some(t0 + us(100)));
    }

    #[test]
    fn an_announced_query_keeps_the_core_awake_until_it_arrives() {
        let t0 = Instant::now();
        let mut e = Expected::default();
        assert!(!e.should_spin(t0), "nothing announced");
        e.announce(t0, Duration::ZERO);
        assert!(!e.should_spin(t0), "disabled");
        assert_eq!(e.pending(), 0);
        e.announce(t0, us(100));
        e.announce(t0 + us(50), us(100));
        assert!(e.should_spin(t0 + us(120)), "the youngest sets the bound");
        e.arrived();
        assert!(e.should_spin(t0 + us(120)), "one query still to come");
        e.arrived();
        assert!(!e.should_spin(t0 + us(1)), "both arrived");
        e.arrived();
        assert_eq!(e.pending(), 0, "an unannounced query is harmless");
        assert_eq!(e.take_expired(), 0, "nothing expired");
    }

    #[test]
    fn an_announcement_whose_query_never_comes_expires() {
        let t0 = Instant::now();
        let mut e = Expected::default();
        for i in 0..1000 {
            e.announce(t0 + us(i), us(100));
        }
        assert!(e.should_spin(t0 + us(1098)));
        assert!(!e.should_spin(t0 + us(1099)), "bound after the youngest");
        assert_eq!(e.pending(), 0, "every announcement forgotten");
        assert_eq!(e.take_expired(), 1000);
        assert_eq!(e.take_expired(), 0);
        // A later announcement starts afresh.
        e.announce(t0 + us(2000), us(100));
        assert!(e.should_spin(t0 + us(2050)));
        e.arrived();
        assert!(!e.should_spin(t0 + us(2050)));
    }

    #[test]
    fn guards_end_their_wait_when_dropped() {
        assert_eq!(outstanding(), 0);
        let g1 = awaiting();
        let g2 = awaiting();
        assert_eq!(outstanding(), 2);
        assert!(should_spin(Duration::from_secs(3600)));
        assert!(!should_spin(Duration::ZERO));
        drop(g1);
        assert!(should_spin(Duration::from_secs(3600)));
        drop(g2);
        assert_eq!(outstanding(), 0);
        assert!(!should_spin(Duration::from_secs(3600)));
    }

    #[test]
    fn a_parked_loop_wakes_only_for_a_wait_begun_after_it_parked() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use std::task::Wake;
        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let before = awaiting();
        let mut park = Box::pin(next_wait());
        assert!(park.as_mut().poll(&mut cx).is_pending(), "an older wait");
        let g = awaiting();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken by the new wait");
        assert!(park.as_mut().poll(&mut cx).is_ready());
        drop(park);
        // A dropped park leaves no waker behind.
        let mut park = Box::pin(next_wait());
        assert!(park.as_mut().poll(&mut cx).is_pending());
        drop(park);
        let g2 = awaiting();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        drop((before, g, g2));
        assert_eq!(outstanding(), 0);
    }
}
