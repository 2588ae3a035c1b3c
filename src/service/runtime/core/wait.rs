//! Waiting for replies from other cores: a task registers a waiter
//! ([`Waits::register`], through `Core::new_wait`), sends its query, and awaits
//! [`Waits::wait`]; the handler of the reply completes it ([`Waits::complete`]).
//!
//! Guarantees: a reply is delivered to exactly one waiter, and a cancelled wait (its
//! future dropped, e.g. the connection closed) removes its entry, so waiters never
//! accumulate. Core-local: never shared between threads.

use crate::service::runtime::msg::Reply;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Waiter {
    reply: Option<Reply>,
    waker: Option<Waker>,
}

/// A core's tasks waiting for replies, by query id.
pub struct Waits {
    waiters: RefCell<HashMap<u64, Waiter>>,
    next_qid: Cell<u64>,
}

impl Default for Waits {
    fn default() -> Self {
        Waits {
            waiters: RefCell::new(HashMap::new()),
            next_qid: Cell::new(1),
        }
    }
}

impl Waits {
    /// Registers a waiter and returns its query id.
    pub fn register(&self) -> u64 {
        let q = self.next_qid.get();
        self.next_qid.set(q + 1);
        self.waiters.borrow_mut().insert(q, Waiter::default());
        q
    }

    /// Resolves when the reply for `qid` has arrived.
    pub fn wait(&self, qid: u64) -> WaitReply<'_> {
        WaitReply { waits: self, qid }
    }

    /// Hands `reply` to the waiter of `qid` (dropped if it gave up waiting).
    pub fn complete(&self, qid: u64, reply: Reply) {
        let mut w = self.waiters.borrow_mut();
        if let Some(waiter) = w.get_mut(&qid) {
            waiter.reply = Some(reply);
            if let Some(k) = waiter.waker.take() {
                k.wake();
            }
        }
    }
}

/// Future of [`Waits::wait`].
pub struct WaitReply<'a> {
    waits: &'a Waits,
    qid: u64,
}

impl Future for WaitReply<'_> {
    type Output = Reply;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        let mut w = self.waits.waiters.borrow_mut();
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
        if let Ok(mut w) = self.waits.waiters.try_borrow_mut() {
            w.remove(&self.qid);
        }
    }
}
