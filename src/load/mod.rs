//! Active load accounting and the request lifecycle (DESIGN §1 "Active load model").
//!
//! The router keeps its own account of in-flight work per worker, fed only by its
//! routing decisions and the frontends' lifecycle notifications (first token, progress,
//! finish, prefill failed); it never asks backends. Pure logic: no I/O, no clocks (time
//! is passed in as `now_us`), no threads.
//!
//! - [`LoadTracker`]: one core's requests and its additive per-worker [`WorkerAgg`]s.
//!   Every request contributes exactly once and is removed exactly once, whatever order
//!   the notifications arrive in. Memory is bounded by the active requests.
//! - [`WorkerAgg`] / [`WorkerLoad`]: per-core aggregates sum into the fleet view, and
//!   [`WorkerAgg::load`] applies the prefill load model (`full` or `predicted`).
//! - [`PrefillPredictor`]: online least-squares prefill-duration model for `predicted`.
//! - [`ActiveBlocksShard`]: blocks held by active requests, per worker, for
//!   `assume_kv_reuse`.

pub mod active;
pub mod agg;
pub mod predictor;
pub mod request;
pub mod tracker;

pub use active::ActiveBlocksShard;
pub use agg::{OldestPrefill, WorkerAgg, WorkerLoad};
pub use predictor::PrefillPredictor;
pub use request::{
    CarriedRequest, FinishReason, Finished, LifecycleError, NewRequest, Phase, RequestInfo,
};
pub use tracker::LoadTracker;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
