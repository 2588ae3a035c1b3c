//! A shard's answer to a query, run-length encoded.
//!
//! Consecutive positions a shard answers usually have the same holders: in a
//! well-routed fleet every block of a prompt's prefix sits on the same worker(s). So
//! instead of one match per (position, worker), an answer lists the positions it
//! answered and cuts them into *runs* of consecutive answered positions with identical
//! holder sets; each run stores its holders once. A 64-block prompt held by one worker
//! is then one run of one holder, and [`merge`](super::merge) does per-run, not
//! per-position, work.
//!
//! Guarantees (upheld by [`IndexShard`](super::IndexShard)'s queries and
//! [`ShardAnswer::from_matches`]; [`merge`](super::merge) relies on them):
//! - `positions` is strictly increasing; every answered position has at least one live
//!   holder;
//! - runs tile `positions` in order: run `k` covers `positions[runs[k-1].end..runs[k].end]`
//!   (from 0 for the first run) and its holders are
//!   `holders[runs[k-1].holders_end..runs[k].holders_end]`; no run is empty and two
//!   consecutive runs have different holder sets;
//! - a run's holders are sorted by worker, one per worker (its best tier).

use crate::types::{Tier, WorkerSlot};

/// One live holder of one queried position (the expanded form of an answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// Position of the block in the request (0-based).
    pub pos: u32,
    pub worker: WorkerSlot,
    pub tier: Tier,
}

/// One holder of a run: a worker and its best tier for every position of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub worker: WorkerSlot,
    pub tier: Tier,
}

/// One run of an answer: where it ends in `positions` and in `holders` (exclusive;
/// it starts where the previous run ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub end: u32,
    pub holders_end: u32,
}

/// A shard's answer to the positions it owns. See the module docs for its form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardAnswer {
    /// Answered positions, increasing.
    pub positions: Vec<u32>,
    /// Runs of consecutive answered positions sharing one holder set.
    pub runs: Vec<Run>,
    /// Holders of the runs, concatenated in run order.
    pub holders: Vec<Holder>,
    /// First queried position that has NO live holder at all in this shard, or
    /// `u32::MAX` if every queried position had one.
    pub first_miss: u32,
}

impl Default for ShardAnswer {
    /// An empty answer that does not limit the prefix (`first_miss == u32::MAX`).
    fn default() -> Self {
        ShardAnswer {
            positions: Vec::new(),
            runs: Vec::new(),
            holders: Vec::new(),
            first_miss: u32::MAX,
        }
    }
}

impl ShardAnswer {
    /// Empties the answer, keeping its capacity.
    pub fn clear(&mut self) {
        self.positions.clear();
        self.runs.clear();
        self.holders.clear();
        self.first_miss = u32::MAX;
    }

    /// Reserves room for `positions` more answered positions (and as many runs and
    /// holders: the one-holder worst case of all-different runs).
    pub(crate) fn reserve(&mut self, positions: usize) {
        self.positions.reserve(positions);
        self.runs.reserve(positions);
        self.holders.reserve(positions);
    }

    /// Appends answered position `pos` (above every position so far) whose holders are
    /// `holders[from..]`, just pushed by the caller: extends the last run if they are
    /// the same as its holders (then drops the pushed copy), else starts a run. The
    /// caller must [`ShardAnswer::close`] the answer when done.
    #[inline]
    pub(crate) fn push_position(&mut self, pos: u32, from: usize) {
        self.close();
        let idx = self.positions.len() as u32 + 1;
        self.positions.push(pos);
        let n = self.runs.len();
        if n > 0 {
            // The last run's holders are `holders[prev..from]`.
            let prev = n
                .checked_sub(2)
                .and_then(|i| self.runs.get(i))
                .map_or(0, |r| r.holders_end as usize);
            if self.holders.get(prev..from) == self.holders.get(from..) {
                self.holders.truncate(from);
                if let Some(last) = self.runs.last_mut() {
                    last.end = idx;
                }
                return;
            }
        }
        self.runs.push(Run {
            end: idx,
            holders_end: self.holders.len() as u32,
        });
    }

    /// Extends the last run by answered position `pos` (same holders); the run's end
    /// is written by the next [`ShardAnswer::push_position`] or [`ShardAnswer::close`].
    #[inline(always)]
    pub(crate) fn repeat_position(&mut self, pos: u32) {
        self.positions.push(pos);
    }

    /// Appends the answered positions `positions.len()..n` (same holders as the last
    /// run): the one-shard query, whose answered positions are `0..`, writes them in
    /// bulk instead of one push per position (see `IndexShard::query_seq`). The run's
    /// end is written as by [`ShardAnswer::repeat_position`].
    #[inline]
    pub(crate) fn fill_positions(&mut self, n: u32) {
        let from = self.positions.len() as u32;
        self.positions.extend(from..n);
    }

    /// Ends the last run at the last answered position (after
    /// [`ShardAnswer::repeat_position`]s).
    #[inline]
    pub(crate) fn close(&mut self) {
        if let Some(last) = self.runs.last_mut() {
            last.end = self.positions.len() as u32;
        }
    }

    /// The runs as (positions, holders) slices, in order.
    pub fn iter_runs(&self) -> impl Iterator<Item = (&[u32], &[Holder])> + '_ {
        let mut p0 = 0usize;
        let mut h0 = 0usize;
        self.runs.iter().map(move |r| {
            let (p1, h1) = (r.end as usize, r.holders_end as usize);
            let ps = self.positions.get(p0..p1).unwrap_or_default();
            let hs = self.holders.get(h0..h1).unwrap_or_default();
            p0 = p1;
            h0 = h1;
            (ps, hs)
        })
    }

    /// The answer expanded to one match per (position, holder), sorted by position then
    /// worker (tests, diagnostics).
    pub fn matches(&self) -> impl Iterator<Item = Match> + '_ {
        self.iter_runs().flat_map(|(ps, hs)| {
            ps.iter().flat_map(move |&pos| {
                hs.iter().map(move |h| Match {
                    pos,
                    worker: h.worker,
                    tier: h.tier,
                })
            })
        })
    }

    /// The answer holding `matches` (any order; for a (position, worker) given several
    /// times the best tier counts), with `first_miss`.
    pub fn from_matches(first_miss: u32, matches: &[Match]) -> ShardAnswer {
        let mut ms = matches.to_vec();
        ms.sort_unstable_by_key(|m| (m.pos, m.worker, m.tier as u8));
        ms.dedup_by_key(|m| (m.pos, m.worker));
        let mut a = ShardAnswer {
            first_miss,
            ..ShardAnswer::default()
        };
        let mut i = 0;
        while i < ms.len() {
            let pos = ms[i].pos;
            let from = a.holders.len();
            while let Some(m) = ms.get(i).filter(|m| m.pos == pos) {
                a.holders.push(Holder {
                    worker: m.worker,
                    tier: m.tier,
                });
                i += 1;
            }
            a.push_position(pos, from);
        }
        a.close();
        a
    }
}
