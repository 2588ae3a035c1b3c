//! Routing: a request in, a decision out. `router` scatters a request's query to the
//! shards, gathers, decides, and runs the lifecycle of routed requests; `control` is
//! the registry writes every source shares (register, deregister, fan-out to the
//! cores); `errors` is the error type and its one mapping to wire codes and HTTP
//! statuses; `handle` is the one door of front ends (the proxy today) into all this.
//!
//! May import: `runtime`, `net`, `metrics`, the pure library. Still reaching up
//! (listed in `tests/layers.rs`): registry writes and routes publish to replicas
//! (`cluster`), decisions feed the status window (`crate::status`).

pub mod control;
pub mod errors;
pub mod handle;
pub mod router;
