//! Router replicas on NATS JetStream (`kvroute serve --cluster nats://…`), the
//! sans-I/O part: the replicated event record ([`wire`]), duplicate detection and the
//! replica's health state machine ([`state`]), the names every replica derives from
//! `--cluster-name` ([`names`]), the replicated registry entry ([`entry`]), and the
//! tags that authenticate every message ([`auth`]). The sockets live in `service::cluster::bridge`.
//!
//! Model: each replica publishes what its own ingest accepted, per worker in order,
//! to one JetStream stream; every replica applies that stream in order (its own
//! records were applied when accepted and are skipped), so all indexes converge. The
//! registry is a JetStream KV bucket. See docs/OPERATIONS.md "Router replicas".

pub mod auth;
pub mod config;
pub mod entry;
pub mod load;
pub mod names;
pub mod state;
pub mod wire;
