//! OpenTelemetry traces of proxied requests (`[trace]`, `--otlp-endpoint`): one span
//! per request with child spans for tokenization, the routing decision and the
//! upstream call, exported over OTLP (gRPC or HTTP) with the OpenTelemetry crates.
//!
//! - [`Tracing`]: the tracer (off, or a provider whose spans go to
//!   `export::QueueProcessor`), shared by every core; sampling is parent-based over a
//!   trace-id ratio, so a client's `traceparent` decides for its own trace.
//! - [`RequestSpan`]: what the pipeline drives — started from the client's
//!   `traceparent` / `tracestate` (W3C trace context, the crates' propagator), its
//!   children [`Stage`] (`tokenize`, `route` with the decision's attributes,
//!   `upstream` with TTFT, tokens and outcome), and the headers to send the worker so
//!   its spans join the trace ([`Stage::propagation`]).
//!
//! Guarantees: spans are created on the cores without blocking or I/O (ending one is
//! a `try_send` to a bounded queue; a full queue drops and counts it); with tracing
//! off every call is a no-op on an empty `Option`; export runs on its own thread.
//! `config` and `args` (the settings and flags) build without the service.

pub mod args;
pub mod config;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod export;

#[cfg(all(target_os = "linux", feature = "service"))]
mod span;
#[cfg(all(target_os = "linux", feature = "service"))]
pub use span::{RequestSpan, RouteAttrs, Stage, Tracing};
