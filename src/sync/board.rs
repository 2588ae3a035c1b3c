//! Per-worker load figures readable from every core without locks.
//!
//! Each core owns one row of cells per worker slot and is its only writer; readers sum
//! the rows of all cores (the figures are additive, see `load::WorkerAgg`), except the
//! "oldest active prefill" triple, where the oldest across cores wins. Reads are
//! `Relaxed`: a router decision may see a figure a few microseconds stale.
//!
//! What a reader is guaranteed (checked by `tests/loom_board.rs`):
//! - every field it sees in a (core, slot) row is a value the row's writer published
//!   for that field (or the initial zero / "none"): no torn or invented values, since
//!   each field is one atomic word and `publish` writes only final values;
//! - per field, reads never go back in time (a later read of the same cell returns the
//!   same or a later publication: atomics are coherent).
//!
//! - change marks: after `publish(core, slot, ..)` returns, the next
//!   [`LoadBoard::take_changed`] of every reader core reports `slot`, and the fields it
//!   then reads are at least as recent as that publication (the mark is set with
//!   `Release` after the stores and taken with `Acquire`), so a reader that keeps its own
//!   copy of the figures and re-reads the reported slots never misses a publication.
//!
//! What it is NOT guaranteed: fields of one row are not a consistent snapshot. A read
//! racing with `publish` may combine fields from two consecutive publications, e.g.
//! `active_requests` of the newer one with `blocks_total` of the older, or an oldest
//! prefill whose `started_us` and `tokens` come from different requests. Each field is
//! still a real, recent figure of that worker, which is what the cost function needs;
//! the mix lasts only while one publication is in progress and the next read repairs
//! it. (The loom test `fields_are_not_a_snapshot` demonstrates such a mix.)

use super::atomic::{AtomicU64, Ordering};
use crate::load::{OldestPrefill, WorkerAgg};
use crate::types::WorkerSlot;

const F_ACTIVE: usize = 0;
const F_PREFILL_REQS: usize = 1;
const F_PREFILL_TOKENS: usize = 2;
const F_BLOCKS_TOTAL: usize = 3;
const F_OUTPUT_MILLI: usize = 4;
const F_OLDEST_START: usize = 5;
const F_OLDEST_TOKENS: usize = 6;
const F_OLDEST_PRED: usize = 7;
const F_UNIQUE: usize = 8;
const F_CACHED: usize = 9;
const FIELDS: usize = 10;
const NONE: u64 = u64::MAX;

/// What a core publishes for one worker.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Published {
    pub agg: WorkerAgg,
    /// Distinct active blocks of the worker in this core's active-block shard.
    pub blocks_unique: u64,
    /// Blocks of the worker in this core's index shard.
    pub cached_blocks: u64,
}

pub struct LoadBoard {
    cores: usize,
    slots: usize,
    cells: Box<[AtomicU64]>,
    /// Per reader core, one bit per slot: published since that core last looked.
    changed: Box<[AtomicU64]>,
}

impl LoadBoard {
    pub fn new(cores: usize, slots: usize) -> LoadBoard {
        let n = cores * slots * FIELDS;
        let cells: Vec<AtomicU64> = (0..n)
            .map(|i| {
                AtomicU64::new(if i % FIELDS == F_OLDEST_START {
                    NONE
                } else {
                    0
                })
            })
            .collect();
        let words = cores * slots.div_ceil(64);
        LoadBoard {
            cores,
            slots,
            cells: cells.into_boxed_slice(),
            changed: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn base(&self, core: usize, slot: WorkerSlot) -> Option<usize> {
        let s = slot as usize;
        (core < self.cores && s < self.slots).then(|| (core * self.slots + s) * FIELDS)
    }

    /// Writer side (only core `core` calls this for its row).
    pub fn publish(&self, core: usize, slot: WorkerSlot, p: &Published) {
        let Some(b) = self.base(core, slot) else {
            return;
        };
        let a = &p.agg;
        let c = &self.cells[b..b + FIELDS];
        #[cfg(loom)]
        if super::faults::active(super::faults::Fault::BoardResetFirst) {
            for cell in c {
                cell.store(0, Ordering::Relaxed);
            }
        }
        c[F_ACTIVE].store(a.active_requests as u64, Ordering::Relaxed);
        c[F_PREFILL_REQS].store(a.prefill_requests as u64, Ordering::Relaxed);
        c[F_PREFILL_TOKENS].store(a.prefill_tokens, Ordering::Relaxed);
        c[F_BLOCKS_TOTAL].store(a.blocks_total, Ordering::Relaxed);
        c[F_OUTPUT_MILLI].store(a.output_blocks_milli, Ordering::Relaxed);
        match a.oldest_prefill {
            Some(o) => {
                c[F_OLDEST_TOKENS].store(o.tokens, Ordering::Relaxed);
                c[F_OLDEST_PRED].store(o.predicted_us, Ordering::Relaxed);
                c[F_OLDEST_START].store(o.started_us, Ordering::Relaxed);
            }
            None => c[F_OLDEST_START].store(NONE, Ordering::Relaxed),
        }
        c[F_UNIQUE].store(p.blocks_unique, Ordering::Relaxed);
        c[F_CACHED].store(p.cached_blocks, Ordering::Relaxed);
        let words = self.slots.div_ceil(64);
        let bit = 1u64 << (slot % 64);
        for reader in 0..self.cores {
            if let Some(w) = self.changed.get(reader * words + usize::from(slot) / 64) {
                w.fetch_or(bit, Ordering::Release);
            }
        }
    }

    /// Reader side: appends the slots published since reader core `core` last called
    /// this, and forgets them. A slot published again meanwhile is reported again later.
    pub fn take_changed(&self, core: usize, out: &mut Vec<WorkerSlot>) {
        let words = self.slots.div_ceil(64);
        let Some(mine) = self.changed.get(core * words..(core + 1) * words) else {
            return;
        };
        for (i, w) in mine.iter().enumerate() {
            if w.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = w.swap(0, Ordering::Acquire);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                out.push((i * 64 + b) as WorkerSlot);
            }
        }
    }

    /// Reader side: the fleet view of one worker (sum over cores).
    pub fn read(&self, slot: WorkerSlot) -> Published {
        let mut out = Published::default();
        for core in 0..self.cores {
            let Some(b) = self.base(core, slot) else {
                break;
            };
            let c = &self.cells[b..b + FIELDS];
            let start = c[F_OLDEST_START].load(Ordering::Relaxed);
            let oldest = (start != NONE).then(|| OldestPrefill {
                started_us: start,
                tokens: c[F_OLDEST_TOKENS].load(Ordering::Relaxed),
                predicted_us: c[F_OLDEST_PRED].load(Ordering::Relaxed),
            });
            let agg = WorkerAgg {
                active_requests: c[F_ACTIVE].load(Ordering::Relaxed) as u32,
                prefill_requests: c[F_PREFILL_REQS].load(Ordering::Relaxed) as u32,
                prefill_tokens: c[F_PREFILL_TOKENS].load(Ordering::Relaxed),
                blocks_total: c[F_BLOCKS_TOTAL].load(Ordering::Relaxed),
                output_blocks_milli: c[F_OUTPUT_MILLI].load(Ordering::Relaxed),
                oldest_prefill: oldest,
            };
            out.agg.add(&agg);
            out.blocks_unique += c[F_UNIQUE].load(Ordering::Relaxed);
            out.cached_blocks += c[F_CACHED].load(Ordering::Relaxed);
        }
        out
    }

    /// Worker slots per core.
    pub fn slots(&self) -> usize {
        self.slots
    }
}
