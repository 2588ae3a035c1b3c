//! Entry budgets shared by every shard: an exact per-worker limit and a global bound
//! on the whole index.
//!
//! A worker's blocks are spread over all shards (one per core), so a per-shard cap
//! can only approximate a per-worker limit (it had to leave slack for the uneven
//! split: 1.25× the documented figure). Instead, every shard attached to one
//! [`Budget`] reserves entries from two shared counters before it adds them: the
//! worker's (against the cap set for it) and the index's (against the global limit),
//! and returns what it did not use when the batch is done; removals and clears give
//! entries back. Guarantees:
//! - live entries never exceed a worker's cap nor the global limit, counted over all
//!   shards (exact, not approximate), except entries restored from a snapshot taken
//!   under higher limits, which stay until removed while new ones are refused;
//! - a store is refused only when the cap or limit is reached by live entries plus
//!   reservations of batches being applied at that moment on other cores (at most one
//!   batch, ≤ 1,024 hashes, per core): with no concurrent batch for the worker, a
//!   store is refused exactly when the limit is reached;
//! - two atomic read-modify-writes per batch and per counter, none per entry.

use crate::types::WorkerSlot;
use std::sync::atomic::{AtomicU64, Ordering};

/// What [`Budget::reserve`] granted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// Entries the caller may add now (and must [`Budget::release`] if unused).
    pub granted: u64,
    /// What the worker's own cap alone would have granted (`granted` is less when the
    /// global limit cut it).
    pub worker_room: u64,
}

/// Shared counters of live (plus reserved) entries. See the module docs.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    total: AtomicU64,
    per_worker: Box<[AtomicU64]>,
}

/// Adds up to `want` to `c` without passing `cap`; returns what was added.
fn take(c: &AtomicU64, cap: u64, want: u64) -> u64 {
    let mut cur = c.load(Ordering::Relaxed);
    loop {
        let g = want.min(cap.saturating_sub(cur));
        if g == 0 {
            return 0;
        }
        match c.compare_exchange_weak(cur, cur + g, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return g,
            Err(now) => cur = now,
        }
    }
}

/// Subtracts up to `n` from `c` (never below 0); returns what was subtracted.
fn give_back(c: &AtomicU64, n: u64) -> u64 {
    match c.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    }) {
        Ok(old) | Err(old) => old.min(n),
    }
}

impl Budget {
    /// Counters for worker slots `0..max_workers` and at most `limit` entries overall.
    pub fn new(max_workers: usize, limit: u64) -> Budget {
        Budget {
            limit,
            total: AtomicU64::new(0),
            per_worker: (0..max_workers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The global limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Live plus reserved entries, overall.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Live plus reserved entries of worker `w`.
    pub fn held(&self, w: WorkerSlot) -> u64 {
        self.per_worker
            .get(w as usize)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Reserves up to `want` entries for worker `w`, whose cap is `cap`. Slots beyond
    /// the budget's range get nothing.
    pub fn reserve(&self, w: WorkerSlot, cap: u64, want: u64) -> Grant {
        let Some(c) = self.per_worker.get(w as usize) else {
            return Grant::default();
        };
        let worker_room = take(c, cap, want);
        let granted = take(&self.total, self.limit, worker_room);
        if granted < worker_room {
            give_back(c, worker_room - granted);
        }
        Grant {
            granted,
            worker_room,
        }
    }

    /// Gives back `n` entries of worker `w` (unused reservation, removals, clears).
    pub fn release(&self, w: WorkerSlot, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(c) = self.per_worker.get(w as usize) {
            let n = give_back(c, n);
            give_back(&self.total, n);
        }
    }

    /// Counts `n` entries of worker `w` that already exist (a shard attached after it
    /// was filled, e.g. restored from a snapshot), whatever the limits.
    pub fn add_existing(&self, w: WorkerSlot, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(c) = self.per_worker.get(w as usize) {
            c.fetch_add(n, Ordering::AcqRel);
            self.total.fetch_add(n, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_cap_and_global_limit_are_exact() {
        let b = Budget::new(4, 10);
        assert_eq!(
            b.reserve(0, 6, 8),
            Grant {
                granted: 6,
                worker_room: 6
            }
        );
        assert_eq!(b.reserve(0, 6, 1).granted, 0);
        // The global limit cuts worker 1 below its own room.
        assert_eq!(
            b.reserve(1, 100, 7),
            Grant {
                granted: 4,
                worker_room: 7
            }
        );
        assert_eq!((b.total(), b.held(1)), (10, 4));
        b.release(0, 2);
        assert_eq!(b.reserve(1, 100, 5).granted, 2);
        assert_eq!(b.reserve(9, 100, 5).granted, 0, "slot out of range");
        b.add_existing(2, 50);
        assert_eq!(b.total(), 60);
        b.release(2, 1000);
        assert_eq!((b.total(), b.held(2)), (10, 0));
    }
}
