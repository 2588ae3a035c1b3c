//! Runtime side of [`crate::service::net::slots`]: the open connections of one listener on one core,
//! what each is doing, and how a connection is told to close.
//!
//! Each connection task holds a [`Slot`] and keeps its activity current (pre-handshake,
//! idle, busy); the accept loop asks [`Table::admit`] about every new connection and
//! carries out the pure decision. A displaced connection is only *told* to close: its
//! flag is set and its task woken, and the task leaves from the wait it was in (a read
//! between requests, or before its handshake) through its normal clean-up path, so no
//! connection is torn down with a request half done.
//!
//! Single-threaded (one table per listener per executor), hence `Cell`/`RefCell`.

use crate::service::net::slots::{self, Activity, Admission, Caps, Occupant};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// One connection's slot.
#[derive(Debug)]
pub struct Slot {
    key: u64,
    activity: Cell<Activity>,
    closing: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Slot {
    pub fn activity(&self) -> Activity {
        self.activity.get()
    }

    pub fn set(&self, a: Activity) {
        self.activity.set(a);
    }

    /// Handshake done or request started: not displaceable.
    pub fn busy(&self) {
        self.activity.set(Activity::Busy);
    }

    /// Waiting for the peer since `since_ms`; displaceable once idle `min_idle_ms`.
    pub fn idle(&self, since_ms: u64, min_idle_ms: u64) {
        self.activity.set(Activity::Idle {
            since_ms,
            min_idle_ms,
        });
    }

    /// Told to close (displaced).
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// Tells the connection to close and wakes its task.
    pub fn close(&self) {
        self.closing.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Remembers the waker of a task about to wait, so [`Slot::close`] can wake it.
    pub fn register(&self, w: &Waker) {
        let mut cur = self.waker.borrow_mut();
        match &*cur {
            Some(old) if old.will_wake(w) => {}
            _ => *cur = Some(w.clone()),
        }
    }

    /// Completes once the connection has been told to close.
    pub fn closed(&self) -> Closed<'_> {
        Closed(self)
    }
}

/// Future of [`Slot::closed`].
pub struct Closed<'a>(&'a Slot);

impl Future for Closed<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.is_closing() {
            return Poll::Ready(());
        }
        self.0.register(cx.waker());
        Poll::Pending
    }
}

/// The open connections of one listener on one core.
#[derive(Debug, Default)]
pub struct Table {
    next_key: Cell<u64>,
    slots: RefCell<Vec<Rc<Slot>>>,
}

/// Keeps a slot in its table; removes it when dropped (the connection task ended).
pub struct SlotGuard {
    table: Rc<Table>,
    pub slot: Rc<Slot>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut v = self.table.slots.borrow_mut();
        if let Some(i) = v.iter().position(|s| s.key == self.slot.key) {
            v.swap_remove(i);
        }
    }
}

impl Table {
    pub fn new() -> Rc<Table> {
        Rc::new(Table::default())
    }

    /// Open connections (including those told to close and not yet gone).
    pub fn len(&self) -> usize {
        self.slots.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides on a new connection ([`slots::admit`]); on `Displace`, the occupant has
    /// already been told to close.
    pub fn admit(&self, caps: Caps, now_ms: u64) -> Admission {
        let occupants: Vec<Occupant> = self
            .slots
            .borrow()
            .iter()
            .map(|s| Occupant {
                key: s.key,
                activity: s.activity.get(),
                closing: s.closing.get(),
            })
            .collect();
        let a = slots::admit(&occupants, caps, now_ms);
        if let Admission::Displace { key, .. } = a {
            let victim = self.slots.borrow().iter().find(|s| s.key == key).cloned();
            if let Some(s) = victim {
                s.close();
            }
        }
        a
    }

    /// Adds a new, pre-handshake connection.
    pub fn insert(self: &Rc<Table>, now_ms: u64) -> SlotGuard {
        let key = self.next_key.get();
        self.next_key.set(key + 1);
        let slot = Rc::new(Slot {
            key,
            activity: Cell::new(Activity::PreAuth { since_ms: now_ms }),
            closing: Cell::new(false),
            waker: RefCell::new(None),
        });
        self.slots.borrow_mut().push(slot.clone());
        SlotGuard {
            table: self.clone(),
            slot,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_removes_its_slot_and_displacement_flags_the_victim() {
        let t = Table::new();
        let caps = Caps {
            max_connections: 2,
            max_preauth: 8,
        };
        let a = t.insert(0);
        let b = t.insert(1);
        b.slot.busy();
        assert_eq!(t.len(), 2);
        assert!(matches!(
            t.admit(caps, 5),
            Admission::Displace { key: 0, .. }
        ));
        assert!(a.slot.is_closing());
        assert!(!b.slot.is_closing());
        drop(a);
        assert_eq!(t.len(), 1);
        assert_eq!(t.admit(caps, 6), Admission::Admit);
    }
}
