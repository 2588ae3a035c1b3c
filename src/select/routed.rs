//! Requests routed per worker, and the near-tie rule that reads them
//! (`balance_routed_min_ties`, docs/ROUTING.md "Ties and balance").
//!
//! With `balance_slack` the `kv` argmin treats every cost within the slack of the
//! minimum as tied. Taking ties in turn spreads *first* turns of conversations evenly,
//! but later turns rightly stay with the worker holding their history, and
//! conversations have one to many turns: on a large fleet, where most workers are idle
//! and near-tied most of the time, request counts drift apart by conversation length
//! (128 workers: max / mean 1.45). Giving a large near-tie set's request to the tied
//! worker with the fewest requests routed so far evens that out without overriding a
//! real cache hit (which stays outside the slack).
//!
//! The count is applied only when at least `min_ties` workers are near-tied. A small
//! fleet's tie sets are small and load-driven: there a count over-corrects (a worker
//! that fell behind draws every tied first turn until it catches up, and each of them
//! brings the conversation's later turns after it; applied to every tie set,
//! 8 workers go from 1.04 to 1.26 with default knobs and 1.36 with the tuned ones).
//!
//! A worker that comes back live (after a heartbeat timeout, say) has missed the
//! requests of its outage; left as it is, it would draw every large near-tie set
//! until it caught up. [`Routed::follow_liveness`] lifts its count to the lowest count
//! of the workers of its pool that stayed live, so it takes its share from then on.
//!
//! Guarantees: pure functions and plain per-position arrays; no allocation once they
//! have grown to the fleet; O(fleet) work only on a decision that sees liveness
//! changed (else one comparison of the liveness arrays); no panic on any input
//! (out-of-range positions are ignored, missing counts read as 0).

use super::fleet::Fleet;

/// Requests routed to each worker of one [`super::Fleet`], by fleet position, since
/// the counts were last fitted to a fleet of another size or cleared.
#[derive(Clone, Debug, Default)]
pub(crate) struct Routed {
    /// As f64: exact up to 2^53 requests, and compared in the kernel's float lanes.
    counts: Vec<f64>,
    /// Liveness by position at the last [`Routed::follow_liveness`].
    live: Vec<bool>,
}

impl Routed {
    /// Makes the counts fit a fleet of `n` positions; a different size starts afresh.
    pub(crate) fn fit(&mut self, n: usize) {
        if self.counts.len() != n {
            self.counts.clear();
            self.counts.resize(n, 0.0);
            self.live.clear();
        }
    }

    /// Forgets every count (the fleet was laid out anew).
    pub(crate) fn clear(&mut self) {
        self.counts.clear();
        self.live.clear();
    }

    /// Takes note of the fleet's liveness by position (`live`, the `Loads` array):
    /// every worker that became live since the last call gets the lowest count among
    /// the workers of its pool (same model and role: a contiguous run of positions)
    /// that were live then and are now, if it is lower.
    pub(crate) fn follow_liveness(&mut self, fleet: &Fleet, live: &[bool]) {
        if self.live.as_slice() == live {
            return;
        }
        let n = self.counts.len().min(live.len());
        let key = |p: usize| {
            let row = fleet.order.get(p).map_or(usize::MAX, |&r| r as usize);
            (fleet.model.get(row).copied(), fleet.role.get(row).copied())
        };
        let was = |p: usize| self.live.get(p).copied().unwrap_or(false);
        let mut start = 0;
        while start < n {
            let k = key(start);
            let end = (start..n).find(|&p| key(p) != k).unwrap_or(n);
            let stayed = (start..end).filter(|&p| was(p) && live[p]);
            let lo = stayed.map(|p| self.counts[p]).fold(f64::INFINITY, f64::min);
            if lo.is_finite() {
                for (p, &now) in live.iter().enumerate().take(end).skip(start) {
                    if now && !was(p) && self.counts[p] < lo {
                        self.counts[p] = lo;
                    }
                }
            }
            start = end;
        }
        self.live.clear();
        self.live.extend_from_slice(live);
    }

    /// Counts one more request routed to position `p`.
    pub(crate) fn note(&mut self, p: usize) {
        if let Some(c) = self.counts.get_mut(p) {
            *c += 1.0;
        }
    }

    /// The counts, by position.
    pub(crate) fn counts(&self) -> &[f64] {
        &self.counts
    }
}

/// Whether a near-tie set of `tied` workers is decided by the routed counts.
#[inline]
pub(crate) fn by_count(tied: u64, min_ties: u32) -> bool {
    min_ties > 0 && tied >= u64::from(min_ties)
}

