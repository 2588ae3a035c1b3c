//! The state directory at start (`--state-dir`): checked, locked and restored before
//! any listener binds, so an unusable directory, a directory another router uses, or a
//! snapshot that cannot come back whole stops the start (exit 2) with a message saying
//! what and how to proceed, instead of failing every snapshot later or restoring part.

use crate::service::state::persist::{restore, RestoredState};
use crate::snapshot::{self, Expect};
use std::io::Write;
use std::path::Path;

/// The state dir as opened at start: what was restored, and the lock that keeps a
/// second router off the directory for as long as this one runs.
#[derive(Default)]
pub struct StateDir {
    pub restored: Option<RestoredState>,
    pub lock: Option<std::fs::File>,
}

/// Name of the lock file inside the state directory.
pub const LOCK_NAME: &str = "kvroute.lock";

/// Takes `dir/LOCK_NAME` (an advisory `flock`, released when the process exits, even
/// by a crash): two routers sharing a state dir would overwrite each other's snapshots
/// and a restart would restore the wrong one.
fn lock_dir(dir: &Path) -> Result<std::fs::File, String> {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_NAME);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock(2) on a descriptor this function owns; no memory is shared.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::WouldBlock {
            return Err(format!("cannot lock {}: {err}", path.display()));
        }
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        let holder = holder.trim();
        let holder = if holder.is_empty() { "?" } else { holder };
        return Err(format!(
            "state_dir {} is in use by another kvroute (pid {holder}, holding {}); \
             give each router its own --state-dir",
            dir.display(),
            path.display()
        ));
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = writeln!(f, "{}", std::process::id());
    Ok(f)
}

/// At start with `state_dir`: probes the directory (exists or can be created, takes a
/// file), locks it, then reads and restores its snapshot whole. Any failure stops the
/// start before a listener binds, with a message saying what and how to proceed.
pub fn load_at_start(
    settings: &crate::settings::Settings,
    cores: usize,
    shard_bits: u32,
    replicated: bool,
) -> Result<StateDir, String> {
    let Some(dir) = &settings.state_dir else {
        return Ok(StateDir::default());
    };
    let path = Path::new(dir);
    snapshot::probe_dir(path).map_err(|e| {
        format!("state_dir {dir} cannot hold snapshots ({e}); fix it or choose another --state-dir")
    })?;
    let lock = Some(lock_dir(path)?);
    let file = path.join(snapshot::FILE_NAME);
    let cold = "move the file away to start cold, without warm restart";
    let Some(snap) = snapshot::read(path).map_err(|e| format!("{e} ({cold})"))? else {
        return Ok(StateDir {
            restored: None,
            lock,
        });
    };
    let age = std::fs::metadata(&file)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map_or_else(String::new, |d| format!(", written {} s ago", d.as_secs()));
    let limits = &settings.limits;
    let expect = Expect {
        params: snapshot::HashParams::current(settings.router.block_size),
        max_workers: limits.max_workers,
        max_blocks_per_worker: limits.max_blocks_per_worker,
    };
    let (workers, requests) = (snap.workers.len(), snap.requests.len());
    let entries: usize = snap.entries.iter().map(|e| e.len()).sum();
    let legacy = snap.params.is_none();
    let restored = restore(snap, &expect, cores, shard_bits, replicated, |c| {
        crate::service::routing::control::cap_per_shard(c, limits.max_blocks_per_worker, cores)
    })
    .map_err(|e| format!("cannot restore {}: {e} (or {cold})", file.display()))?;
    if legacy {
        eprintln!(
            "kvroute: {} is an older format without checksum or hash settings: \
             restored as if written with block_size {}",
            file.display(),
            settings.router.block_size
        );
    }
    eprintln!(
        "kvroute: restored {workers} workers, {entries} index entries and {requests} in-flight requests from {}{age}",
        file.display()
    );
    Ok(StateDir {
        restored: Some(restored),
        lock,
    })
}
