//! The lock-free structures the cores share, kept free of any runtime so they can be
//! model-checked with loom (`RUSTFLAGS="--cfg loom"`, see `tests/loom_*.rs`).
//!
//! - [`mailbox`]: a core's bounded inbox plus the sleep/wake flag protocol;
//! - [`lanes`]: two mailboxes (urgent, bulk) sharing one consumer and doorbell;
//! - [`board`]: per-worker load figures, one writer per core, readers everywhere.
//!
//! Under `cfg(loom)` the atomics come from loom (and the mailbox queue is a
//! loom-instrumented bounded queue) so every interleaving of the protocols is explored,
//! and [`faults`] lets each model inject a deliberate bug to show it is caught.

pub mod board;
#[cfg(loom)]
pub mod faults;
pub mod lanes;
pub mod mailbox;

#[cfg(loom)]
pub(crate) use loom::sync::atomic;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic;
