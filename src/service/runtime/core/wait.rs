//! Waiting for replies from other cores: a task registers a waiter (`Core::new_wait`),
//! sends its query, and awaits `Core::wait`; the handler of the reply completes it.
//!
//! Guarantees: a reply is delivered to exactly one waiter, and a cancelled wait (its
//! future dropped, e.g. the connection closed) removes its entry, so waiters never
//! accumulate.

use super::Core;
use crate::service::runtime::msg::Reply;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
pub(super) struct Waiter {
    reply: Option<Reply>,
    waker: Option<Waker>,
}

impl Core {
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

    pub(super) fn complete(&self, qid: u64, reply: Reply) {
        let mut w = self.waiters.borrow_mut();
        if let Some(waiter) = w.get_mut(&qid) {
            waiter.reply = Some(reply);
            if let Some(k) = waiter.waker.take() {
                k.wake();
            }
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
