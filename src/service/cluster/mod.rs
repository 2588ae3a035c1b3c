//! Router replicas on NATS JetStream (`--cluster`): the bridge that starts the NATS
//! and apply threads and answers readiness (`bridge`), the apply thread (`apply`),
//! message tags (`auth`), peers' load (`load`), the NATS client side (`nats`), and the
//! load batches, load sync and engine leases on NATS (`peers`). What the cores call to
//! publish, the link they reach it by, and the `kvroute_cluster_*` families live one
//! layer down, in `runtime::cluster_link` and `runtime::cluster_metrics`.
//!
//! May import: `routing` (registry writes of peers), `runtime`, `net`, `metrics`, the
//! pure library.

pub mod apply;
pub mod auth;
pub mod bridge;
pub mod load;
pub mod nats;
pub mod peers;

/// One line on stderr, prefixed as every line of the cluster's threads is.
fn log(msg: &str) {
    eprintln!("kvroute: cluster: {msg}");
}
