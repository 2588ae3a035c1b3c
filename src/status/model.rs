//! The status page's pure model: fixed-size rings, the once-a-second history sampler,
//! the per-worker sliding window of the last minute, latency quantiles from bucket
//! counts, and the
//! warnings of a fleet row. No I/O, no clocks, no atomics: every function takes the
//! time and the counter values it works on, so it is tested without a service.
//!
//! Guarantees: every structure here has a fixed capacity set at construction (the
//! history holds [`HISTORY_POINTS`] points, the window [`WINDOW_SNAPSHOTS`] snapshots of
//! at most `max_workers` counters), so memory does not grow with uptime or traffic.

use crate::engine::{CandidateOut, WorkerState};
use serde::Serialize;
use std::collections::VecDeque;

/// History points kept: 10 minutes at one point a second.
pub const HISTORY_POINTS: usize = 600;
/// Period of the history sampler and of the status cache.
pub const REFRESH_MS: u64 = 1000;
/// Period of the per-worker window snapshots.
pub const WINDOW_EVERY_MS: u64 = 2_000;
/// The per-worker window: the last minute (`routes_1m`, `share_1m`, `hit_rate_1m`).
pub const WINDOW_MS: u64 = 60_000;
/// Snapshots kept: the oldest is [`WINDOW_MS`] old when the newest is taken, so the
/// window slides over the last 60 to 62 s once the router has run a minute (and
/// covers everything since start before that).
pub const WINDOW_SNAPSHOTS: usize = (WINDOW_MS / WINDOW_EVERY_MS) as usize + 1;
/// A worker routed to in the window without a cache event for this long is flagged.
pub const SILENT_AFTER_MS: u64 = 60_000;
/// Quarter-octave latency buckets from 64 ns: bucket 127 starts above 2^37 ns (~137 s).
pub const LAT_BUCKETS: usize = 128;
/// Candidates kept per recorded decision (the chosen ones plus the cheapest others):
/// an explain record of a 1,000-worker fleet would otherwise hold 1,000 rows.
pub const MAX_CANDIDATES: usize = 16;

/// A ring that keeps the last `cap` items.
#[derive(Clone, Debug)]
pub struct Ring<T> {
    buf: VecDeque<T>,
    cap: usize,
}

impl<T> Ring<T> {
    pub fn new(cap: usize) -> Ring<T> {
        Ring {
            buf: VecDeque::with_capacity(cap),
            cap: cap.max(1),
        }
    }

    /// Appends, dropping the oldest item when full.
    pub fn push(&mut self, v: T) {
        if self.buf.len() == self.cap {
            self.buf.pop_front();
        }
        self.buf.push_back(v);
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.buf.iter()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn front(&self) -> Option<&T> {
        self.buf.front()
    }
}

/// Bucket of a latency in nanoseconds: 4 buckets per power of two from 64 ns.
pub fn lat_bucket(ns: u64) -> usize {
    let ns = ns.max(64);
    let log = 63 - ns.leading_zeros() as usize; // >= 6
    let quarter = ((ns >> (log - 2)) & 3) as usize;
    ((log - 6) * 4 + quarter).min(LAT_BUCKETS - 1)
}

/// Upper bound of bucket `i` in nanoseconds.
pub fn bucket_upper_ns(i: usize) -> f64 {
    let log = (i / 4 + 6) as i32;
    let quarter = (i % 4) as f64;
    2f64.powi(log) * (1.0 + (quarter + 1.0) / 4.0)
}

/// Quantile `q` (0..=1) in microseconds of the latencies counted in `counts` (the upper
/// bound of the bucket holding it: at most 25% above the true value). `None` if empty.
pub fn quantile_us(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return Some(bucket_upper_ns(i) / 1000.0);
        }
    }
    None
}

/// Fleet-wide counter values at one instant (all monotonic since start).
#[derive(Clone, Debug, PartialEq)]
pub struct Totals {
    pub decisions: u64,
    pub errors: u64,
    pub events: u64,
    pub request_blocks: u64,
    pub overlap_blocks: u64,
    pub latency: Vec<u64>,
}

impl Default for Totals {
    fn default() -> Self {
        Totals {
            decisions: 0,
            errors: 0,
            events: 0,
            request_blocks: 0,
            overlap_blocks: 0,
            latency: vec![0; LAT_BUCKETS],
        }
    }
}

