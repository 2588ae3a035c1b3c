//! loom models of `admission::shared::SharedQueue`: the wake-up protocol that gives
//! capacity freed on one core to a request queued from another.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release
//! --no-default-features --test loom_admission` (or `.ci/extra`).
//!
//! The router's capacity is modelled as a count of free slots (an atomic: a worker
//! below its busy threshold); routing is taking one. Grants are delivered to a shared
//! list (the waiter's core) and acted on after the threads finish, as the waiter's
//! core would: route if there is capacity, else `retry` (back in its place). Checked:
//! - `a_release_racing_an_enqueue_is_not_lost`: a request finds no capacity and queues
//!   while another core frees one; in every interleaving the request ends admitted,
//!   never queued with capacity free (the epoch recheck or the release's grant finds
//!   it);
//! - `two_waiters_and_one_release`: one of two queued-or-routing requests gets the one
//!   freed slot; the other waits, and no capacity is left unused;
//! - `a_grant_to_a_leaving_waiter_is_passed_on`: a release grants the first waiter
//!   while its client goes away; the slot reaches the second waiter either way, and the
//!   first has exactly one outcome;
//! - `a_release_during_a_nudged_try_goes_to_the_nudged_waiter`: the tick nudges the
//!   better of two waiters, which tries in its place while a release frees the one
//!   slot; in every interleaving the slot goes to the better one (taken by its try, or
//!   by the grant the release gave it), never to the other, and the other still waits.
//!
//! Each has an `*_is_caught` twin injecting a bug (`kvroute::sync::faults`: no recheck
//! after enqueue; a leave that drops the grant it received; a nudge that takes its
//! waiter out of the queue, as a grant does) that loom must catch.
#![cfg(loom)]

use kvroute::admission::queue::{Entry, QueueConfig};
use kvroute::admission::shared::{Enqueued, Grant, Leave, SharedQueue, WaiterState, Waiting};
use kvroute::sync::faults::{self, Fault};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

struct World {
    q: SharedQueue<u32>,
    free: AtomicUsize,
    grants: Mutex<Vec<Grant<u32>>>,
    admitted: Mutex<Vec<u32>>,
}

impl World {
    fn new(free: usize) -> Arc<World> {
        Arc::new(World {
            q: SharedQueue::new(QueueConfig::default()),
            free: AtomicUsize::new(free),
            grants: Mutex::new(Vec::new()),
            admitted: Mutex::new(Vec::new()),
        })
    }

