//! The runtime: the glommio executors (one per core) and what they share. It owns the
//! per-core state ([`core::Core`]), the process-wide state ([`shared::Shared`]), the
//! cross-core mailboxes and their messages ([`msg`]), each core's run loop
//! (`run_loop`, applying index batches preemptibly with `ingest_slice`; batches cut
//! by `index_batch`), a core's snapshot dump (`dump`), the start checks (`preflight`,
//! `pinning`, `core_start`), the blocking threads (`blocking`), the answer spin
//! (`answer_spin`) and the replicated request-id register (`claims`).
//!
//! May import: `net`, `metrics`, the pure library. Still reaching up (listed in
//! `tests/layers.rs`): `Shared` holds the status window, the recorder and the cluster
//! bridge; a core's requests publish to replicas (`cluster::load`).

pub mod answer_spin;
pub mod blocking;
pub mod claims;
pub mod core;
pub mod core_start;
pub mod dump;
pub mod index_batch;
pub mod ingest_slice;
pub mod msg;
pub mod pinning;
pub mod preflight;
pub mod run_loop;
pub mod shared;
