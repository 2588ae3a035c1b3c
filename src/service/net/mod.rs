//! The network doors of the service: listening sockets bound once and shared by the
//! cores (`listeners`), framed connections (`conn`), connection slots and their policy
//! (`conn_slot`, `slots`), hyper over glommio streams with deadlines (`hyper_io`,
//! `http_clock`) and the HTTP request rules (`doors`). Transport only: no routing.
//!
//! May import: `metrics`, the pure library. Still reaching up (listed in
//! `tests/layers.rs`): `hyper_io` reads the clock, settings and metrics off `Shared`.

pub mod conn;
pub mod conn_slot;
pub mod doors;
pub mod http_clock;
pub mod hyper_io;
pub mod listeners;
pub mod slots;
