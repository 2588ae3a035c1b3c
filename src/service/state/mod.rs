//! State kept across restarts: the snapshot taken and restored (`persist`), the state
//! directory and its lock (`state_dir`), and the routed-traffic recorder (`recorder`).

pub mod persist;
pub mod recorder;
pub mod state_dir;
