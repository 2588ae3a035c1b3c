//! Router replicas on NATS JetStream (`kvroute serve --cluster nats://…`), the
//! sans-I/O part: the replicated event record ([`wire`]), duplicate detection and the
//! replica's health state machine ([`state`]), and the names every replica derives
//! from `--cluster-name` ([`names`]). The sockets live in `service::cluster_bridge`.
//!
//! Model: each replica publishes what its own ingest accepted, per worker in order,
//! to one JetStream stream; every replica applies that stream in order (its own
//! records were applied when accepted and are skipped), so all indexes converge. The
//! registry is a JetStream KV bucket. See README "Router replicas".

pub mod config;
pub mod load;
pub mod names;
pub mod state;
pub mod wire;
