//! The knob search behind `kvroute-sim tune`: which `[router]` settings give the best
//! TTFT p99 / hit rate / balance trade-off on a given workload and fleet.
//!
//! Pure and sans-I/O: [`Search`] proposes batches of candidate configurations and is
//! told each one's [`Figures`]; the tool runs the candidates (offline simulations, in
//! parallel) in between. Nothing here depends on the order in which a batch's results
//! arrive, so a search is deterministic for its seed whatever the thread count.
//!
//! # The objective (lower is better)
//! Every candidate is scored against the run of the start point (the defaults, plus the
//! tool's base `--knobs`):
//!
//! ```text
//! score = ttft_p99 / ttft_p99(defaults)
//!       + hit_weight       · (hit_rate(defaults) − hit_rate) / bound
//!       + imbalance_weight · max(0, imbalance − max_imbalance)
//!       + e2e_weight       · (e2e_p99 / e2e_p99(defaults) − 1)
//! ```
//!
//! `bound` is the workload's hit-rate bound (one shared unlimited cache), so the hit
//! term is in units of "the whole achievable hit rate": with `hit_weight` 1, losing the
//! entire bound costs as much as doubling TTFT p99. Imbalance (max ÷ mean requests per
//! worker) costs nothing up to `max_imbalance` (1.25, the large-fleet goal of issue
//! 15) and linearly above it; on a fleet mixing CPU and GPU workers it is the worst
//! imbalance *within* a device class (sending a slow CPU worker fewer requests is the
//! point, not a skew). `e2e_weight` (default 0) lets E2E p99 count too. A run with
//! errors or unfinished requests scores +∞. The defaults score `1 + imbalance term`.
//!
//! # The search
//! Iterated local search on the grid given by the [`Space`], first improvement in
//! chunks: the start point, then its one-knob neighbours (all other values of one
//! dimension) in a seeded order, `batch` at a time; as soon as a chunk holds a better
//! candidate the search moves there and takes that candidate's neighbours. When a point
//! has no better neighbour (a local optimum), a seeded kick changes two random
//! dimensions of the best point found and local search resumes from there. Every
//! configuration is evaluated at most once; the search ends after `budget` evaluations
//! or when the whole grid has been seen.

use super::report::Report;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// One knob and the values the search may give it (as `--knobs` would write them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Dim {
    pub key: String,
    pub values: Vec<String>,
}

impl Dim {
    /// Parses `key=v1|v2|...` (at least one value; duplicates dropped).
    pub fn parse(s: &str) -> Result<Dim, String> {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| format!("expected key=v1|v2|..., got {s:?}"))?;
        let key = k.trim().to_string();
        let mut values: Vec<String> = Vec::new();
        for v in v.split('|').map(str::trim).filter(|v| !v.is_empty()) {
            if !values.iter().any(|x| x == v) {
                values.push(v.to_string());
            }
        }
        if key.is_empty() || values.is_empty() {
            return Err(format!("expected key=v1|v2|..., got {s:?}"));
        }
        Ok(Dim { key, values })
    }
}

/// The grid searched: one [`Dim`] per knob.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Space {
    pub dims: Vec<Dim>,
}

/// A point of a [`Space`]: one value index per dimension.
pub type Point = Vec<usize>;

