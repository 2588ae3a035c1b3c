//! The endpoint picker (EPP) of Kubernetes inference gateways (docs/ENDPOINT_PICKER.md):
//! a gateway implementing the Gateway API Inference Extension (Envoy Gateway, kgateway,
//! Istio, agentgateway, GKE) asks it, over Envoy's ext_proc gRPC protocol, which
//! endpoint of an `InferencePool` each request goes to, and relays the response so the
//! request's lifecycle is followed as the proxy follows it.
//!
//! Split like the proxy: the decisions are pure and unit-tested —
//! - `stream`: one ext_proc stream as a sans-I/O state machine (body modes, limits,
//!   when and how the pick goes out, lifecycle from the response);
//! - `headers`: the request head within limits; `subset`: endpoints and the gateway's
//!   subset hint; `route`: the hint applied; `reply`: the responses sent;
//! - `pick`: the interface to routing ([`pick::Picker`]), the same pipeline the proxy
//!   drives (the body is parsed by `proxy::request`, tokenized by `proxy::prompt`);
//!   `fake`: a picker for tests; `gateway`: the messages a gateway sends, for tests
//!   and benchmarks;
//! - `config` / `args`: the `[epp]` settings and `--epp-*` flags; `metrics`:
//!   `kvroute_epp_*` —
//!
//! and the driver, `server`: tonic on the "kvroute-epp" thread's tokio runtime. The
//! settings build everywhere; the rest with the `service` feature on Linux.

pub mod args;
pub mod config;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod fake;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod gateway;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod headers;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod metrics;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod pick;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod reply;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod route;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod server;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod stream;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod subset;
