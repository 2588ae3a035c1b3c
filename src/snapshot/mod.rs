//! Warm-restart snapshots: the worker registry (specs, epochs, sequence resume points),
//! every live index entry and the in-flight requests, in one file written atomically.
//!
//! Format (all integers little-endian): magic `KVRS`, version u16 (2), u32 length +
//! JSON of the saved workers, then per saved worker: u64 count and `count` × (u8 tier,
//! u64 hash), then u64 request count and the requests (layout in `requests`). Version 1
//! files end after the index entries; they are still read, with no requests. Other
//! versions are refused with a message naming the versions this build reads. Decoding validates everything and never panics; a corrupt or foreign file
//! is an error, never a partial restore. Writing goes to `NAME.tmp`, is fsynced, then
//! renamed over `NAME` (and the directory fsynced), so a crash mid-write leaves the
//! previous snapshot intact.

mod requests;

use requests::{bad, Reader};
pub use requests::{SavedRequest, SavedReroute};

use crate::types::{Tier, WorkerSpec};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"KVRS";
const VERSION: u16 = 2;
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
    /// In-flight requests (version 2; none when read from a version 1 file).
    pub requests: Vec<SavedRequest>,
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
        let mut out = Vec::with_capacity(24 + meta.len() + n * 9 + self.entries.len() * 8);
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
        out.extend_from_slice(&(self.requests.len() as u64).to_le_bytes());
        for r in &self.requests {
            r.encode(&mut out);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err(bad("bad magic"));
        }
        let v = r.u16()?;
        if v != 1 && v != VERSION {
            return Err(SnapshotError::Corrupt(format!(
                "unsupported version {v} (this build reads versions 1 and {VERSION})"
            )));
        }
        let len = r.u32()? as usize;
        let workers: Vec<SavedWorker> = serde_json::from_slice(r.take(len)?)
            .map_err(|e| SnapshotError::Corrupt(e.to_string()))?;
        let mut entries = Vec::with_capacity(workers.len());
        for _ in 0..workers.len() {
            let n = r.count(9)?;
            let mut list = Vec::with_capacity(n);
            for c in r.take(n * 9)?.chunks_exact(9) {
                let t = Tier::from_u8(c[0]).ok_or_else(|| bad("tier"))?;
                let h = u64::from_le_bytes(c[1..9].try_into().map_err(|_| bad("hash"))?);
                list.push((t, h));
            }
            entries.push(list);
        }
        let mut requests = Vec::new();
        if v >= 2 {
            let n = r.count(SavedRequest::MIN_LEN)?;
            requests.reserve(n);
            for _ in 0..n {
                requests.push(SavedRequest::decode(&mut r, workers.len())?);
            }
        }
        if !r.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(Snapshot {
            workers,
            entries,
            requests,
        })
    }
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
            requests: vec![
                SavedRequest {
                    id: "r-1".into(),
                    decode: 1,
                    prefill: Some(0),
                    input_tokens: 300,
                    cached_tokens: 128,
                    prompt_blocks: 3,
                    hashes: vec![5, 6, 7],
                    expected_output_tokens: Some(50),
                    in_prefill: true,
                    output_tokens: 0,
                    age_us: 1234,
                    first_token_age_us: None,
                    reroute: Some(SavedReroute {
                        filters: crate::select::Filters {
                            model: "m".into(),
                            ..Default::default()
                        },
                        mode: crate::config::Mode::Kv,
                    }),
                },
                SavedRequest {
                    id: "r-2".into(),
                    decode: 0,
                    prefill: None,
                    input_tokens: 10,
                    cached_tokens: 0,
                    prompt_blocks: 1,
                    hashes: vec![],
                    expected_output_tokens: None,
                    in_prefill: false,
                    output_tokens: 17,
                    age_us: 0,
                    first_token_age_us: Some(9),
                    reroute: None,
                },
            ],
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
        let s = sample();
        let mut no_requests = s.clone();
        no_requests.requests.clear();
        let mut bad_tier = no_requests.encode();
        let pos = bad_tier.len() - 8 - 8 - 9;
        bad_tier[pos] = 9;
        assert!(Snapshot::decode(&bad_tier).is_err());
        assert!(Snapshot::decode(b"nope").is_err());
        // A request naming a worker the snapshot does not have.
        let mut bad_worker = s.clone();
        bad_worker.requests[1].decode = 2;
        assert!(Snapshot::decode(&bad_worker.encode()).is_err());
        // A huge request count is refused before allocating.
        let mut huge = no_requests.encode();
        let n = huge.len();
        huge[n - 8..].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Snapshot::decode(&huge).is_err());
        // Every single-byte corruption is an error or a valid snapshot, never a panic.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xa5;
            let _ = Snapshot::decode(&b);
        }
    }

    #[test]
    fn version_1_files_are_read_without_requests_and_others_refused() {
        let mut v1 = sample();
        v1.requests.clear();
        let mut bytes = v1.encode();
        bytes.truncate(bytes.len() - 8); // version 1 ends after the index entries
        bytes[4..6].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(Snapshot::decode(&bytes).unwrap(), v1);
        bytes[4..6].copy_from_slice(&3u16.to_le_bytes());
        let e = Snapshot::decode(&bytes).unwrap_err().to_string();
        assert!(e.contains("unsupported version 3"), "{e}");
    }
}
