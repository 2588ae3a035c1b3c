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
//! Equivalently, with `own_end` the first position `w` does not hold, `dev_end` the
//! first position whose best tier is worse than device and `host_end` the first whose
//! best tier is disk: `device = min(dev_end, own_end)`, `host` and `disk` the
//! differences up to `min(host_end, own_end)` and `own_end`. Each of the three is a
//! minimum over positions, so it is a minimum over shards of the same figure taken over
//! the positions each shard owns — which is what [`merge`] computes, per run of an
//! answer ([`ShardAnswer`]), not per position: only workers holding position 0 can have
//! an overlap (the *candidates*, the holders of the first run of the answer owning
//! position 0); within one answer a candidate's coverage (how many of its answered
//! positions it holds from the first) grows by a whole run at a time, and where it stops
//! in that answer is where its run stops. Per-worker state lives in a dense
//! slot-indexed array whose entries are valid only when stamped with the current query
//! (nothing is cleared per query) and knows whether the worker is shared, so
//! `is_shared` is asked once per distinct worker per query. The cost is
//! O(runs + run holders + answers × candidates), plus O(positions) only for runs held
//! by a shared worker, and nothing is allocated once the buffers have grown.

use super::answer::ShardAnswer;
use super::holders::Holders;
use crate::types::{Overlap, Tier, WorkerSlot};

/// Merge state of one worker for the current query (valid when `stamp` is current).
#[derive(Clone, Copy, Debug, Default)]
struct WState {
    /// Query stamp of the last write; any other value means "not seen this query".
    stamp: u32,
    /// A candidate (holds position 0, not shared): only those get an own overlap.
    cand: bool,
    /// A shared cache (its holdings only feed the shared runs).
    shared: bool,
    /// 1 + the index of the answer `cov` counts in (0: none yet).
    ans: u32,
    /// The worker holds the first `cov` answered positions of answer `ans - 1`.
    cov: u32,
    /// First position the worker does not hold, over the answers merged so far (0 for a
    /// non-candidate).
    own_end: u32,
    /// First position whose best tier is worse than device (`u32::MAX`: none found).
    dev_end: u32,
    /// First position whose best tier is disk (`u32::MAX`: none found).
    host_end: u32,
}

impl WState {
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
    /// Per position below the end: answered by some answer (only when the answers do
    /// not cover every position, see [`merge`]).
    pub(crate) seen: Vec<bool>,
    shared0: u32,
    end: u32,
    /// Scatter buffers of [`super::ShardedIndex::query`], kept here so that `query`
    /// can take the index by shared reference and still not allocate.
    pub(crate) scratch: QueryScratch,
}