/// Of the entries `0..n` that `tied` accepts, those with the lowest `count`, and of
/// them the `(turn mod k)`-th (k: how many share that count); `None` if none is tied.
pub(crate) fn fewest_routed(
    n: usize,
    tied: impl Fn(usize) -> bool,
    count: impl Fn(usize) -> f64,
    turn: u64,
) -> Option<usize> {
    let mut lo = f64::INFINITY;
    let mut k = 0u64;
    for j in (0..n).filter(|&j| tied(j)) {
        let c = count(j);
        if c < lo {
            lo = c;
            k = 1;
        } else if c == lo {
            k += 1;
        }
    }
    if k == 0 {
        return None;
    }
    let nth = (turn % k) as usize;
    (0..n).filter(|&j| tied(j) && count(j) == lo).nth(nth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewest_routed_takes_the_least_used_tied_worker_in_turn() {
        let tied = [true, true, false, true, true];
        let count = [3.0, 1.0, 0.0, 1.0, 2.0];
        let f = |turn| fewest_routed(5, |j| tied[j], |j| count[j], turn);
        // Position 2 has the lowest count but is not tied; 1 and 3 share the lowest.
        assert_eq!(f(0), Some(1));
        assert_eq!(f(1), Some(3));
        assert_eq!(f(2), Some(1));
        assert_eq!(fewest_routed(5, |_| false, |j| count[j], 0), None);
        assert_eq!(fewest_routed(0, |_| true, |_| 0.0, 7), None);
    }

    #[test]
    fn by_count_needs_enough_ties_and_a_positive_threshold() {
        assert!(!by_count(100, 0));
        assert!(!by_count(7, 8));
        assert!(by_count(8, 8));
        assert!(by_count(1, 1));
    }

    #[test]
    fn counts_fit_the_fleet_and_ignore_unknown_positions() {
        let mut r = Routed::default();
        r.fit(3);
        r.note(1);
        r.note(1);
        r.note(9);
        assert_eq!(r.counts(), &[0.0, 2.0, 0.0]);
        r.fit(3);
        assert_eq!(r.counts(), &[0.0, 2.0, 0.0], "same size keeps the counts");
        r.fit(4);
        assert_eq!(r.counts(), &[0.0; 4], "another size starts afresh");
        r.note(0);
        r.clear();
        r.fit(4);
        assert_eq!(r.counts(), &[0.0; 4]);
    }

    #[test]
    fn a_worker_back_from_an_outage_starts_level_with_its_pool() {
        use crate::types::{Role, WorkerSpec};
        let mut specs: Vec<WorkerSpec> = ["a0", "a1", "a2", "p0", "p1"]
            .iter()
            .map(|&id| WorkerSpec::new(id))
            .collect();
        specs[3].role = Role::Prefill;
        specs[4].role = Role::Prefill;
        let fleet = Fleet::new(specs.iter());
        // Position of each row (slot = row for `Fleet::new`).
        let at: Vec<usize> = (0..5).map(|s| fleet.position(s).unwrap()).collect();
        let (a0, a1, a2, p0, p1) = (at[0], at[1], at[2], at[3], at[4]);
        let live_but =
            |down: &[usize]| -> Vec<bool> { (0..5).map(|p| !down.contains(&p)).collect() };
        let mut r = Routed::default();
        r.fit(5);
        r.follow_liveness(&fleet, &live_but(&[p1]));
        assert_eq!(r.counts(), &[0.0; 5], "nothing to level at the start");
        for (p, n) in [(p0, 3), (a0, 4), (a1, 7), (a2, 9)] {
            (0..n).for_each(|_| r.note(p));
        }
        // p1 comes back (its pool's p0 stayed live with 3), a2 goes down.
        r.follow_liveness(&fleet, &live_but(&[a2]));
        assert_eq!(
            (r.counts()[p1], r.counts()[p0]),
            (3.0, 3.0),
            "p1 starts level with p0"
        );
        assert_eq!(
            (r.counts()[a0], r.counts()[a1], r.counts()[a2]),
            (4.0, 7.0, 9.0),
            "other pools untouched"
        );
        // a2 comes back ahead of the others: a count is only ever raised.
        r.follow_liveness(&fleet, &live_but(&[]));
        assert_eq!(r.counts()[a2], 9.0);
        // Unchanged liveness: nothing to do.
        r.note(a0);
        r.follow_liveness(&fleet, &live_but(&[]));
        assert_eq!((r.counts()[a0], r.counts()[p1]), (5.0, 3.0));
    }
}
