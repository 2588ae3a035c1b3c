//! Warm-restart snapshots: the worker registry (specs, epochs, sequence resume points),
//! every live index entry and the in-flight requests, in one file written atomically.
//!
//! Format version 3 (all integers little-endian; docs/OPERATIONS.md "Warm restart" has the table):
//! magic `KVRS`, version u16 (3), the hash parameters that give the saved hashes their
//! meaning (u32 block size, u64 hash seed, u8 length + ASCII name of the hash scheme),
//! u32 length + JSON of the saved workers, then per saved worker: u64 count and
//! `count` × (u8 tier, u64 hash), then u64 request count and the requests (layout in
//! `requests`), and last a u64 XXH3-64 (seed 0) of every byte before it.
//!
//! Guarantees: a file whose checksum does not match is refused before any field is
//! parsed, so one flipped bit anywhere is an error, never a different index. Versions 1
//! and 2 (older builds) are still read: they carry no checksum and no hash parameters
//! (`Snapshot::params` is `None`), version 1 no requests either. Other versions are
//! refused with a message naming the versions this build reads. Decoding validates
//! every length against the bytes left and never panics. Whether a decoded snapshot
//! fits the running settings is `check`'s job (pure, all or nothing).
//!
//! Writing: the directory must exist (it is created and probed once at start,
//! [`probe_dir`]; a directory that vanishes later is not silently recreated, since it may
//! have been a mount point). The file goes to `NAME.tmp` (created afresh, never through
//! an existing file or link), is fsynced, then renamed over `NAME` (and the directory
//! fsynced), so a crash mid-write leaves the previous snapshot intact; on any failure
//! the temporary file is removed.

mod check;
mod error;
mod requests;
#[cfg(test)]
mod tests;

pub use check::{check, Expect, RestoreError};
use error::bad;
pub use error::SnapshotError;
use requests::Reader;
pub use requests::{SavedRequest, SavedReroute};

use crate::types::{Tier, WorkerSpec};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

const MAGIC: &[u8; 4] = b"KVRS";
const VERSION: u16 = 3;
/// File name inside the state directory.
pub const FILE_NAME: &str = "kvroute.snapshot";
/// Name of the temporary file a snapshot is written to before the rename.
pub const TMP_NAME: &str = "kvroute.snapshot.tmp";
/// Name of the probe file [`probe_dir`] writes and removes.
pub const PROBE_NAME: &str = "kvroute.snapshot.probe";
/// The block-hash scheme of this build (`crate::hash`): Dynamo's XXH3-64 chain over
/// little-endian u32 token ids, external ids mixed by XXH3-64 of their LE bytes.
pub const HASH_SCHEME: &str = "dynamo-xxh3-64";

/// The settings that give saved hashes their meaning: the same token prefix hashes to
/// the same value only under equal parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashParams {
    /// Tokens per block (`router.block_size`).
    pub block_size: u32,
    /// Seed of every XXH3 call of the scheme (`crate::hash::SEED`).
    pub seed: u64,
    /// Name of the scheme ([`HASH_SCHEME`] for this build).
    pub scheme: String,
}

impl HashParams {
    /// The parameters of this build with `block_size` tokens per block.
    pub fn current(block_size: u32) -> HashParams {
        HashParams {
            block_size,
            seed: crate::hash::SEED,
            scheme: HASH_SCHEME.to_string(),
        }
    }
}

/// A worker as saved: its registration and where its event stream resumes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedWorker {
    pub spec: WorkerSpec,
    /// Registered over the event protocol (subject to heartbeats).
    pub heartbeat: bool,
    pub next_seq: u64,
    /// In approximate mode (no event source; `index::approx`). Its modelled blocks are
    /// not saved: the model starts empty after a restart. Absent in older files: false.
    #[serde(default)]
    pub approximate: bool,
}

