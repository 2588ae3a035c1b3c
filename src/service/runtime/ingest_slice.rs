//! Preemptible application of one index batch: a cursor that hands a shard at most
//! `ingest_slice_hashes` of its block hashes at a time, so the run loop can look at
//! its urgent inbox (routing queries, answers) between two slices.
//!
//! Why: a batch holds up to `index_batch::BATCH_HASHES` hashes (~25–50 µs of shard
//! work). Applied in one go, a routing query arriving meanwhile waits for all of it;
//! cut into slices, it waits for at most one slice, whatever the batch size.
//!
//! Guarantees (unit-tested below, and relied on by `run_loop`):
//! - the batch's operations are applied in order, and within an operation the shard's
//!   hashes in order, each exactly once: a slice never reorders, skips or repeats;
//! - no slice hands out more than `budget` hashes (an operation without hashes — a
//!   clear, a cap change — counts as one), and every slice makes progress (`budget`
//!   is taken as at least 1);
//! - the cursor owns the batch until it is done, so the run loop starts the next bulk
//!   message only after this one is fully applied: one worker's batches (which travel
//!   in one bulk lane, in order) are never interleaved, and per-worker order is kept;
//! - pure: no I/O, no clock; the caller decides what runs between slices.

use crate::service::runtime::msg::{IndexOp, Msg};
use crate::types::{Tier, WorkerSlot};
use std::sync::Arc;

