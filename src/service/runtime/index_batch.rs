//! Cutting one worker's index operations into batches of at most [`BATCH_HASHES`] block
//! hashes, for every event source (binary connections, JSON bodies, ZMQ streams).
//!
//! Why: a shard applies a batch without yielding, and a routing query queued behind it
//! waits for all of it (`run_loop`). Bounding the hashes per batch bounds that wait,
//! whatever a worker sends in one event or one request body.
//!
//! Guarantees: batches keep the operations' order and every hash exactly once; no
//! batch holds more than [`BATCH_HASHES`] hashes (an event larger than that is split
//! into consecutive parts of the same kind); wire hash lists are split without copying
//! (owned lists of more than one batch are copied once, into one `Arc` per part).
//! Pure: no I/O; callers send each batch as it comes out.

use crate::codec::HashList;
use crate::engines::adapter::Change;
use crate::service::runtime::msg::{Hashes, IndexOp};

/// Most block hashes in one index batch. 1,024 hashes are about 25–50 µs of shard work
/// split over the cores, and still amortise the per-batch cost (one `Arc` and one
/// message per core) over many hashes.
pub const BATCH_HASHES: usize = 1024;

/// Index operations of one worker waiting to be sent.
#[derive(Default)]
pub struct Batch {
    ops: Vec<IndexOp>,
    hashes: usize,
}

impl Batch {
    /// Adds a Stored/Removed event's wire hashes (split zero-copy); full batches are
    /// pushed to `full`, in order.
    pub fn add_wire(
        &mut self,
        hashes: HashList,
        make: impl Fn(Hashes) -> IndexOp,
        full: &mut Vec<Vec<IndexOp>>,
    ) {
        for part in hashes.chunks(BATCH_HASHES) {
            self.add_part(Hashes::Wire(part), &make, full);
        }
    }

    /// Adds a Stored/Removed event's owned hashes; full batches are pushed to `full`.
    pub fn add_owned(
        &mut self,
        hashes: Vec<u64>,
        make: impl Fn(Hashes) -> IndexOp,
        full: &mut Vec<Vec<IndexOp>>,
    ) {
        if hashes.len() <= BATCH_HASHES {
            self.add_part(Hashes::Owned(hashes.into()), &make, full);
        } else {
            for part in hashes.chunks(BATCH_HASHES) {
                self.add_part(Hashes::Owned(part.into()), &make, full);
            }
        }
    }

    /// Adds one owned change (JSON events and ZMQ streams); returns its kind for the
    /// event metrics (`stored`, `removed`, `cleared`).
    pub fn add_change(&mut self, c: Change, full: &mut Vec<Vec<IndexOp>>) -> &'static str {
        match c {
            Change::Stored { tier, hashes } => {
                self.add_owned(hashes, |hashes| IndexOp::Stored { tier, hashes }, full);
                "stored"
            }
            Change::Removed { tier, hashes } => {
                self.add_owned(hashes, |hashes| IndexOp::Removed { tier, hashes }, full);
                "removed"
            }
            Change::Cleared { tier } => {
                self.push(IndexOp::Cleared { tier });
                "cleared"
            }
        }
    }

    /// Adds an operation without hashes (a clear, a cap change).
    pub fn push(&mut self, op: IndexOp) {
        self.ops.push(op);
    }

    fn add_part(
        &mut self,
        part: Hashes,
        make: &impl Fn(Hashes) -> IndexOp,
        full: &mut Vec<Vec<IndexOp>>,
    ) {
        if self.hashes + part.len() > BATCH_HASHES && !self.ops.is_empty() {
            full.push(self.take());
        }
        self.hashes += part.len();
        self.ops.push(make(part));
    }

    /// The operations gathered so far (possibly none), leaving the batch empty.
    pub fn take(&mut self) -> Vec<IndexOp> {
        self.hashes = 0;
        std::mem::take(&mut self.ops)
    }

    /// Hashes in the pending operations.
    pub fn hashes(&self) -> usize {
        self.hashes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Tier;

    fn hashes_of(ops: &[IndexOp]) -> Vec<u64> {
        let mut out = Vec::new();
        for op in ops {
            match op {
                IndexOp::Stored { hashes, .. } | IndexOp::Removed { hashes, .. } => match hashes {
                    Hashes::Wire(w) => out.extend(w.iter()),
                    Hashes::Owned(v) => out.extend(v.iter().copied()),
                },
                _ => {}
            }
        }
        out
    }

    fn stored(hashes: Hashes) -> IndexOp {
        IndexOp::Stored {
            tier: Tier::Device,
            hashes,
        }
    }

    #[test]
    fn batches_are_capped_and_keep_order() {
        let big: Vec<u64> = (0..(BATCH_HASHES as u64 * 2 + 10)).collect();
        let small: Vec<u64> = (10_000..10_100).collect();
        for owned in [false, true] {
            let mut batch = Batch::default();
            let mut full = Vec::new();
            for list in [&small, &big, &small] {
                if owned {
                    batch.add_owned(list.clone(), stored, &mut full);
                } else {
                    batch.add_wire(HashList::from_slice(list), stored, &mut full);
                }
            }
            batch.push(IndexOp::Cleared { tier: None });
            full.push(batch.take());
            let counts: Vec<usize> = full.iter().map(|b| hashes_of(b).len()).collect();
            assert!(counts.iter().all(|&c| c <= BATCH_HASHES), "{counts:?}");
            let joined: Vec<u64> = full.iter().flat_map(|b| hashes_of(b)).collect();
            let expected: Vec<u64> = small.iter().chain(&big).chain(&small).copied().collect();
            assert_eq!(joined, expected);
            assert!(matches!(
                full.last().and_then(|b| b.last()),
                Some(IndexOp::Cleared { tier: None })
            ));
            assert_eq!(batch.hashes(), 0);
            assert!(batch.take().is_empty());
        }
    }
}
