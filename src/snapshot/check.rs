//! Whether a decoded snapshot can be restored, whole, under the running settings.
//! Pure: a snapshot and the settings in, the first problem out.
//!
//! Restore is all or nothing: a snapshot that cannot come back entirely (an invalid
//! or repeated worker, more workers than `max_workers`, a bad or repeated request id,
//! hashes computed under other hash settings; entries over a worker's cap are found
//! by the restore itself, `RestoreError::NotRestored`) is
//! refused with a message naming the worker or request and the rule or setting, so
//! that nothing is dropped silently. The caller stops the start before any listener
//! binds; the operator fixes the setting or moves the file away to start cold.

use super::{HashParams, Snapshot};
use std::collections::HashMap;

/// The running settings a snapshot must fit.
#[derive(Clone, Debug)]
pub struct Expect {
    /// Hash parameters of this router (`HashParams::current(router.block_size)`).
    pub params: HashParams,
    /// `limits.max_workers`.
    pub max_workers: usize,
    /// `limits.max_blocks_per_worker` (the restore applies it; named in its errors).
    pub max_blocks_per_worker: u64,
}

/// Why a snapshot cannot be restored (each names the offending item and the rule).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error(
        "its hashes were computed with block_size {saved}, this router runs with \
         block_size {running} (--block-size / KVROUTE_BLOCK_SIZE / [router] block_size): \
         restart with block_size {saved}"
    )]
    BlockSize { saved: u32, running: u32 },
    #[error(
        "it was written by a build with another hash {what} ({saved}; this build: \
         {running}): its hashes mean nothing here"
    )]
    HashScheme {
        what: &'static str,
        saved: String,
        running: String,
    },
    #[error(
        "it holds {saved} workers, max_workers is {max} (--max-workers / \
         KVROUTE_MAX_WORKERS / [limits] max_workers): raise it to at least {saved}"
    )]
    TooManyWorkers { saved: usize, max: usize },
    #[error("saved worker #{index} {id:?} is invalid: {reason}")]
    InvalidWorker {
        index: usize,
        id: String,
        reason: String,
    },
    #[error("worker id {id:?} is saved twice (workers #{first} and #{second})")]
    DuplicateWorker {
        id: String,
        first: usize,
        second: usize,
    },
    #[error("it lists entries for {entries} workers but holds {workers} workers")]
    EntryLists { workers: usize, entries: usize },
    /// Found while restoring (`service::state::persist`), since the caps depend on how the
    /// hashes split over the cores: entries the index refused (over the worker's cap
    /// under these settings) or that repeat another.
    #[error(
        "saved worker {id:?}: {lost} of its {entries} index entries do not fit its cap \
         under these settings (capacity_blocks {capacity}, --max-blocks-per-worker \
         {max_blocks_per_worker}, {cores} cores), or repeat an entry: restart with the \
         previous --cores / --max-blocks-per-worker"
    )]
    NotRestored {
        id: String,
        entries: u64,
        lost: u64,
        capacity: u64,
        max_blocks_per_worker: u64,
        cores: usize,
    },
    #[error("saved request #{index} {id:?} is invalid: {reason}")]
    InvalidRequest {
        index: usize,
        id: String,
        reason: String,
    },
    #[error("request id {id:?} is saved twice (requests #{first} and #{second})")]
    DuplicateRequest {
        id: String,
        first: usize,
        second: usize,
    },
}

/// The first reason `snap` cannot be restored whole under `expect`, if any.
pub fn check(snap: &Snapshot, expect: &Expect) -> Result<(), RestoreError> {
    if let Some(saved) = &snap.params {
        let run = &expect.params;
        if saved.block_size != run.block_size {
            return Err(RestoreError::BlockSize {
                saved: saved.block_size,
                running: run.block_size,
            });
        }
        if saved.scheme != run.scheme {
            return Err(RestoreError::HashScheme {
                what: "scheme",
                saved: saved.scheme.clone(),
                running: run.scheme.clone(),
            });
        }
        if saved.seed != run.seed {
            return Err(RestoreError::HashScheme {
                what: "seed",
                saved: saved.seed.to_string(),
                running: run.seed.to_string(),
            });
        }
    }
    if snap.workers.len() > expect.max_workers {
        return Err(RestoreError::TooManyWorkers {
            saved: snap.workers.len(),
            max: expect.max_workers,
        });
    }
    if snap.entries.len() != snap.workers.len() {
        return Err(RestoreError::EntryLists {
            workers: snap.workers.len(),
            entries: snap.entries.len(),
        });
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(snap.workers.len());
    for (index, w) in snap.workers.iter().enumerate() {
        let id = &w.spec.id;
        w.spec
            .validate()
            .map_err(|reason| RestoreError::InvalidWorker {
                index,
                id: id.clone(),
                reason,
            })?;
        if let Some(&first) = seen.get(id.as_str()) {
            return Err(RestoreError::DuplicateWorker {
                id: id.clone(),
                first,
                second: index,
            });
        }
        seen.insert(id, index);
    }
    let workers = snap.workers.len() as u32;
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(snap.requests.len());
    for (index, saved) in snap.requests.iter().enumerate() {
        let r = &saved.request;
        let invalid = |reason| RestoreError::InvalidRequest {
            index,
            id: r.id.clone(),
            reason,
        };
        // The one id rule of every door (`ids`), so a restart accepts exactly the
        // requests a running router could have admitted.
        crate::ids::check("request id", &r.id).map_err(invalid)?;
        if r.decode_worker >= workers || r.prefill_worker.is_some_and(|p| p >= workers) {
            return Err(invalid("names a worker the snapshot does not hold".into()));
        }
        if let Some(&first) = ids.get(r.id.as_str()) {
            return Err(RestoreError::DuplicateRequest {
                id: r.id.clone(),
                first,
                second: index,
            });
        }
        ids.insert(&r.id, index);
    }
    Ok(())
}
