//! Router replicas on NATS JetStream (`--cluster`): the bridge between the cores and
//! the NATS thread (`bridge`), message tags (`auth`), replicated load (`load`), the
//! NATS client side (`nats`) and the peers' health (`peers`).

pub mod auth;
pub mod bridge;
pub mod load;
pub mod metrics;
pub mod nats;
pub mod peers;