/// One point of the fleet-wide charts: rates over the second before `t_s`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Point {
    /// Seconds since service start.
    pub t_s: f64,
    pub decisions_per_s: f64,
    /// Cached prompt blocks ÷ prompt blocks of the decisions in the interval.
    pub hit_rate: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub events_per_s: f64,
    pub errors_per_s: f64,
}

/// The charts' history: a point per [`History::sample`] call, from counter deltas.
#[derive(Clone, Debug)]
pub struct History {
    last: Option<(u64, Totals)>,
    pub points: Ring<Point>,
}

impl Default for History {
    fn default() -> Self {
        History {
            last: None,
            points: Ring::new(HISTORY_POINTS),
        }
    }
}

impl History {
    /// Adds the point for the interval since the previous sample (the first sample
    /// only sets the baseline). Counters that went backwards count as zero.
    pub fn sample(&mut self, now_ms: u64, t: Totals) {
        if let Some((then, prev)) = &self.last {
            let dt = now_ms.saturating_sub(*then).max(1) as f64 / 1000.0;
            let d = |a: u64, b: u64| a.saturating_sub(b);
            let lat: Vec<u64> = t
                .latency
                .iter()
                .zip(prev.latency.iter().chain(std::iter::repeat(&0)))
                .map(|(&a, &b)| d(a, b))
                .collect();
            let blocks = d(t.request_blocks, prev.request_blocks);
            self.points.push(Point {
                t_s: now_ms as f64 / 1000.0,
                decisions_per_s: d(t.decisions, prev.decisions) as f64 / dt,
                hit_rate: (blocks > 0)
                    .then(|| d(t.overlap_blocks, prev.overlap_blocks) as f64 / blocks as f64),
                p50_us: quantile_us(&lat, 0.5),
                p99_us: quantile_us(&lat, 0.99),
                events_per_s: d(t.events, prev.events) as f64 / dt,
                errors_per_s: d(t.errors, prev.errors) as f64 / dt,
            });
        }
        self.last = Some((now_ms, t));
    }
}

/// One worker slot's routing counters (monotonic) and the slot's generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCount {
    pub gen: u64,
    pub routes: u64,
    pub prompt_blocks: u64,
    pub cached_blocks: u64,
}

/// A worker's routing over the window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WindowFigures {
    pub routes: u64,
    /// routes ÷ fleet decisions in the window.
    pub share: Option<f64>,
    /// Cached prompt blocks ÷ prompt blocks of the decisions that prefilled here.
    pub hit_rate: Option<f64>,
}

#[derive(Clone, Debug)]
struct Snapshot {
    at_ms: u64,
    decisions: u64,
    /// Shared, so cloning the window (to read it outside its lock) copies no counters.
    slots: std::sync::Arc<Vec<SlotCount>>,
}

/// The last minute of each worker: counter snapshots every [`WINDOW_EVERY_MS`],
/// deltas taken against the oldest one, whatever happened since (traffic or none). A
/// worker the oldest snapshot does not hold with its generation registered after it
/// (a new slot, a slot reused by another worker, a new epoch): its counters started at
/// zero then, so all of them are in the window.
#[derive(Clone, Debug)]
pub struct Window {
    snaps: Ring<Snapshot>,
}

impl Default for Window {
    fn default() -> Self {
        Window {
            snaps: Ring::new(WINDOW_SNAPSHOTS),
        }
    }
}

impl Window {
    /// Whether a snapshot is due at `now_ms`.
    pub fn due(&self, now_ms: u64) -> bool {
        self.snaps
            .iter()
            .next_back()
            .is_none_or(|s| now_ms.saturating_sub(s.at_ms) >= WINDOW_EVERY_MS)
    }

    pub fn snapshot(&mut self, now_ms: u64, decisions: u64, slots: Vec<SlotCount>) {
        self.snaps.push(Snapshot {
            at_ms: now_ms,
            decisions,
            slots: std::sync::Arc::new(slots),
        });
    }

    /// Seconds the window covers at `now_ms` (0 before the first snapshot).
    pub fn span_s(&self, now_ms: u64) -> f64 {
        self.snaps
            .front()
            .map_or(0.0, |s| now_ms.saturating_sub(s.at_ms) as f64 / 1000.0)
    }