/// Everything a snapshot holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Hash parameters the hashes were computed under; `None` when read from a version
    /// 1 or 2 file (which did not record them). Always written (version 3).
    pub params: Option<HashParams>,
    pub workers: Vec<SavedWorker>,
    /// Per worker (same order as `workers`): its live (tier, hash) entries.
    pub entries: Vec<Vec<(Tier, u64)>>,
    /// In-flight requests (version 2 on; none when read from a version 1 file).
    pub requests: Vec<SavedRequest>,
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        let meta = serde_json::to_vec(&self.workers).unwrap_or_else(|_| b"[]".to_vec());
        let n: usize = self.entries.iter().map(|e| e.len()).sum();
        let mut out = Vec::with_capacity(64 + meta.len() + n * 9 + self.entries.len() * 8);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        // No params (never the case for a snapshot of a running service) is written as
        // block size 0, which decodes back to `None`.
        let (block_size, seed, scheme) = match &self.params {
            Some(p) => (p.block_size, p.seed, p.scheme.as_bytes()),
            None => (0, 0, &b""[..]),
        };
        out.extend_from_slice(&block_size.to_le_bytes());
        out.extend_from_slice(&seed.to_le_bytes());
        let scheme = &scheme[..scheme.len().min(usize::from(u8::MAX))];
        out.push(scheme.len() as u8);
        out.extend_from_slice(scheme);
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
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err(bad("bad magic"));
        }
        let v = r.u16()?;
        if !(1..=VERSION).contains(&v) {
            return Err(SnapshotError::Corrupt(format!(
                "unsupported version {v} (this build reads versions 1 to {VERSION})"
            )));
        }
        let mut params = None;
        if v >= 3 {
            // Checksum first: nothing of a damaged file is interpreted.
            let Some(split) = bytes.len().checked_sub(8).filter(|&s| s >= 6) else {
                return Err(bad("truncated"));
            };
            let (body, sum) = bytes.split_at(split);
            let stored = u64::from_le_bytes(sum.try_into().map_err(|_| bad("truncated"))?);
            let computed = xxh3_64(body);
            if stored != computed {
                return Err(SnapshotError::Corrupt(format!(
                    "checksum mismatch (stored {stored:016x}, computed {computed:016x}): \
                     the file was damaged after it was written"
                )));
            }
            r = Reader(&body[6..]);
            let block_size = r.u32()?;
            let seed = r.u64()?;
            let n = usize::from(r.u8()?);
            let scheme = std::str::from_utf8(r.take(n)?)
                .map_err(|_| bad("hash scheme name"))?
                .to_string();
            params = (block_size != 0).then_some(HashParams {
                block_size,
                seed,
                scheme,
            });
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
            params,
            workers,
            entries,
            requests,
        })
    }
}

/// Makes sure snapshots can be written to `dir`: creates it if missing, then writes,
/// fsyncs and removes a probe file. Also removes a temporary file a crash left behind.
/// Called once at start, so a read-only, full or misnamed state directory stops the
/// start instead of failing every snapshot later.
pub fn probe_dir(dir: &Path) -> Result<(), SnapshotError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| SnapshotError::Io { path, err }
    };
    if dir.exists() && !dir.is_dir() {
        return Err(io(dir)(std::io::Error::other(
            "exists but is not a directory",
        )));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tmp = dir.join(TMP_NAME);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&tmp)(e)),
        _ => {}
    }
    let probe = dir.join(PROBE_NAME);
    let _ = std::fs::remove_file(&probe);
    let written = create_fresh(&probe)
        .and_then(|mut f| f.write_all(b"kvroute probe\n").and_then(|_| f.sync_all()));
    let removed = std::fs::remove_file(&probe);
    written.map_err(io(&probe))?;
    removed.map_err(io(&probe))?;
    Ok(())
}

/// Opens `path` for writing, failing if anything (file, link, directory) is there.
fn create_fresh(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// Writes `snap` atomically to `dir/FILE_NAME`; returns the bytes written. On failure
/// no temporary file is left behind and the previous snapshot is untouched.
pub fn write(dir: &Path, snap: &Snapshot) -> Result<usize, SnapshotError> {
    let tmp = dir.join(TMP_NAME);
    let dst = dir.join(FILE_NAME);
    let bytes = snap.encode();
    // A temporary file left by a failed rename or a crash: replaced, never written
    // through (it could be a link planted in the directory).
    let _ = std::fs::remove_file(&tmp);
    let written = create_fresh(&tmp).and_then(|mut f| {
        f.write_all(&bytes)?;
        f.sync_all()
    });
    if let Err(err) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(SnapshotError::Io { path: tmp, err });
    }
    if let Err(err) = std::fs::rename(&tmp, &dst) {
        let _ = std::fs::remove_file(&tmp);
        return Err(SnapshotError::Io { path: dst, err });
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(bytes.len())
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
