//! Router replicas on NATS JetStream (`--cluster`): the bridge between the cores and
//! the NATS thread (`bridge`), message tags (`auth`), replicated load (`load`), the
//! NATS client side (`nats`), the peers' health and engine leases (`peers`), and the
//! `kvroute_cluster_*` families (`metrics`, registered by the bridge at start).
//!
//! May import: `routing` (registry writes of peers), `runtime`, `net`, `metrics`, the
//! pure library.

pub mod auth;
pub mod bridge;
pub mod load;
pub mod metrics;
pub mod nats;
pub mod peers;
