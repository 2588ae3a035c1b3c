//! A core's inbox: a bounded lock-free MPMC queue plus a "sleeping" flag that tells
//! producers when the consumer must be woken.
//!
//! Protocol (the loom models in `tests/loom_mailbox.rs` check it). One atomic word
//! holds both the number of announced messages (upper bits) and the consumer's
//! SLEEPING bit, so every decision is a read-modify-write of the same location and
//! needs no store-load (Dekker) ordering between two locations:
//! - producer: `fetch_add` one message, then push it; if the word it replaced had
//!   SLEEPING set, clear the bit (`fetch_and`) and ring the doorbell if it was the one
//!   that cleared it;
//! - consumer: pops (each pop subtracts one), then `try_sleep` = compare-exchange of
//!   `0 → SLEEPING`: it can only park when no message is announced, so a message is
//!   never left behind a parked consumer (no lost wake-up). A message announced but
//!   not yet pushed makes the consumer retry instead of parking; spurious wake-ups are
//!   harmless.
//!
//! - quiet producer ([`Mailbox::push_quiet`]): `fetch_add` one message, then push it,
//!   leaving the SLEEPING bit as it is: a parked consumer stays parked. The message
//!   is taken, in order, by the consumer's next wake-up (the next plain message's
//!   doorbell, or any other) or by a pop on the consumer's thread; a plain message
//!   pushed after it still finds SLEEPING set and rings, so a quiet message never
//!   delays one that is not.
//!
//! The queue is bounded: `push` hands the message back when full (and withdraws its
//! announcement), and the caller applies backpressure (waits, which stops it reading
//! its socket).

use super::atomic::{AtomicUsize, Ordering};
#[cfg(not(loom))]
use crossbeam::queue::ArrayQueue;
#[cfg(loom)]
use loom_queue::ArrayQueue;

/// Under loom, a bounded FIFO with crossbeam's `ArrayQueue` interface built on a loom
/// mutex (crossbeam's queue is not loom-instrumented; the protocol under test is the
/// sleep flag around it, whose correctness needs only a linearizable queue).
#[cfg(loom)]
mod loom_queue {
    use loom::sync::Mutex;
    use std::collections::VecDeque;

    pub struct ArrayQueue<T> {
        q: Mutex<VecDeque<T>>,
        cap: usize,
    }

    impl<T> ArrayQueue<T> {
        pub fn new(cap: usize) -> Self {
            ArrayQueue {
                q: Mutex::new(VecDeque::new()),
                cap,
            }
        }
        pub fn push(&self, v: T) -> Result<(), T> {
            let mut q = self.q.lock().unwrap();
            if q.len() >= self.cap {
                return Err(v);
            }
            q.push_back(v);
            Ok(())
        }
        pub fn pop(&self) -> Option<T> {
            self.q.lock().unwrap().pop_front()
        }
        pub fn is_empty(&self) -> bool {
            self.q.lock().unwrap().is_empty()
        }
        pub fn len(&self) -> usize {
            self.q.lock().unwrap().len()
        }
        pub fn capacity(&self) -> usize {
            self.cap
        }
    }
}

pub struct Mailbox<T> {
    queue: ArrayQueue<T>,
    /// `announced messages << 1 | SLEEPING`.
    state: AtomicUsize,
}

const SLEEPING: usize = 1;
const ONE: usize = 2;

impl<T> Mailbox<T> {
    pub fn new(capacity: usize) -> Mailbox<T> {
        Mailbox {
            queue: ArrayQueue::new(capacity.max(1)),
            state: AtomicUsize::new(0),
        }
    }

    /// Enqueues `msg`. `Ok(true)` means the consumer was asleep: ring its doorbell.
    /// `Err(msg)` when the queue is full.
    pub fn push(&self, msg: T) -> Result<bool, T> {
        #[cfg(loom)]
        if super::faults::active(super::faults::Fault::FlagBeforePush) {
            // Bug: decides from a plain load taken before announcing the message.
            let asleep = self.state.load(Ordering::Acquire) & SLEEPING != 0;
            self.announce(msg)?;
            return Ok(asleep && self.state.fetch_and(!SLEEPING, Ordering::AcqRel) & SLEEPING != 0);
        }
        let prev = self.announce(msg)?;
        if prev & SLEEPING == 0 {
            return Ok(false);
        }
        Ok(self.state.fetch_and(!SLEEPING, Ordering::AcqRel) & SLEEPING != 0)
    }

    /// Enqueues `msg` without waking the consumer (see the module doc). `Err(msg)`
    /// when the queue is full.
    pub fn push_quiet(&self, msg: T) -> Result<(), T> {
        self.announce(msg)?;
        #[cfg(loom)]
        if super::faults::active(super::faults::Fault::QuietClearsFlag) {
            // Bug: takes the wake-up for itself and rings no doorbell.
            self.state.fetch_and(!SLEEPING, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Announces one message (`fetch_add`), then enqueues it: the state before the
    /// announcement, or the message back, its announcement withdrawn, when the queue
    /// is full. Both producers start here.
    fn announce(&self, msg: T) -> Result<usize, T> {
        let prev = self.state.fetch_add(ONE, Ordering::AcqRel);
        if let Err(m) = self.queue.push(msg) {
            self.state.fetch_sub(ONE, Ordering::AcqRel);
            return Err(m);
        }
        Ok(prev)
    }

    pub fn pop(&self) -> Option<T> {
        let m = self.queue.pop()?;
        self.state.fetch_sub(ONE, Ordering::AcqRel);
        Some(m)
    }

    /// Consumer side: announce the intent to park. Returns `false` (and stays awake)
    /// when a message is announced (possibly not yet in the queue: retry soon).
    pub fn try_sleep(&self) -> bool {
        #[cfg(loom)]
        if super::faults::active(super::faults::Fault::SkipRecheck) {
            // Bug: raises the bit without checking for announced messages.
            self.state.fetch_or(SLEEPING, Ordering::AcqRel);
            return true;
        }
        self.state
            .compare_exchange(0, SLEEPING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Consumer side: woke up (doorbell or spuriously).
    pub fn awake(&self) {
        self.state.fetch_and(!SLEEPING, Ordering::AcqRel);
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_message_leaves_the_consumer_asleep_and_the_next_plain_one_rings() {
        let m = Mailbox::new(4);
        assert!(m.try_sleep());
        assert_eq!(m.push_quiet(1), Ok(()));
        assert_eq!(m.push(2), Ok(true), "the consumer still sleeps: ring");
        m.awake();
        assert_eq!((m.pop(), m.pop()), (Some(1), Some(2)));
        assert!(m.try_sleep());
        let full = Mailbox::new(1);
        assert_eq!(full.push_quiet(1), Ok(()));
        assert_eq!(full.push_quiet(2), Err(2));
        assert!(
            !full.try_sleep(),
            "a quiet message keeps an awake consumer up"
        );
    }

    #[test]
    fn wake_needed_only_after_sleep() {
        let m = Mailbox::new(2);
        assert_eq!(m.push(1), Ok(false));
        assert!(!m.try_sleep(), "queue not empty: must not sleep");
        assert_eq!(m.pop(), Some(1));
        assert!(m.try_sleep());
        assert_eq!(m.push(2), Ok(true), "consumer asleep: wake it");
        assert_eq!(m.push(3), Ok(false), "already woken");
        assert_eq!(m.push(4), Err(4), "bounded");
        assert_eq!((m.pop(), m.pop(), m.pop()), (Some(2), Some(3), None));
        m.awake();
        assert!(m.try_sleep(), "a refused push withdrew its announcement");
    }
}
