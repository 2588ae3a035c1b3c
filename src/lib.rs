//! kvroute: a KV-cache-aware router for fleets of LLM inference workers.
//!
//! The crate is split like quinn: everything that decides (hashing, the block index,
//! overlap merge, load accounting, cost, filters, selection, the wire codec) is pure,
//! synchronous and runtime-free; `service` (glommio, Linux only) only moves bytes and
//! messages between those modules.
//!
//! - [`hash`]: token ids → block sequence hashes (Dynamo's XXH3 scheme).
//! - [`index`]: the sharded block index and the merge of per-shard matches into
//!   per-worker overlaps.
//! - [`load`]: active load accounting and the request lifecycle.
//! - [`select`]: cost, filters, routing modes, disaggregated two-stage decisions.
//! - [`codec`]: the binary event and request protocols (docs/PROTOCOL.md).
//! - [`registry`]: the worker registry (slots, specs, liveness).
//! - [`credentials`]: the shared token and per-worker tokens (who may do what).
//! - [`engine`]: an in-process router that wires the pure modules together.
//! - [`ids`]: the one charset and length rule for worker and request ids.
//! - [`zmtp`]: a bounded ZeroMQ (ZMTP 3.x) client for engine KV events.
//! - [`tokenize`]: OpenAI request bodies → prompt token ids, as the engine computes them.
//! - `epp` (service feature): the endpoint picker of Kubernetes inference gateways
//!   (Envoy ext_proc over gRPC).
//! - [`admission`]: the front door's policies (admission queue, priorities, tenants).
//! - `families` (service feature): registering metric families, one line each.

pub mod admission;
pub mod api_shapes;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod credentials;
pub mod engine;
pub mod engines;
pub mod epp;
#[cfg(all(target_os = "linux", feature = "service"))]
mod families;
pub mod hash;
pub mod ids;
pub mod index;
pub mod load;
pub mod mem;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod process;
pub mod proxy;
pub mod record;
pub mod registry;
pub mod select;
#[cfg(all(target_os = "linux", feature = "service"))]
pub mod service;
pub mod settings;
pub mod sim;
pub mod snapshot;
pub mod status;
pub mod sync;
pub mod tokenize;
pub mod trace;
pub mod types;
pub mod zmtp;
