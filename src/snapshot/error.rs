//! Why a snapshot could not be read or written, for the decoder of every section.
//! A leaf of `snapshot`.

use std::path::PathBuf;

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("i/o on {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("not a kvroute snapshot or corrupt: {0}")]
    Corrupt(String),
}

pub(super) fn bad(m: &str) -> SnapshotError {
    SnapshotError::Corrupt(m.to_string())
}
