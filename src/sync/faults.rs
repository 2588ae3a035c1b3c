//! Fault injection for the loom models; compiled only under `cfg(loom)`.
//!
//! Each loom model must be able to fail. A model selects one fault with [`inject`]
//! before `loom::model` runs, and the structure under test misbehaves in exactly that
//! way; the model is then expected to report it (see the `*_is_caught` tests in
//! `tests/loom_*.rs`). Production builds contain none of this: every hook is behind
//! `cfg(loom)` and defaults to [`Fault::None`].
//!
//! Loom runs all model threads as coroutines on the test's OS thread, so a thread-local
//! selects the fault for one test without affecting tests running in parallel.

use std::cell::Cell;

/// A deliberate bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// `Mailbox::try_sleep` parks without re-checking the queue after raising the flag.
    SkipRecheck,
    /// `Mailbox::push` clears the sleep flag (deciding whether to ring) before enqueuing.
    FlagBeforePush,
    /// `Mailbox::push_quiet` clears the sleep flag (so the next plain push rings no
    /// doorbell).
    QuietClearsFlag,
    /// `LoadBoard::publish` zeroes a row before writing it (a transient, invented value).
    BoardResetFirst,
    /// `admission::SharedQueue` never asks a new waiter to recheck the epoch.
    AdmissionSkipRecheck,
    /// `admission::SharedQueue::leave` drops a grant that reached a leaving waiter.
    AdmissionDropGrant,
    /// `admission::SharedQueue::nudge` takes the waiter out of the queue, as a grant.
    AdmissionNudgeTakes,
}

thread_local! {
    static FAULT: Cell<Fault> = const { Cell::new(Fault::None) };
}

/// Selects the fault for the models run next on this thread.
pub fn inject(f: Fault) {
    FAULT.with(|c| c.set(f));
}

/// Whether fault `f` is selected.
pub fn active(f: Fault) -> bool {
    FAULT.with(|c| c.get() == f)
}
