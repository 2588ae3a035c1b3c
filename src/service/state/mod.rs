//! State kept across restarts: the snapshot taken and restored (`persist`, from the
//! cores' `runtime::dump`) and the state directory and its lock (`state_dir`).
//!
//! May import: `cluster` (the stream sequence saved beside a snapshot), `routing`,
//! `runtime`, `net`, `metrics`, the pure library.

pub mod persist;
pub mod state_dir;
