//! The runtime: the glommio executors (one per core) and what they share. It owns the
//! per-core state ([`core::Core`]), the process-wide state ([`shared::Shared`]), the
//! cross-core mailboxes and their messages ([`msg`]), each core's run loop, the start
//! checks (`preflight`, `pinning`, `core_start`), the blocking threads and the
//! answer spin. Other layers reach the cores only through the types here.

pub mod answer_spin;
pub mod blocking;
pub mod claims;
pub mod core;
pub mod core_start;
pub mod dump;
pub mod msg;
pub mod pinning;
pub mod preflight;
pub mod run_loop;
pub mod shared;
