//! Serving policies at the front door (docs/POLICIES.md): what happens to a request
//! between parsing and routing.
//!
//! - [`queue`]: one model's admission queue: bounded, ordered by priority class, then
//!   deadline, then arrival, with aging so that no priority starves; outcomes admitted,
//!   queued, refused, timed out, cancelled; counters by reason for the metrics.
//!
//! Everything here is a pure state machine in the rustls/quinn style: no I/O, no clock
//! (time is passed in as µs), no threads of its own; the service drives it.

pub mod queue;

pub use queue::{
    AdmissionQueue, Admitted, Counters, Entry, Left, Pushed, QueueConfig, Refusal, Refused,
    Ticket,
};