/// Reusable buffers of a sharded query.
#[derive(Debug, Default)]
pub(crate) struct QueryScratch {
    pub(crate) answers: Vec<ShardAnswer>,
    /// Per shard: the raw holders of the last position its answer got.
    pub(crate) prevs: Vec<Holders>,
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
    /// `n`, every shard's `first_miss`, one past the last answered position and the
    /// first position no answer covers).
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

/// State of `w` initialised for query `stamp` (grows the array if needed): a
/// candidate starts with `own_end = end`, every other worker with 0.
#[inline(never)]
fn first_sight(
    state: &mut Vec<WState>,
    w: WorkerSlot,
    stamp: u32,
    shared: bool,
    cand: bool,
    end: u32,
) -> Option<&mut WState> {
    let i = w as usize;
    if state.len() <= i {
        state.resize(i + 1, WState::default());
    }
    let s = state.get_mut(i)?;
    *s = WState {
        stamp,
        cand,
        shared,
        ans: 0,
        cov: 0,
        own_end: if cand { end } else { 0 },
        dev_end: u32::MAX,
        host_end: u32::MAX,
    };
    Some(s)
}

/// Merges the shards' answers for a request of `n` positions into `out` (cleared
/// first). `is_shared(slot)` tells which workers are shared caches (role Shared): their
/// blocks count only as `shared` overlap and they never appear in `out.workers()`.
/// It is called at most once per distinct worker.
///
/// Each answer must have the form [`ShardAnswer`] documents, and the answers must
/// answer disjoint positions (each position is owned by one shard). A position below
/// `n` that no answer covers is held by nobody: the merge ends there (a shard that
/// did not reply). Answered positions at or beyond the end are ignored.
pub fn merge(
    n: usize,
    answers: &[ShardAnswer],
    is_shared: impl Fn(WorkerSlot) -> bool,
    out: &mut MergeResult,
) {
    out.clear();
    // No prefix extends past a position nobody holds: not past `n`, any shard's first
    // miss, or the last answered position (this also bounds the scratch below by the
    // answers' size whatever `n` says).
    let mut end = u32::try_from(n).unwrap_or(u32::MAX);
    let mut last = 0u32;
    for a in answers {
        end = end.min(a.first_miss);
        if let Some(&p) = a.positions.last() {
            last = last.max(p.saturating_add(1));
        }
    }
    let mut end = end.min(last);
    // Every position below the end must be answered somewhere; if the counts say one
    // is not, the end moves to the first such position.
    let covered: usize = answers
        .iter()
        .map(|a| match a.positions.last() {
            // Positions increase: all of them lie below the end (the common case, no
            // binary search needed) when the last one does.
            Some(&p) if p < end => a.positions.len(),
            _ => a.positions.partition_point(|&p| p < end),
        })
        .sum();
    if covered != end as usize {
        end = first_unanswered(answers, end, covered, &mut out.seen);
    }
    out.end = end;
    if end == 0 {
        return;
    }
    // The answer owning position 0: its first run's holders are the candidates.
    let Some(first) = answers.iter().position(|a| a.positions.first() == Some(&0)) else {
        return;
    };
    let MergeResult {
        state,
        stamp,
        touched,
        shared_run,
        ..
    } = out;
    let stamp = *stamp;
    let a0 = &answers[first];
    let (first_end, first_holders) = a0
        .runs
        .first()
        .and_then(|r| Some((r.end, a0.holders.get(..r.holders_end as usize)?)))
        .unwrap_or_default();
    // The first run, applied while the candidates are initialised: each covers it,
    // from position 0 (so a tier worse than device there puts a boundary at 0).
    let first_tag = first as u32 + 1;
    let mut first_shared = false;
    for h in first_holders {
        let i = h.worker as usize;
        if state.len() <= i {
            state.resize(i + 1, WState::default());
        }
        let Some(s) = state.get_mut(i) else {
            continue;
        };
        if s.stamp == stamp {
            continue; // listed twice (not what shards produce): the first counts
        }
        let shared = is_shared(h.worker);
        *s = WState {
            stamp,
            cand: !shared,
            shared,
            ans: first_tag,
            cov: first_end,
            own_end: if shared { 0 } else { end },
            dev_end: if h.tier == Tier::Device { u32::MAX } else { 0 },
            host_end: if h.tier == Tier::Disk { 0 } else { u32::MAX },
        };
        if shared {
            first_shared = true;
        } else {
            touched.push(h.worker);
        }
    }
    let mut any_shared = false;
    let order = std::iter::once(first).chain((0..answers.len()).filter(|&i| i != first));
    for ai in order {
        let a = &answers[ai];
        let tag = ai as u32 + 1;
        let (mut i0, mut h0) = (0usize, 0usize);
        for r in &a.runs {
            let (i1, h1) = (r.end as usize, r.holders_end as usize);
            let (Some(ps), Some(hs)) = (a.positions.get(i0..i1), a.holders.get(h0..h1)) else {
                break;
            };
            let Some(&start) = ps.first() else {
                break;
            };
            if start >= end {
                break;
            }
            // The candidates' first run is applied above; only its shared marks remain.
            let hs = if ai == first && i0 == 0 { &[][..] } else { hs };
            let mut run_shared = ai == first && i0 == 0 && first_shared;
            for h in hs {
                let s = match state.get_mut(h.worker as usize) {
                    Some(s) if s.stamp == stamp => s,
                    _ => {
                        let shared = is_shared(h.worker);
                        match first_sight(state, h.worker, stamp, shared, false, end) {
                            Some(s) => s,
                            None => continue,
                        }
                    }
                };
                if s.cand {
                    if s.ans != tag {
                        s.ans = tag;
                        s.cov = 0;
                    }
                    if s.cov as usize == i0 {
                        s.cov = i1 as u32;
                        if h.tier != Tier::Device {
                            s.dev_end = s.dev_end.min(start);
                            if h.tier == Tier::Disk {
                                s.host_end = s.host_end.min(start);
                            }
                        }
                    }
                } else if s.shared {
                    run_shared = true;
                }
            }
            if run_shared {
                if !any_shared {
                    any_shared = true;
                    shared_run.clear();
                    shared_run.resize(end as usize + 1, 0);
                }
                for &p in ps.iter().take_while(|&&p| p < end) {
                    if let Some(x) = shared_run.get_mut(p as usize) {
                        *x = 1;
                    }
                }
            }
            i0 = i1;
            h0 = h1;
        }
        // Where each candidate's coverage of this answer stops is where its run stops.
        for &w in touched.iter() {
            if let Some(s) = state.get_mut(w as usize) {
                let cov = if s.ans == tag { s.cov as usize } else { 0 };
                if let Some(&p) = a.positions.get(cov) {
                    s.own_end = s.own_end.min(p);
                }
            }
        }
    }
    // Only answers that also claim position 0 (not what shards produce) can stop a
    // candidate at 0.
    if answers
        .iter()
        .filter(|a| a.positions.first() == Some(&0))
        .count()
        > 1
    {
        touched.retain(|&w| state.get(w as usize).is_some_and(|s| s.own_end > 0));
    }

    if any_shared {
        // Suffix lengths of shared-held runs: shared_run[p] = run starting at p.
        for p in (0..end as usize).rev() {
            if shared_run[p] != 0 {
                shared_run[p] = shared_run[p + 1] + 1;
            }
        }
        out.shared0 = out.shared_run.first().copied().unwrap_or(0);
    }
}

/// The first position below `end` that no answer answers (`end` if none): the slow
/// path of [`merge`] when the answers do not cover every position. `covered` answered
/// positions lie below `end`, so the first unanswered one is at most `covered`: the
/// scratch is bounded by the answers' size, whatever their positions say.
#[cold]
fn first_unanswered(
    answers: &[ShardAnswer],
    end: u32,
    covered: usize,
    seen: &mut Vec<bool>,
) -> u32 {
    let bound = (end as usize).min(covered.saturating_add(1));
    seen.clear();
    seen.resize(bound, false);
    for a in answers {
        for &p in a.positions.iter().take_while(|&&p| (p as usize) < bound) {
            if let Some(x) = seen.get_mut(p as usize) {
                *x = true;
            }
        }
    }
    seen.iter()
        .position(|&x| !x)
        .map_or(bound as u32, |p| p as u32)
}
