//! Warm-restart snapshots: the worker registry (specs, epochs, sequence resume points)
//! and every live index entry, in one file written atomically.
//!
//! Format (all integers little-endian): magic `KVRS`, version u16, u32 length + JSON
//! of the saved workers, then per saved worker: u64 count and `count` × (u8 tier, u64
//! hash). Decoding validates everything and never panics; a corrupt or foreign file
//! is an error, never a partial restore. Writing goes to `NAME.tmp`, is fsynced, then
//! renamed over `NAME` (and the directory fsynced), so a crash mid-write leaves the
//! previous snapshot intact.

use crate::types::{Tier, WorkerSpec};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"KVRS";
const VERSION: u16 = 1;
/// File name inside the state directory.
pub const FILE_NAME: &str = "kvroute.snapshot";

/// A worker as saved: its registration and where its event stream resumes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedWorker {
    pub spec: WorkerSpec,
    /// Registered over the event protocol (subject to heartbeats).
    pub heartbeat: bool,
    pub next_seq: u64,
}

/// Everything a snapshot holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub workers: Vec<SavedWorker>,
    /// Per worker (same order as `workers`): its live (tier, hash) entries.
    pub entries: Vec<Vec<(Tier, u64)>>,
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("i/o on {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("not a kvroute snapshot or corrupt: {0}")]
    Corrupt(String),
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        let meta = serde_json::to_vec(&self.workers).unwrap_or_else(|_| b"[]".to_vec());
        let n: usize = self.entries.iter().map(|e| e.len()).sum();
        let mut out = Vec::with_capacity(16 + meta.len() + n * 9 + self.entries.len() * 8);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        out.extend_from_slice(&meta);
        for i in 0..self.workers.len() {
            let list = self.entries.get(i).map(|v| v.as_slice()).unwrap_or(&[]);
            out.extend_from_slice(&(list.len() as u64).to_le_bytes());
            for &(t, h) in list {
                out.push(t.as_u8());
                out.extend_from_slice(&h.to_le_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let bad = |m: &str| SnapshotError::Corrupt(m.to_string());
        let mut r = bytes;
        let mut take = |n: usize| -> Result<&[u8], SnapshotError> {
            if r.len() < n {
                return Err(bad("truncated"));
            }
            let (a, b) = r.split_at(n);
            r = b;
            Ok(a)
        };
        if take(4)? != MAGIC {
            return Err(bad("bad magic"));
        }
        let v = u16::from_le_bytes([take(1)?[0], take(1)?[0]]);
        if v != VERSION {
            return Err(SnapshotError::Corrupt(format!("unsupported version {v}")));
        }
        let len = u32::from_le_bytes(take(4)?.try_into().map_err(|_| bad("length"))?) as usize;
        let workers: Vec<SavedWorker> = serde_json::from_slice(take(len)?)
            .map_err(|e| SnapshotError::Corrupt(e.to_string()))?;
        let mut entries = Vec::with_capacity(workers.len());
        for _ in 0..workers.len() {
            let n = u64::from_le_bytes(take(8)?.try_into().map_err(|_| bad("count"))?);
            let n = usize::try_from(n).map_err(|_| bad("count"))?;
            let body = take(n.checked_mul(9).ok_or_else(|| bad("count"))?)?;
            let mut list = Vec::with_capacity(n);
            for c in body.chunks_exact(9) {
                let t = Tier::from_u8(c[0]).ok_or_else(|| bad("tier"))?;
                let h = u64::from_le_bytes(c[1..9].try_into().map_err(|_| bad("hash"))?);
                list.push((t, h));
            }
            entries.push(list);
        }
        if !consumed_all(bytes, &entries, len) {
            return Err(bad("trailing bytes"));
        }
        Ok(Snapshot { workers, entries })
    }
}

/// The decoded parts account for every byte of the input.
fn consumed_all(bytes: &[u8], entries: &[Vec<(Tier, u64)>], meta_len: usize) -> bool {
    let used = 10 + meta_len + entries.iter().map(|e| 8 + e.len() * 9).sum::<usize>();
    used == bytes.len()
}

/// Writes `snap` atomically to `dir/FILE_NAME`.
pub fn write(dir: &Path, snap: &Snapshot) -> Result<(), SnapshotError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| SnapshotError::Io { path, err }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let dst = dir.join(FILE_NAME);
    let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&snap.encode()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &dst).map_err(io(&dst))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads `dir/FILE_NAME`; `Ok(None)` when there is none yet.
pub fn read(dir: &Path) -> Result<Option<Snapshot>, SnapshotError> {
    let path = dir.join(FILE_NAME);
    match std::fs::read(&path) {
        Ok(bytes) => Snapshot::decode(&bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(SnapshotError::Io { path, err }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        let mut a = WorkerSpec::new("a");
        a.epoch = 3;
        Snapshot {
            workers: vec![
                SavedWorker {
                    spec: a,
                    heartbeat: true,
                    next_seq: 42,
                },
                SavedWorker {
                    spec: WorkerSpec::new("b"),
                    heartbeat: false,
                    next_seq: 0,
                },
            ],
            entries: vec![vec![(Tier::Device, 1), (Tier::Host, u64::MAX)], vec![]],
        }
    }

    #[test]
    fn roundtrip_and_atomic_file() {
        let s = sample();
        assert_eq!(Snapshot::decode(&s.encode()).unwrap(), s);
        let dir = std::env::temp_dir().join(format!("kvroute-snap-{}", std::process::id()));
        assert!(read(&dir).unwrap().is_none());
        write(&dir, &s).unwrap();
        assert_eq!(read(&dir).unwrap().unwrap(), s);
        assert!(!dir.join(format!("{FILE_NAME}.tmp")).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_input_is_an_error_never_a_panic() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(Snapshot::decode(&extra).is_err());
        let mut bad_tier = bytes.clone();
        let pos = bad_tier.len() - 9 - 8 - 9;
        bad_tier[pos] = 9;
        assert!(Snapshot::decode(&bad_tier).is_err());
        assert!(Snapshot::decode(b"nope").is_err());
    }
}