    /// Figures of `slot` whose counters are `now` while the fleet has made `decisions`.
    pub fn figures(&self, slot: usize, now: SlotCount, decisions: u64) -> WindowFigures {
        let Some(oldest) = self.snaps.front() else {
            return WindowFigures::default();
        };
        // Counters of another identity (or none) in the oldest snapshot: this one
        // registered since, from zero (`Counters::reset`).
        let c0 = oldest
            .slots
            .get(slot)
            .filter(|c| c.gen == now.gen)
            .copied()
            .unwrap_or_default();
        let routes = now.routes.saturating_sub(c0.routes);
        let fleet = decisions.saturating_sub(oldest.decisions);
        let blocks = now.prompt_blocks.saturating_sub(c0.prompt_blocks);
        WindowFigures {
            routes,
            share: (fleet > 0).then(|| routes as f64 / fleet as f64),
            hit_rate: (blocks > 0)
                .then(|| now.cached_blocks.saturating_sub(c0.cached_blocks) as f64 / blocks as f64),
        }
    }
}

/// Warnings of a fleet row, most severe first. `last_event_age_ms` is `None` when
/// the worker never sent a cache event.
pub fn warnings(
    state: WorkerState,
    routes_in_window: u64,
    last_event_age_ms: Option<u64>,
) -> Vec<&'static str> {
    let mut w = Vec::new();
    match state {
        WorkerState::Down => w.push("down: missed its heartbeat window"),
        WorkerState::Suspect => {
            w.push("suspect index: sequence gap, routed with zero overlap until resync")
        }
        WorkerState::Live => {}
    }
    if routes_in_window > 0 && last_event_age_ms.is_none_or(|a| a >= SILENT_AFTER_MS) {
        w.push("no cache events while routed to");
    }
    w
}

/// One recorded routing decision with its explain record: the `POST /v1/route` answer
/// itself (flattened into the same JSON keys, its `candidates` the kept rows) plus
/// what the page shows beside it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionRecord {
    /// Increasing number of the record (the page's key for "which one was clicked").
    pub seq: u64,
    /// Milliseconds since service start.
    pub t_ms: u64,
    pub mode: &'static str,
    pub prompt_blocks: u32,
    pub input_tokens: u32,
    /// Candidates scored in all (`decision.candidates` keeps at most
    /// [`MAX_CANDIDATES`]).
    pub candidates_total: usize,
    #[serde(flatten)]
    pub decision: crate::engine::RouteDecision,
}