    /// Routing: take a free slot.
    fn try_route(&self) -> bool {
        let mut cur = self.free.load(Ordering::Acquire);
        while cur > 0 {
            match self
                .free
                .compare_exchange(cur, cur - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        false
    }

    fn deliver(&self, g: Option<Grant<u32>>) {
        if let Some(g) = g {
            self.grants.lock().unwrap().push(g);
        }
    }

    /// A request arriving: route directly when nobody waits, else queue.
    fn arrive(&self, id: u32, priority: i32) -> Option<Enqueued<u32>> {
        let seen = self.q.epoch();
        if self.q.is_empty() && self.try_route() {
            self.admitted.lock().unwrap().push(id);
            return None;
        }
        let e = Entry {
            item: id,
            priority,
            deadline_us: None,
            tenant: None,
            arrival_us: 0,
        };
        let enq = self.q.enqueue(e, seen).expect("the queue has room");
        if enq.recheck {
            self.deliver(self.q.kick(0));
        }
        Some(enq)
    }

    /// A request ending: its slot is free again (published first), then the queue.
    fn release(&self) {
        self.free.fetch_add(1, Ordering::Release);
        self.deliver(self.q.freed(0));
    }

    /// The waiters' cores, after the threads: act on every grant still valid.
    fn settle(&self) {
        loop {
            let next = self.grants.lock().unwrap().pop();
            let Some(g) = next else { break };
            if g.item.waiter.state() != WaiterState::Granted {
                continue; // it left; `leave` passed the grant on
            }
            let seen = self.q.epoch();
            if self.try_route() {
                self.admitted.lock().unwrap().push(g.item.item);
            } else {
                let r = self.q.retry(g, seen).expect("room to go back");
                if r.recheck {
                    self.deliver(self.q.kick(0));
                }
            }
        }
    }

    /// No capacity is left unused while someone waits.
    fn check_no_lost_wakeup(&self) {
        let free = self.free.load(Ordering::Acquire);
        assert!(
            free == 0 || self.q.is_empty(),
            "lost wake-up: {free} free slot(s) and {} waiting",
            self.q.len()
        );
        assert_eq!(self.q.len(), self.q.with(|q| q.len()), "len mirror");
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

fn release_vs_enqueue() {
    model(|| {
        let w = World::new(0);
        let owner = {
            let w = w.clone();
            thread::spawn(move || {
                w.arrive(1, 0);
            })
        };
        w.release();
        owner.join().unwrap();
        w.settle();
        w.check_no_lost_wakeup();
        assert_eq!(*w.admitted.lock().unwrap(), vec![1]);
    });
}

#[test]
fn a_release_racing_an_enqueue_is_not_lost() {
    faults::inject(Fault::None);
    release_vs_enqueue();
}

#[test]
#[should_panic]
fn a_release_racing_an_enqueue_is_caught() {
    faults::inject(Fault::AdmissionSkipRecheck);
    release_vs_enqueue();
}

#[test]
fn two_waiters_and_one_release() {
    faults::inject(Fault::None);
    model(|| {
        let w = World::new(0);
        let a = {
            let w = w.clone();
            thread::spawn(move || {
                w.arrive(1, 0);
            })
        };
        let b = {
            let w = w.clone();
            thread::spawn(move || {
                w.arrive(2, 1);
            })
        };
        w.release();
        a.join().unwrap();
        b.join().unwrap();
        w.settle();
        w.check_no_lost_wakeup();
        assert_eq!(w.admitted.lock().unwrap().len(), 1);
        assert_eq!(w.q.len(), 1);
    });
}

fn grant_vs_leave() {
    model(|| {
        let w = World::new(0);
        // Two requests already waiting, 1 ahead of 2.
        let first = w.arrive(1, 0).expect("queued");
        w.arrive(2, 1).expect("queued");
        let first_waiter = first.waiter.clone();
        let leaver = {
            let w = w.clone();
            thread::spawn(move || match w.q.leave(first.ticket, &first.waiter, 0) {
                Leave::Removed => {}
                Leave::PassedOn(g) => w.deliver(g),
                Leave::AlreadyOut(s) => panic!("unexpected {s:?}"),
            })
        };
        w.release();
        leaver.join().unwrap();
        w.settle();
        w.check_no_lost_wakeup();
        assert_eq!(*w.admitted.lock().unwrap(), vec![2]);
        assert_eq!(first_waiter.state(), WaiterState::Gone);
    });
}

#[test]
fn a_grant_to_a_leaving_waiter_is_passed_on() {
    faults::inject(Fault::None);
    grant_vs_leave();
}

#[test]
#[should_panic]
fn a_grant_to_a_leaving_waiter_is_caught() {
    faults::inject(Fault::AdmissionDropGrant);
    grant_vs_leave();
}

/// One pass of waiter `id`'s wait loop (`proxy::queued::wait_turn`) on its own core:
/// granted, or nudged, it tries; served, it leaves (`served`); bounced, it goes back
/// (`retry`).
fn turn(w: &World, id: u32, e: &Enqueued<u32>) {
    if w.admitted.lock().unwrap().contains(&id) {
        return;
    }
    let granted = e.waiter.state() == WaiterState::Granted;
    if !granted && !(e.waiter.state() == WaiterState::Waiting && e.waiter.take_nudge()) {
        return;
    }
    let g: Grant<u32> = Grant {
        ticket: e.ticket,
        item: Waiting {
            waiter: e.waiter.clone(),
            item: id,
        },
        tenant: None,
        waited_us: 0,
    };
    let seen = w.q.epoch();
    if w.try_route() {
        w.admitted.lock().unwrap().push(id);
        w.deliver(w.q.served(&g, 0));
    } else {
        let r = w.q.retry(g, seen).expect("room to go back");
        if r.recheck {
            w.deliver(w.q.kick(0));
        }
    }
}

fn nudge_vs_release() {
    model(|| {
        let w = World::new(0);
        let first = Arc::new(w.arrive(1, -5).expect("queued"));
        let second = w.arrive(2, 5).expect("queued");
        let ticker = {
            let (w, first) = (w.clone(), first.clone());
            thread::spawn(move || {
                // The tick, then the first waiter's core.
                w.q.nudge(0, 1, 16);
                turn(&w, 1, &first);
            })
        };
        // A request ends; the second waiter's core acts on what it is told.
        w.release();
        turn(&w, 2, &second);
        ticker.join().unwrap();
        for _ in 0..3 {
            turn(&w, 1, &first);
            turn(&w, 2, &second);
        }
        w.check_no_lost_wakeup();
        assert_eq!(*w.admitted.lock().unwrap(), vec![1]);
        assert_eq!(w.q.len(), 1);
    });
}

#[test]
fn a_release_during_a_nudged_try_goes_to_the_nudged_waiter() {
    faults::inject(Fault::None);
    nudge_vs_release();
}

#[test]
#[should_panic]
fn a_release_during_a_nudged_try_is_caught() {
    faults::inject(Fault::AdmissionNudgeTakes);
    nudge_vs_release();
}
