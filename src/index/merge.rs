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
//! seen so far; each position extends the worker's run in that phase, and the first
//! position the worker does not hold ends its run. That is what [`merge`] computes, in
//! one pass over the matches: per-worker state lives in a dense slot-indexed array
//! whose entries are valid only when stamped with the current query (so nothing is
//! cleared per query), records the run's end and the two positions where the phase
//! changed (the overlaps are differences of those), and knows whether the worker is
//! shared, so `is_shared` is asked once per distinct worker per query. The cost is
//! O(matches + positions × shards) with a few instructions per match, and nothing is
//! allocated once the buffers have grown.

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

/// Merge state of one worker for the current query (valid when `stamp` is current).
#[derive(Clone, Copy, Debug, Default)]
struct WState {
    /// Query stamp of the last write; any other value means "not seen this query".
    stamp: u32,
    /// The worker's own run covers positions `0..own_end`.
    own_end: u32,
    /// Position where the phase left device (`u32::MAX`: not yet).
    dev_end: u32,
    /// Position where the phase reached disk (`u32::MAX`: not yet).
    host_end: u32,
    /// Worst tier index in the run so far (0 device, 1 host, 2 disk).
    phase: u8,
    /// Phase before the last position of the run was applied.
    prev_phase: u8,
    /// Tier index that changed the phase at the last position of the run (0: the
    /// phase did not change there).
    last_t: u8,
    /// A shared cache (its matches only feed the shared runs).
    shared: bool,
}

impl WState {
    /// Extends the run by position `p` held in tier index `t`.
    #[inline(always)]
    fn extend(&mut self, p: u32, t: u8) {
        self.own_end = p + 1;
        if t <= self.phase {
            // No phase change at `p`: a better tier seen later at `p` changes nothing.
            self.last_t = 0;
        } else {
            self.transition(p, t);
        }
    }

    /// The phase worsens to `t` at position `p`.
    #[inline(never)]
    fn transition(&mut self, p: u32, t: u8) {
        let ph = self.phase;
        if ph == 0 {
            self.dev_end = p;
        }
        if t == 2 {
            self.host_end = p;
        }
        self.prev_phase = ph;
        self.phase = t;
        self.last_t = t;
    }

    /// Position `p`, already applied with tier `last_t`, is also held in better tier
    /// `t`: redo the transition made at `p`.
    #[cold]
    fn improve(&mut self, p: u32, t: u8) {
        if self.dev_end == p {
            self.dev_end = u32::MAX;
        }
        if self.host_end == p {
            self.host_end = u32::MAX;
        }
        self.phase = self.prev_phase;
        self.last_t = 0;
        if t > self.phase {
            self.transition(p, t);
        }
    }

    /// The overlap of the run (shared part excluded).
    #[inline]
    fn overlap(&self) -> Overlap {
        let e = self.own_end;
        let dev = self.dev_end.min(e);
        let host = self.host_end.min(e).max(dev);
        Overlap {
            device: dev,
            host: host - dev,
            disk: e - host,
            shared: 0,
        }
    }
}

/// Per-worker overlaps of one request; reusable across queries without reallocating.
#[derive(Debug, Default)]
pub struct MergeResult {
    /// Indexed by slot; only entries stamped `stamp` belong to the current result.
    state: Vec<WState>,
    stamp: u32,
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
    /// Per shard: the `(position, mix(hash))` it owns.
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
            Some(s) if s.stamp == self.stamp && !s.shared && s.own_end > 0 => Overlap {
                shared: self
                    .shared_run
                    .get(s.own_end as usize)
                    .copied()
                    .unwrap_or(0),
                ..s.overlap()
            },
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

    /// Resets to the empty result in O(1) (O(slots) once per 2^32 calls).
    pub fn clear(&mut self) {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            for s in &mut self.state {
                s.stamp = 0;
            }
            self.stamp = 1;
        }
        self.touched.clear();
        self.shared_run.clear();
        self.shared0 = 0;
        self.end = 0;
    }
}

/// State of `w` initialised for query `stamp` (grows the array if needed). A shared
/// worker's run can never start (`own_end` is `u32::MAX`).
#[inline(never)]
fn first_sight(
    state: &mut Vec<WState>,
    w: WorkerSlot,
    stamp: u32,
    shared: bool,
) -> Option<&mut WState> {
    let i = w as usize;
    if state.len() <= i {
        state.resize(i + 1, WState::default());
    }
    let s = state.get_mut(i)?;
    *s = WState {
        stamp,
        own_end: if shared { u32::MAX } else { 0 },
        dev_end: u32::MAX,
        host_end: u32::MAX,
        shared,
        ..WState::default()
    };
    Some(s)
}

/// Merges the shards' answers for a request of `n` positions into `out` (cleared
/// first). `is_shared(slot)` tells which workers are shared caches (role Shared): their
/// blocks count only as `shared` overlap and they never appear in `out.workers()`.
/// It is called at most once per distinct worker. Each answer's matches must be
/// sorted by position; a position may appear in several answers (they are combined),
/// and duplicate (position, worker) matches keep the best tier. Matches at or beyond
/// the global end are ignored.
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
        stamp,
        touched,
        shared_run,
        cursors,
        ..
    } = out;
    let stamp = *stamp;
    shared_run.clear();
    shared_run.resize(end as usize + 1, 0);

    // Applies one match; matches must come in position order (per answer, and across
    // answers for the same worker).
    let mut apply = |m: &Match| {
        let p = m.pos;
        let t = m.tier as u8;
        let s = match state.get_mut(m.worker as usize) {
            Some(s) if s.stamp == stamp => s,
            _ => {
                let shared = is_shared(m.worker);
                if p == 0 && !shared {
                    touched.push(m.worker);
                }
                match first_sight(state, m.worker, stamp, shared) {
                    Some(s) => s,
                    None => return,
                }
            }
        };
        if s.own_end == p {
            s.extend(p, t);
        } else if s.shared {
            if let Some(r) = shared_run.get_mut(p as usize) {
                *r = 1;
            }
        } else if s.own_end == p + 1 && t < s.last_t {
            s.improve(p, t);
        }
    };
    match answers {
        // One answer (one shard): its matches are already in position order.
        [a] => {
            for m in &a.matches {
                if m.pos >= end {
                    break;
                }
                apply(m);
            }
        }
        // Two shards (the usual service layout): a two-way merge by position.
        [a, b] => {
            let (a, b) = (&a.matches[..], &b.matches[..]);
            let (mut i, mut j) = (0usize, 0usize);
            loop {
                let pa = a.get(i).map_or(u32::MAX, |m| m.pos);
                let pb = b.get(j).map_or(u32::MAX, |m| m.pos);
                let p = pa.min(pb);
                if p >= end {
                    break;
                }
                while let Some(m) = a.get(i).filter(|m| m.pos == p) {
                    apply(m);
                    i += 1;
                }
                while let Some(m) = b.get(j).filter(|m| m.pos == p) {
                    apply(m);
                    j += 1;
                }
            }
        }
        _ => {
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
                for (a, c) in answers.iter().zip(cursors.iter_mut()) {
                    let rest = a.matches.get(*c..).unwrap_or_default();
                    let k = rest.iter().take_while(|m| m.pos == p).count();
                    *c += k;
                    for m in &rest[..k] {
                        apply(m);
                    }
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
    out.shared0 = out.shared_run.first().copied().unwrap_or(0);
}
