//! A core's inbox: a bounded lock-free MPMC queue plus a "sleeping" flag that tells
//! producers when the consumer must be woken.
//!
//! Protocol (the loom model in `tests/loom_mailbox.rs` checks it):
//! - producer: `push` the message, then `swap(sleeping, false)`; if it was `true` the
//!   consumer may be parked, so the producer rings the doorbell;
//! - consumer: drains, then `try_sleep`: sets `sleeping = true` and re-checks the queue;
//!   only if it is still empty does it park on the doorbell.
//!
//! With SeqCst on both sides a message can never be left in the queue while the
//! consumer sleeps (no lost wake-up); spurious wake-ups are harmless. (The flag store
//! and the queue check form a store-buffering pattern: with weaker orderings each side
//! could miss the other's write. loom treats SeqCst as AcqRel, so the loom models check
//! the protocol's steps, including the re-check, via injected faults, not this part.)
//! The queue is bounded: `push` hands the message back when full, and the caller
//! applies backpressure (waits, which stops it reading its socket).

use super::atomic::{AtomicBool, Ordering};
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
    sleeping: AtomicBool,
}

impl<T> Mailbox<T> {
    pub fn new(capacity: usize) -> Mailbox<T> {
        Mailbox {
            queue: ArrayQueue::new(capacity.max(1)),
            sleeping: AtomicBool::new(false),
        }
    }

    /// Enqueues `msg`. `Ok(true)` means the consumer may be asleep: ring its doorbell.
    /// `Err(msg)` when the queue is full.
    pub fn push(&self, msg: T) -> Result<bool, T> {
        #[cfg(loom)]
        if super::faults::active(super::faults::Fault::FlagBeforePush) {
            let was = self.sleeping.swap(false, Ordering::SeqCst);
            self.queue.push(msg)?;
            return Ok(was);
        }
        self.queue.push(msg)?;
        Ok(self.sleeping.swap(false, Ordering::SeqCst))
    }

    pub fn pop(&self) -> Option<T> {
        self.queue.pop()
    }

    /// Consumer side: announce the intent to park. Returns `false` (and stays awake)
    /// when messages arrived meanwhile.
    pub fn try_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        #[cfg(loom)]
        if super::faults::active(super::faults::Fault::SkipRecheck) {
            return true;
        }
        if self.queue.is_empty() {
            true
        } else {
            self.sleeping.store(false, Ordering::SeqCst);
            false
        }
    }

    /// Consumer side: woke up (doorbell or spuriously).
    pub fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
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
    fn wake_needed_only_after_sleep() {
        let m = Mailbox::new(2);
        assert_eq!(m.push(1), Ok(false));
        assert!(!m.try_sleep(), "queue not empty: must not sleep");
        assert_eq!(m.pop(), Some(1));
        assert!(m.try_sleep());
        assert_eq!(m.push(2), Ok(true), "consumer asleep: wake it");
        assert_eq!(m.push(3), Ok(false), "already woken");
        assert_eq!(m.push(4), Err(4), "bounded");
    }
}
