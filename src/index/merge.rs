//! Merge of per-shard answers into per-worker overlaps (DESIGN §1 "Cache tiers and
//! overlap").
//!
//! For a request of `n` positions and each non-shared worker `w`, with `best(w, p)` the
//! best tier in which `w` holds position `p`:
//! - `device` = longest run from position 0 with `best == Device`;
//! - `host` = further consecutive positions with `best ∈ {Host, Device}`;
//! - `disk` = further consecutive positions held in any tier;
//! - `shared` = further consecutive positions, right after the worker's own run, held by
//!   any shared worker (in any tier). A worker with no own overlap gets the shared run
//!   from position 0 ([`MergeResult::get`] returns it for every absent worker).
//!
//! Equivalently, walking positions in order, a worker's *phase* is the worst best-tier
//! seen so far; each position adds one block to the phase's counter, and the first
//! position the worker does not hold ends its run. That is what [`merge`] computes, in
//! one pass over the matches, with per-worker state in a dense slot-indexed array that
//! is reset through a touched list, so the cost is O(matches + positions + shards ×
//! distinct positions) and nothing is allocated once the buffers have grown.

use crate::types::{Overlap, Tier, WorkerSlot};

/// One live holder of one queried position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// Position of the block in the request (0-based).
    pub pos: u32,
    pub worker: WorkerSlot,
    pub tier: Tier,
}

/// A shard's answer to the positions it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardAnswer {
    /// Live matches, sorted by position.
    pub matches: Vec<Match>,
    /// First queried position that has NO live holder at all in this shard, or
    /// `u32::MAX` if every queried position had one.
    pub first_miss: u32,
}

impl Default for ShardAnswer {
    /// An empty answer that does not limit the prefix (`first_miss == u32::MAX`).
    fn default() -> Self {
        ShardAnswer {
            matches: Vec::new(),
            first_miss: u32::MAX,
        }
    }
}

impl ShardAnswer {
    /// Empties the answer, keeping its capacity.
    pub fn clear(&mut self) {
        self.matches.clear();
        self.first_miss = u32::MAX;
    }
}

/// Merge state of one worker for the current query.
#[derive(Clone, Copy, Debug, Default)]
struct WState {
    /// The worker's own run covers positions `0..own_end`.
    own_end: u32,
    /// Worst tier index in the run so far (0 device, 1 host, 2 disk).
    phase: u8,
    /// Best tier index + 1 seen at the position being merged (0 = none).
    pending: u8,
    ov: Overlap,
}

/// Per-worker overlaps of one request; reusable across queries without reallocating.
#[derive(Debug, Default)]
pub struct MergeResult {
    /// Indexed by slot; only slots in `touched` differ from the default.
    state: Vec<WState>,
    touched: Vec<WorkerSlot>,
    /// Per position: does some shared worker hold it? Then suffix run lengths.
    shared_run: Vec<u32>,
    cursors: Vec<usize>,
    shared0: u32,
    end: u32,
    /// Scatter buffers of [`super::ShardedIndex::query`], kept here so that `query`
    /// can take the index by shared reference and still not allocate.
    pub(crate) scratch: QueryScratch,
}

/// Reusable buffers of a sharded query.
#[derive(Debug, Default)]
pub(crate) struct QueryScratch {
    pub(crate) items: Vec<Vec<(u32, u64)>>,
    pub(crate) answers: Vec<ShardAnswer>,
}

impl MergeResult {
    /// An empty result.
    pub fn new() -> Self {
        Self::default()
    }

    /// Overlap of worker `w` (O(1)). Workers without own overlap — including shared
    /// workers and slots never seen — get only the shared run from position 0.
    pub fn get(&self, w: WorkerSlot) -> Overlap {
        match self.state.get(w as usize) {
            Some(s) if s.own_end > 0 => s.ov,
            _ => Overlap {
                shared: self.shared0,
                ..Overlap::default()
            },
        }
    }

    /// Non-shared workers with own overlap > 0, in order of first appearance.
    pub fn workers(&self) -> &[WorkerSlot] {
        &self.touched
    }

    /// Consecutive positions from 0 held by some shared worker.
    pub fn shared_from_start(&self) -> u32 {
        self.shared0
    }