fn dim(key: &str, values: &[&str]) -> Dim {
    Dim {
        key: key.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

impl Space {
    /// The knobs that matter for a fleet: cost weights and load tracking always; the
    /// CPU/GPU ratio on a mixed fleet; decode-stage reuse on a disaggregated one.
    pub fn default_for(mixed: bool, disaggregated: bool) -> Space {
        let mut dims = vec![
            dim("prefill_load_scale", &["1", "0.5", "2", "4", "8", "16"]),
            dim("track_prefill_tokens", &["true", "false"]),
            dim("overlap_score_credit", &["1", "0.5", "0.75"]),
            dim("assume_kv_reuse", &["true", "false"]),
            dim("track_output_blocks", &["false", "true"]),
            dim("prefill_load_model", &["full", "predicted"]),
        ];
        if mixed {
            dims.push(dim("cuda_to_cpu_ratio", &["8", "2", "4", "16", "32"]));
        }
        if disaggregated {
            dims.push(dim("disagg_decode_assume_kv_reuse", &["false", "true"]));
        }
        Space { dims }
    }

    /// Adds `d`, replacing a dimension of the same key.
    pub fn set(&mut self, d: Dim) {
        match self.dims.iter_mut().find(|x| x.key == d.key) {
            Some(x) => *x = d,
            None => self.dims.push(d),
        }
    }

    /// Number of grid points (saturating).
    pub fn size(&self) -> u64 {
        self.dims
            .iter()
            .fold(1u64, |n, d| n.saturating_mul(d.values.len() as u64))
    }

    /// The knob pairs of `p` (in dimension order).
    pub fn knobs(&self, p: &[usize]) -> Vec<(String, String)> {
        self.dims
            .iter()
            .zip(p)
            .map(|(d, &i)| (d.key.clone(), d.values[i].clone()))
            .collect()
    }

    /// The point holding `current`'s value in every dimension; a value missing from a
    /// dimension is inserted first. `current` maps keys to the start configuration's
    /// values as JSON (e.g. the serialised `RouterConfig`); an unknown key is an error.
    pub fn start_point(
        &mut self,
        current: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<Point, String> {
        let mut p = Vec::with_capacity(self.dims.len());
        for d in &mut self.dims {
            let cur = current
                .get(&d.key)
                .ok_or_else(|| format!("unknown router knob {:?} in the search space", d.key))?;
            let i = match d.values.iter().position(|v| same_value(&json_of(v), cur)) {
                Some(i) => i,
                None => {
                    let shown = match cur {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    d.values.insert(0, shown);
                    0
                }
            };
            p.push(i);
        }
        Ok(p)
    }
}

/// A knob value as `--knobs` parses it: JSON if it parses, else a string.
fn json_of(v: &str) -> serde_json::Value {
    serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.to_string()))
}

/// Equal JSON values, numbers compared as f64 (so `8` equals `8.0`).
fn same_value(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// What the objective needs from one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Figures {
    pub ttft_p99_us: f64,
    pub e2e_p99_us: f64,
    pub hit_rate: f64,
    pub imbalance: f64,
    /// Errors or unfinished requests: such a run is never recommended.
    pub failed: bool,
}

impl Figures {
    pub fn of(r: &Report) -> Figures {
        // Mixed fleets: balance within each device class (see the module docs).
        let imbalance = if r.imbalance_by_device.is_empty() {
            r.imbalance
        } else {
            r.imbalance_by_device
                .iter()
                .map(|d| d.imbalance)
                .fold(0.0, f64::max)
        };
        Figures {
            ttft_p99_us: r.ttft_us.p99,
            e2e_p99_us: r.e2e_us.p99,
            hit_rate: r.hit_rate,
            imbalance,
            failed: r.errors > 0 || r.finished < r.requests,
        }
    }
}

/// Weights of the objective (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Objective {
    pub hit_weight: f64,
    pub imbalance_weight: f64,
    pub max_imbalance: f64,
    pub e2e_weight: f64,
    /// The workload's hit-rate bound (fraction); ≤ 0 counts as 1.
    pub bound: f64,
}

impl Default for Objective {
    fn default() -> Self {
        Objective {
            hit_weight: 1.0,
            imbalance_weight: 1.0,
            max_imbalance: 1.25,
            e2e_weight: 0.0,
            bound: 1.0,
        }
    }
}

impl Objective {
    pub fn validate(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if ![
            self.hit_weight,
            self.imbalance_weight,
            self.max_imbalance,
            self.e2e_weight,
        ]
        .into_iter()
        .all(ok)
        {
            return Err("objective weights and max imbalance must be finite and >= 0".into());
        }
        Ok(())
    }

    /// Score of `f` against the start point's figures `base` (lower is better).
    pub fn score(&self, f: &Figures, base: &Figures) -> f64 {
        if f.failed || !f.ttft_p99_us.is_finite() {
            return f64::INFINITY;
        }
        let ttft = if base.ttft_p99_us > 0.0 {
            f.ttft_p99_us / base.ttft_p99_us
        } else if f.ttft_p99_us > 0.0 {
            f.ttft_p99_us
        } else {
            1.0
        };
        let bound = if self.bound > 0.0 { self.bound } else { 1.0 };
        let e2e = if self.e2e_weight > 0.0 && base.e2e_p99_us > 0.0 {
            self.e2e_weight * (f.e2e_p99_us / base.e2e_p99_us - 1.0)
        } else {
            0.0
        };
        ttft + self.hit_weight * (base.hit_rate - f.hit_rate) / bound
            + self.imbalance_weight * (f.imbalance - self.max_imbalance).max(0.0)
            + e2e
    }
}

/// The search state (see the module docs).
#[derive(Debug)]
pub struct Search {
    space: Space,
    objective: Objective,
    budget: usize,
    rng: SmallRng,
    start: Point,
    results: HashMap<Point, Figures>,
    /// Evaluation order, for reports.
    order: Vec<Point>,
    /// Proposed but not yet recorded.
    pending: HashSet<Point>,
    /// The point local search is around, and its not yet proposed neighbours.
    current: Point,
    neighbours: Vec<Point>,
    /// The previous batch (its best result may move `current`).
    last_batch: Vec<Point>,
    /// Kicks tried in a row without finding an unseen point.
    stale_kicks: usize,
}

impl Search {
    /// A search of `space` from `start` (from [`Space::start_point`]), at most `budget`
    /// evaluations, seeded by `seed`.
    pub fn new(
        space: Space,
        start: Point,
        objective: Objective,
        budget: usize,
        seed: u64,
    ) -> Result<Search, String> {
        if budget == 0 {
            return Err("the budget must be at least 1 configuration".into());
        }
        if start.len() != space.dims.len()
            || start
                .iter()
                .zip(&space.dims)
                .any(|(&i, d)| i >= d.values.len())
        {
            return Err("start point outside the space".into());
        }
        objective.validate()?;
        Ok(Search {
            space,
            objective,
            budget,
            rng: SmallRng::seed_from_u64(seed ^ 0x7475_6e65),
            current: start.clone(),
            start,
            results: HashMap::new(),
            order: Vec::new(),
            pending: HashSet::new(),
            neighbours: Vec::new(),
            last_batch: Vec::new(),
            stale_kicks: 0,
        })
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    /// The start point (the defaults).
    pub fn start(&self) -> &Point {
        &self.start
    }

    /// Evaluations proposed so far.
    pub fn used(&self) -> usize {
        self.results.len() + self.pending.len()
    }

    /// Score of an evaluated point (None before the start point is in).
    pub fn score_of(&self, p: &Point) -> Option<f64> {
        let base = self.results.get(&self.start)?;
        Some(self.objective.score(self.results.get(p)?, base))
    }

    /// Score of arbitrary figures against the start point.
    pub fn score_figures(&self, f: &Figures) -> Option<f64> {
        Some(self.objective.score(f, self.results.get(&self.start)?))
    }

    /// The best point evaluated (the earliest on ties) and its score.
    pub fn best(&self) -> Option<(Point, f64)> {
        let mut best: Option<(Point, f64)> = None;
        for p in &self.order {
            let s = self.score_of(p)?;
            if best.as_ref().is_none_or(|(_, b)| s < *b) {
                best = Some((p.clone(), s));
            }
        }
        best
    }

    /// Every evaluated point with its score, in evaluation order.
    pub fn history(&self) -> Vec<(Point, f64)> {
        self.order
            .iter()
            .filter_map(|p| Some((p.clone(), self.score_of(p)?)))
            .collect()
    }

    /// Records a proposed point's figures.
    pub fn record(&mut self, p: &Point, f: Figures) {
        if self.pending.remove(p) {
            self.results.insert(p.clone(), f);
            self.order.push(p.clone());
        }
    }

    fn neighbours_of(&mut self, p: &Point) -> Vec<Point> {
        let mut out = Vec::new();
        for (d, dim) in self.space.dims.iter().enumerate() {
            for v in 0..dim.values.len() {
                if v != p[d] {
                    let mut q = p.clone();
                    q[d] = v;
                    out.push(q);
                }
            }
        }
        out.shuffle(&mut self.rng);
        out
    }

    fn seen(&self, p: &Point) -> bool {
        self.results.contains_key(p) || self.pending.contains(p)
    }

    /// A random unseen point two dimensions away from `from` (None after some tries).
    fn kick(&mut self, from: &Point) -> Option<Point> {
        let varying: Vec<usize> = (0..self.space.dims.len())
            .filter(|&d| self.space.dims[d].values.len() > 1)
            .collect();
        if varying.is_empty() {
            return None;
        }
        for _ in 0..64 {
            let mut q = from.clone();
            for _ in 0..2.min(varying.len()) {
                let d = varying[self.rng.random_range(0..varying.len())];
                let n = self.space.dims[d].values.len();
                q[d] = (q[d] + self.rng.random_range(1..n)) % n;
            }
            if !self.seen(&q) {
                return Some(q);
            }
        }
        None
    }

    /// Up to `n` points to evaluate next; empty when the search is over. Call again only
    /// after every point of the previous batch was [`Search::record`]ed.
    pub fn next_batch(&mut self, n: usize) -> Vec<Point> {
        let n = n.max(1);
        let mut batch = Vec::new();
        if self.results.is_empty() && self.pending.is_empty() {
            let s = self.start.clone();
            self.neighbours = self.neighbours_of(&s);
            batch.push(s);
        } else {
            // First improvement: move to the previous batch's best point if it beats
            // the current one (the earliest proposed on ties).
            let mut cur = self.score_of(&self.current).unwrap_or(f64::INFINITY);
            let mut moved = None;
            for p in std::mem::take(&mut self.last_batch) {
                if let Some(s) = self.score_of(&p) {
                    if s < cur {
                        cur = s;
                        moved = Some(p);
                    }
                }
            }
            if let Some(p) = moved {
                self.neighbours = self.neighbours_of(&p);
                self.current = p;
            }
        }
        while batch.len() < n && self.used() + batch.len() < self.budget {
            if let Some(q) = self.neighbours.pop() {
                if !self.seen(&q) && !batch.contains(&q) {
                    batch.push(q);
                }
                continue;
            }
            if !batch.is_empty() {
                break; // finish this neighbourhood's chunk before kicking
            }
            // Local optimum: kick from the best point and search around the kick.
            let from = self.best().map(|(p, _)| p).unwrap_or(self.start.clone());
            match self.kick(&from) {
                Some(q) => {
                    self.stale_kicks = 0;
                    self.current = q.clone();
                    self.neighbours = self.neighbours_of(&q);
                    batch.push(q);
                }
                None => {
                    self.stale_kicks += 1;
                    if self.stale_kicks > 4 || self.results.len() as u64 >= self.space.size() {
                        break;
                    }
                }
            }
        }
        for p in &batch {
            self.pending.insert(p.clone());
        }
        self.last_batch = batch.clone();
        batch
    }
}

#[cfg(test)]
mod tests;