/// The candidates an explain record keeps: the chosen workers' rows, then the cheapest
/// others, at most [`MAX_CANDIDATES`], ordered by stage then cost.
pub fn keep_candidates(
    mut all: Vec<CandidateOut>,
    chosen: &[&str],
    max: usize,
) -> Vec<CandidateOut> {
    all.sort_by(|a, b| {
        let ca = !chosen.contains(&a.worker.as_str());
        let cb = !chosen.contains(&b.worker.as_str());
        ca.cmp(&cb).then(a.cost.total_cmp(&b.cost))
    });
    all.truncate(max);
    all.sort_by(|a, b| a.stage.cmp(&b.stage).then(a.cost.total_cmp(&b.cost)));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_last() {
        let mut r = Ring::new(3);
        for i in 0..10 {
            r.push(i);
        }
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), vec![7, 8, 9]);
    }

    #[test]
    fn buckets_are_monotonic_and_bound_the_value() {
        let mut prev = 0;
        for ns in [64u64, 65, 100, 1000, 1500, 12_345, 1 << 20, 3 << 30] {
            let b = lat_bucket(ns);
            assert!(b >= prev);
            prev = b;
            assert!(bucket_upper_ns(b) >= ns as f64, "{ns} in {b}");
            assert!(bucket_upper_ns(b) <= ns as f64 * 1.25 + 1.0, "{ns} in {b}");
        }
        assert_eq!(lat_bucket(u64::MAX), LAT_BUCKETS - 1);
    }

    #[test]
    fn quantiles() {
        let mut c = vec![0u64; LAT_BUCKETS];
        c[lat_bucket(10_000)] = 99;
        c[lat_bucket(1_000_000)] = 1;
        assert!((quantile_us(&c, 0.5).unwrap() - 10.0).abs() < 3.0);
        assert!((quantile_us(&c, 0.99).unwrap() - 10.0).abs() < 3.0);
        assert!(quantile_us(&c, 1.0).unwrap() > 900.0);
        assert_eq!(quantile_us(&vec![0; LAT_BUCKETS], 0.5), None);
    }

    #[test]
    fn history_rates() {
        let mut h = History::default();
        h.sample(0, Totals::default());
        assert!(h.points.is_empty());
        let t = Totals {
            decisions: 20,
            request_blocks: 100,
            overlap_blocks: 25,
            events: 4,
            errors: 2,
            ..Totals::default()
        };
        h.sample(2000, t);
        let p = *h.points.iter().next().unwrap();
        assert_eq!(p.decisions_per_s, 10.0);
        assert_eq!(p.hit_rate, Some(0.25));
        assert_eq!((p.events_per_s, p.errors_per_s), (2.0, 1.0));
        assert_eq!(p.p50_us, None);
        for i in 0..2 * HISTORY_POINTS as u64 {
            h.sample(3000 + i * 1000, Totals::default());
        }
        assert_eq!(h.points.len(), HISTORY_POINTS);
    }

    #[test]
    fn window_figures_and_reuse() {
        let mut w = Window::default();
        let c = |gen, routes, p, k| SlotCount {
            gen,
            routes,
            prompt_blocks: p,
            cached_blocks: k,
        };
        w.snapshot(0, 10, vec![c(1, 5, 50, 10)]);
        let f = w.figures(0, c(1, 15, 150, 60), 30);
        assert_eq!(f.routes, 10);
        assert_eq!(f.share, Some(0.5));
        assert_eq!(f.hit_rate, Some(0.5));
        // Another identity in the slot (counters reset at registration): from zero.
        assert_eq!(w.figures(0, c(2, 4, 0, 0), 30).routes, 4);
        assert_eq!(w.figures(7, c(1, 2, 4, 1), 30).hit_rate, Some(0.25));
        assert_eq!(Window::default().figures(0, c(1, 1, 1, 1), 1).routes, 0);
        assert!(!w.due(WINDOW_EVERY_MS - 1) && w.due(WINDOW_EVERY_MS));
    }

    /// The window holds the traffic of the last minute however it was spread: a
    /// worker absent from the oldest snapshot (registered later) keeps every route it
    /// took after a pause that later snapshots were taken in, until the routes are a
    /// minute old.
    #[test]
    fn the_window_slides_over_a_minute_whatever_the_traffic() {
        let mut w = Window::default();
        let c = |routes| SlotCount {
            gen: 1,
            routes,
            prompt_blocks: 4 * routes,
            cached_blocks: routes,
        };
        w.snapshot(0, 0, vec![]); // before the worker registered
                                  // 100 routes between two snapshots, then nothing for 30 s.
        let mut t = WINDOW_EVERY_MS;
        while t <= 30_000 {
            w.snapshot(t, 100, vec![c(100)]);
            t += WINDOW_EVERY_MS;
        }
        let f = w.figures(0, c(100), 100);
        assert_eq!(
            (f.routes, f.share, f.hit_rate),
            (100, Some(1.0), Some(0.25))
        );
        assert!((w.span_s(30_000) - 30.0).abs() < 1e-9);
        // Once the routes are more than a minute old, they leave the window.
        while t <= 62_000 {
            w.snapshot(t, 100, vec![c(100)]);
            t += WINDOW_EVERY_MS;
        }
        assert_eq!(w.figures(0, c(100), 100).routes, 0);
        let span = w.span_s(t - WINDOW_EVERY_MS);
        assert!((60.0..62.0).contains(&span), "{span}");
    }

    #[test]
    fn warning_rules() {
        assert!(warnings(WorkerState::Live, 0, None).is_empty());
        assert_eq!(warnings(WorkerState::Live, 3, None).len(), 1);
        assert!(warnings(WorkerState::Live, 3, Some(1000)).is_empty());
        assert_eq!(
            warnings(WorkerState::Suspect, 3, Some(SILENT_AFTER_MS)).len(),
            2
        );
        assert!(warnings(WorkerState::Down, 0, None)[0].starts_with("down"));
    }

    #[test]
    fn candidates_keep_the_chosen() {
        let c = |w: &str, cost| CandidateOut {
            worker: w.into(),
            stage: "aggregated".into(),
            prefill_blocks: 0.0,
            overlap: crate::types::Overlap::default(),
            speculative: 0,
            adjusted_prefill: 0.0,
            decode_blocks: 0.0,
            cost,
        };
        let all: Vec<_> = (0..40).map(|i| c(&format!("w{i}"), i as f64)).collect();
        let kept = keep_candidates(all, &["w39"], 4);
        let names: Vec<_> = kept.iter().map(|c| c.worker.as_str()).collect();
        assert_eq!(names, vec!["w0", "w1", "w2", "w39"]);
    }
}
