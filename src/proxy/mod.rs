//! The OpenAI-compatible proxy of `kvroute serve` (docs/PROXY.md): the router tier
//! in the request path. A request on `proxy_addr` is parsed, routed with the usual cost
//! (`service::routing::router::route`), forwarded to the chosen worker's `url` on the same core,
//! and its response streamed back chunk by chunk while the request's lifecycle
//! (`first_token`, `progress`, `finish`) is read off the stream.
//!
//! Split like the rest of the crate: the decisions are pure and unit-tested —
//! - `url`: the upstream URL of a worker (`http://host:port[/base]`);
//! - `config`: the proxy's settings (`[proxy]` in TOML), `args` their flags;
//! - `request`: the client body (limits, the fields routing needs, ids), read in place
//!   (`members`: the spans of an object's members, no JSON tree);
//! - `agents`: Anthropic Messages, OpenAI Responses and the pass-through endpoints;
//! - `strip`: the members engines trust as engine-to-engine data, removed from it;
//! - `prompt`: token ids of a prompt (the one call site of tokenization);
//! - `track`: lifecycle signals from an SSE or JSON response stream (`event`: the
//!   fields they need from one response object, read without a JSON tree; `jscan`:
//!   the same, pushed chunk by chunk in constant memory);
//! - `breaker`: the per-worker circuit breaker state machine;
//! - `retry`: which upstream failures are retried, and the backoff;
//! - `pd`: the two legs of a disaggregated (NIXL) request;
//! - `errors`: OpenAI-shaped error bodies and SSE error events —
//!
//! and the glommio/hyper driver (`service` feature): `io` (hyper over glommio streams,
//! client side), `pool` (per-core keep-alive connections per worker), `body` (the
//! streamed response and its lifecycle), `forward` (route → legs → retries), `health` (breakers per core, probes), `front` (one core's routing handle and the shared state), `server`
//! (the listener's routes and auth), `spans` (the request's OpenTelemetry spans), `state` (metrics and the shared admission count),
//! `refuse` (a 429 for a connection the listener has no slot for), `watch` (a client
//! that went away, noticed while its request waits), `respond` (the proxy's own
//! answers in OpenAI's error shape), `front_door`, `policies` and `queued` (the front
//! door's hints, tenants and admission queue: docs/POLICIES.md). No file imports
//! another that imports it back (`tests/layers.rs`): the shared state holds the
//! policies and the response map, which import neither it nor the driver.

pub mod agents;
pub mod args;
pub mod breaker;
pub mod config;
pub mod errors;
pub mod event;
pub mod jscan;
pub mod members;
#[cfg(test)]
mod members_tests;
pub mod pd;
pub mod prompt;
pub mod request;
#[cfg(test)]
mod request_tests;
pub mod retry;
pub mod route_request;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod spans;
pub mod strip;
pub mod track;
pub mod url;

#[cfg(all(target_os = "linux", feature = "service"))]
pub mod body;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod forward;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod front;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod front_door;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod health;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod io;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod offload;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod policies;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod pool;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod queued;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod refuse;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod respond;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod server;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod state;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod watch;
