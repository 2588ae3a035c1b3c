//! Routing: a request in, a decision out (`router`: scatter to the shards, gather,
//! decide; lifecycle of routed requests), the registry writes every source shares
//! (`control`), and the one mapping of routing errors to wire codes and statuses
//! (`errors`).

pub mod control;
pub mod errors;
pub mod handle;
pub mod router;