    /// Bound of the merge: no overlap of any kind extends past this position (min of
    /// `n`, every shard's `first_miss` and one past the last matched position).
    pub fn end(&self) -> u32 {
        self.end
    }

    /// Resets to the empty result in O(touched workers).
    pub fn clear(&mut self) {
        for &w in &self.touched {
            if let Some(s) = self.state.get_mut(w as usize) {
                *s = WState::default();
            }
        }
        self.touched.clear();
        self.shared0 = 0;
        self.end = 0;
    }
}

/// Merges the shards' answers for a request of `n` positions into `out` (cleared
/// first). `is_shared(slot)` tells which workers are shared caches (role Shared): their
/// blocks count only as `shared` overlap and they never appear in `out.workers()`.
/// Each answer's matches must be sorted by position; a position may appear in several
/// answers (they are combined), and duplicate (position, worker) matches keep the best
/// tier. Matches at or beyond the global end are ignored.
pub fn merge(
    n: usize,
    answers: &[ShardAnswer],
    is_shared: impl Fn(WorkerSlot) -> bool,
    out: &mut MergeResult,
) {
    out.clear();
    // No prefix extends past a position nobody holds: not past `n`, any shard's first
    // miss, or the last matched position (this also bounds the scratch below by the
    // answers' size whatever `n` says).
    let mut end = u32::try_from(n).unwrap_or(u32::MAX);
    let mut last = 0u32;
    for a in answers {
        end = end.min(a.first_miss);
        if let Some(m) = a.matches.last() {
            last = last.max(m.pos.saturating_add(1));
        }
    }
    let end = end.min(last);
    out.end = end;
    let MergeResult {
        state,
        touched,
        shared_run,
        cursors,
        ..
    } = out;
    shared_run.clear();
    shared_run.resize(end as usize + 1, 0);
    cursors.clear();
    cursors.resize(answers.len(), 0);

    loop {
        // Next position with matches, over all answers.
        let mut p = end;
        for (a, &c) in answers.iter().zip(cursors.iter()) {
            if let Some(m) = a.matches.get(c) {
                p = p.min(m.pos);
            }
        }
        if p >= end {
            break;
        }
        // Pass 1: best tier per extending worker at p; note shared holders.
        for (a, &c) in answers.iter().zip(cursors.iter()) {
            for m in a.matches[c..].iter().take_while(|m| m.pos == p) {
                if is_shared(m.worker) {
                    shared_run[p as usize] = 1;
                    continue;
                }
                let i = m.worker as usize;
                if state.len() <= i {
                    if p != 0 {
                        continue; // never seen at 0: cannot have a run
                    }
                    state.resize(i + 1, WState::default());
                }
                let s = &mut state[i];
                if s.own_end == p {
                    let t = m.tier as u8 + 1;
                    if s.pending == 0 || t < s.pending {
                        s.pending = t;
                    }
                }
            }
        }
        // Pass 2: extend each pending worker once, and advance the cursors.
        for (a, c) in answers.iter().zip(cursors.iter_mut()) {
            for m in a.matches[*c..].iter().take_while(|m| m.pos == p) {
                *c += 1;
                let Some(s) = state.get_mut(m.worker as usize) else {
                    continue;
                };
                if s.own_end != p || s.pending == 0 {
                    continue;
                }
                s.phase = s.phase.max(s.pending - 1);
                s.pending = 0;
                s.own_end = p + 1;
                match s.phase {
                    0 => s.ov.device += 1,
                    1 => s.ov.host += 1,
                    _ => s.ov.disk += 1,
                }
                if p == 0 {
                    touched.push(m.worker);
                }
            }
        }
    }

    // Suffix lengths of shared-held runs: shared_run[p] = run starting at p.
    for p in (0..end as usize).rev() {
        if shared_run[p] != 0 {
            shared_run[p] = shared_run[p + 1] + 1;
        }
    }
    for &w in touched.iter() {
        let s = &mut state[w as usize];
        s.ov.shared = shared_run.get(s.own_end as usize).copied().unwrap_or(0);
    }
    out.shared0 = shared_run.first().copied().unwrap_or(0);
}
