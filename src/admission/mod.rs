//! Serving policies at the front door (docs/POLICIES.md): what happens to a request
//! between parsing and routing.
//!
//! - [`queue`]: one model's admission queue: bounded, ordered by priority class, then
//!   deadline, then arrival, with aging so that no priority starves; outcomes admitted,
//!   queued, refused, timed out, cancelled; counters by reason for the metrics.
//! - [`shared`]: that queue shared by the cores of a replica, with the wake-up
//!   protocol that gives freed capacity to the request that goes next (loom-checked).
//! - [`hints`]: a request's priority (vLLM's `priority`, `x-kvroute-priority`,
//!   Dynamo's `nvext.agent_hints`), deadline, expected output length and session key.
//! - [`tenant`] and [`rate`]: who a request belongs to, its pinned priority and its
//!   token buckets (requests/s, prompt tokens/s), with bounded metric labels.
//! - [`config`] and [`args`]: the `[admission]` settings and their flags.
//!
//! Sessions and conditional disaggregation decide where a request goes, so they live
//! in `select` (`select::Sessions`, `select::local_prefill`).
//!
//! Everything here is a pure state machine in the rustls/quinn style: no I/O, no clock
//! (time is passed in as µs), no threads of its own; the service drives it.

pub mod args;
pub mod config;
pub mod hints;
pub mod queue;
pub mod rate;
pub mod shared;
pub mod tenant;

pub use config::{AdmissionSettings, TenantSpec};
pub use hints::{BadHint, HintConfig, Hints, PrioritySource};
pub use queue::{
    AdmissionQueue, Admitted, Counters, Entry, Left, Pushed, QueueConfig, Refusal, Refused, Ticket,
};
pub use shared::{Enqueued, Grant, Leave, SharedQueue, Waiter, WaiterState};
pub use tenant::{Limit, OverLimit, Tenant, Tenants};