/// One step of a batch handed to the shard.
#[derive(Debug)]
pub enum Piece<'a> {
    /// Apply these stores (consecutive hashes of one `Stored` operation).
    Stored(Tier, &'a [u64]),
    /// Apply these removes (consecutive hashes of one `Removed` operation).
    Removed(Tier, &'a [u64]),
    /// An operation without hashes (`Cleared`, `SetCap`).
    Other(&'a IndexOp),
}

/// A batch being applied slice by slice (see the module docs).
#[derive(Debug)]
pub struct IngestCursor {
    slot: WorkerSlot,
    gen: u64,
    ops: Arc<[IndexOp]>,
    /// Next operation to start or continue.
    op: usize,
    /// This shard's hashes of operation `op` (selected when it starts).
    sel: Vec<u64>,
    /// Hashes of `sel` already applied.
    done: usize,
    /// `sel` holds operation `op`'s hashes.
    selected: bool,
}

impl IngestCursor {
    /// A cursor over an index message, or the message back if it is not one.
    pub fn from_msg(msg: Msg) -> Result<IngestCursor, Msg> {
        match msg {
            Msg::Index { slot, gen, ops } => Ok(IngestCursor::new(slot, gen, ops)),
            other => Err(other),
        }
    }

    pub fn new(slot: WorkerSlot, gen: u64, ops: Arc<[IndexOp]>) -> IngestCursor {
        IngestCursor {
            slot,
            gen,
            ops,
            op: 0,
            sel: Vec::new(),
            done: 0,
            selected: false,
        }
    }

    /// Gives the cursor a buffer to reuse for its selected hashes (no allocation per
    /// batch once it has grown).
    pub fn reuse(&mut self, mut buf: Vec<u64>) {
        if !self.selected {
            buf.clear();
            self.sel = buf;
        }
    }

    /// The cursor's buffer, for the next batch's [`IngestCursor::reuse`].
    pub fn into_buf(self) -> Vec<u64> {
        self.sel
    }

    pub fn slot(&self) -> WorkerSlot {
        self.slot
    }

    pub fn gen(&self) -> u64 {
        self.gen
    }

    /// The batch's operations (all of them, applied or not).
    pub fn ops(&self) -> &[IndexOp] {
        &self.ops
    }

    /// Every operation has been handed out.
    pub fn is_done(&self) -> bool {
        self.op >= self.ops.len()
    }

    /// Hands out the next slice of at most `budget` hashes, piece by piece, to
    /// `apply`; `select(hashes, out)` replaces `out` with the shard's own hashes of
    /// an operation. Returns whether anything remains.
    pub fn step(
        &mut self,
        budget: usize,
        mut select: impl FnMut(&crate::service::runtime::msg::Hashes, &mut Vec<u64>),
        mut apply: impl FnMut(Piece<'_>),
    ) -> bool {
        let mut left = budget.max(1);
        while left > 0 {
            let Some(op) = self.ops.get(self.op) else {
                return false;
            };
            let (tier, hashes, stored) = match op {
                IndexOp::Stored { tier, hashes } => (*tier, hashes, true),
                IndexOp::Removed { tier, hashes } => (*tier, hashes, false),
                other => {
                    apply(Piece::Other(other));
                    left -= 1;
                    self.op += 1;
                    continue;
                }
            };
            if !self.selected {
                select(hashes, &mut self.sel);
                self.selected = true;
                self.done = 0;
            }
            let end = self.sel.len().min(self.done.saturating_add(left));
            let part = &self.sel[self.done..end];
            if !part.is_empty() {
                left -= part.len();
                apply(if stored {
                    Piece::Stored(tier, part)
                } else {
                    Piece::Removed(tier, part)
                });
            }
            self.done = end;
            if self.done >= self.sel.len() {
                self.op += 1;
                self.selected = false;
            }
        }
        !self.is_done()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::runtime::msg::Hashes;

    fn stored(v: &[u64]) -> IndexOp {
        IndexOp::Stored {
            tier: Tier::Device,
            hashes: Hashes::Owned(v.into()),
        }
    }

    fn removed(v: &[u64]) -> IndexOp {
        IndexOp::Removed {
            tier: Tier::Host,
            hashes: Hashes::Owned(v.into()),
        }
    }

    /// "This shard" owns the even hashes.
    fn select(h: &Hashes, out: &mut Vec<u64>) {
        out.clear();
        if let Hashes::Owned(v) = h {
            out.extend(v.iter().copied().filter(|x| x % 2 == 0));
        }
    }

    /// Applies the batch in slices of `budget`, recording (slice number, event).
    fn run(ops: Vec<IndexOp>, budget: usize) -> Vec<(usize, String)> {
        let mut c = IngestCursor::new(3, 7, ops.into());
        let mut log = Vec::new();
        let mut slice = 0usize;
        loop {
            let mut n = 0usize;
            let more = c.step(budget, select, |p| {
                let (ev, k) = match p {
                    Piece::Stored(t, h) => (format!("S{t:?}{h:?}"), h.len()),
                    Piece::Removed(t, h) => (format!("R{t:?}{h:?}"), h.len()),
                    Piece::Other(op) => (format!("O{op:?}"), 1),
                };
                n += k;
                log.push((slice, ev));
            });
            assert!(n <= budget.max(1), "slice {slice} applied {n} > {budget}");
            slice += 1;
            if !more {
                assert!(c.is_done());
                break;
            }
            assert!(n > 0, "a slice that leaves work must make progress");
        }
        log
    }

    /// Flattens a log into the per-hash order it applied.
    fn flat(log: &[(usize, String)]) -> String {
        log.iter()
            .map(|(_, e)| e.as_str())
            .collect::<Vec<_>>()
            .join("|")
    }

    #[test]
    fn slices_keep_order_and_apply_every_hash_once() {
        let ops = || {
            vec![
                stored(&(0..40).collect::<Vec<_>>()),
                IndexOp::Cleared { tier: None },
                removed(&[1, 3, 5]), // none of this shard's: nothing handed out
                removed(&(100..110).collect::<Vec<_>>()),
                IndexOp::SetCap(9),
                stored(&[2]),
            ]
        };
        let mut per_hash = Vec::new();
        for budget in [0usize, 1, 2, 3, 7, 20, 1000] {
            let log = run(ops(), budget);
            // Expand pieces to single hashes: the order must not depend on the budget.
            let mut seq = Vec::new();
            let mut c = IngestCursor::new(0, 0, ops().into());
            while c.step(budget, select, |p| match p {
                Piece::Stored(_, h) => seq.extend(h.iter().map(|x| format!("S{x}"))),
                Piece::Removed(_, h) => seq.extend(h.iter().map(|x| format!("R{x}"))),
                Piece::Other(op) => seq.push(format!("{op:?}")),
            }) {}
            per_hash.push(seq);
            assert!(!flat(&log).is_empty());
        }
        let expected: Vec<String> = (0..40)
            .filter(|x| x % 2 == 0)
            .map(|x| format!("S{x}"))
            .chain(["Cleared { tier: None }".to_string()])
            .chain((100..110).filter(|x| x % 2 == 0).map(|x| format!("R{x}")))
            .chain(["SetCap(9)".to_string(), "S2".to_string()])
            .collect();
        for seq in &per_hash {
            assert_eq!(seq, &expected);
        }
    }

    #[test]
    fn budget_bounds_every_slice() {
        // 20 own hashes + 1 clear + 5 own hashes at budget 4: 7 slices, none over 4.
        let ops = vec![
            stored(&(0..40).collect::<Vec<_>>()),
            IndexOp::Cleared {
                tier: Some(Tier::Disk),
            },
            removed(&(0..10).collect::<Vec<_>>()),
        ];
        let log = run(ops, 4);
        let slices = log.iter().map(|(s, _)| *s).max().unwrap_or(0) + 1;
        assert_eq!(slices, 7, "{log:?}");
    }

    #[test]
    fn non_index_messages_are_returned() {
        let m = Msg::Barrier { from: 1, qid: 2 };
        assert!(matches!(
            IngestCursor::from_msg(m),
            Err(Msg::Barrier { from: 1, qid: 2 })
        ));
        let c = IngestCursor::from_msg(Msg::Index {
            slot: 4,
            gen: 5,
            ops: vec![stored(&[2])].into(),
        });
        assert!(matches!(c, Ok(ref c) if c.slot() == 4 && c.gen() == 5 && !c.is_done()));
    }

    #[test]
    fn empty_batch_is_done_at_once() {
        let mut c = IngestCursor::new(0, 0, Vec::new().into());
        assert!(c.is_done());
        assert!(!c.step(8, select, |_| panic!("nothing to apply")));
    }
}
