//! Selection side by side: kvroute's `select::decide_view` against
//! Dynamo's `DefaultWorkerSelector::select_worker`, fleets of 2 to 10,000 workers, the
//! same per-worker overlaps and loads, temperature 0 on both.
//!
//! The two cost functions are the same formula once the inputs are mapped (kvroute:
//! `src/select/cost.rs`; Dynamo 1.6.1: `scheduling/selector/reference.rs`,
//! `worker_logit`, worker type `prefill`, prefill tokens tracked):
//!
//! ```text
//! cost = prefill_load_scale * max((active_prefill_tokens + isl) / block_size
//!                                  - device - 0.75 * host, 0)
//!        + decode_blocks
//! kvroute: decode_blocks = blocks_unique + prompt_blocks - min(reuse, prompt_blocks)
//! Dynamo:  decode_blocks = active_decode_blocks + additional_active_blocks
//! ```
//!
//! so Dynamo gets `active_decode_blocks = blocks_unique` and `additional_active_blocks
//! = prompt_blocks - min(reuse, prompt_blocks)`, its tier maps hold the device and host
//! overlaps (`host_cache_hit_weight` 0.75 on both), `effective_cached_tokens` the
//! device overlap in tokens. kvroute runs with `balance_slack = 0` (exact ties broken
//! at random, as Dynamo's argmin does; its default 0.03 near-tie rule is a different
//! policy). [`check`] verifies that each side's pick has the minimum of an independent
//! evaluation of that formula.
//!
//! Timed (`--sel-draws` requests in turn, default 1: inputs cache-warm, as in both
//! projects' own criterion benches; 4 make the working set 4x): the decision alone, inputs prebuilt (kvroute's `Fleet`/`Loads`/`Hits` as the
//! service keeps them, Dynamo's `SchedulingRequest` maps as its scheduler hands them to
//! the selector); and kvroute with its per-request `Hits` write included. Below 1,024
//! workers one sample is the mean of a batch of decisions (`batch`), so the clock
//! (~20–40 ns per reading here) does not dominate; the batch size is printed.

use dynamo_kv_router::protocols::{RoutingConstraints, WorkerWithDpRank};
use dynamo_kv_router::scheduling::{OverlapSignals, ScheduleMode};
use dynamo_kv_router::test_utils::SimpleWorkerConfig;
use dynamo_kv_router::{
    DefaultWorkerSelector, KvRouterConfig, SchedulingRequest, WorkerLoadProjection,
    WorkerSelectionInput, WorkerSelector,
};
use kvroute::config::{Mode, RouterConfig};
use kvroute::select::{
    decide_view, Filters, Fleet, Hits, LoadFigures, Loads, RequestShape, RrState, Scratch,
    ViewInput,
};
use kvroute::types::{Overlap, WorkerSpec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

/// Tokens per block and prompt tokens, on both sides (kvroute's `benches/select.rs`).
pub const BLOCK: u32 = 128;
pub const ISL: u32 = 4096;

/// One worker's figures for one request.
#[derive(Clone, Copy)]
pub struct Fig {
    pub device: u32,
    pub host: u32,
    pub active: u32,
    pub prefill_tokens: u32,
    pub unique: u32,
    pub reuse: u32,
}

/// Per-worker figures drawn like kvroute's `benches/select.rs`: a busy fleet serving a
/// 32-block prompt, most workers holding a short shared prefix, a few much more.
pub fn draw(n: usize, seed: u64) -> Vec<Fig> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let device = if rng.random_bool(0.1) {
                rng.random_range(0..32)
            } else {
                rng.random_range(0..4)
            };
            let host = rng.random_range(0..(32 - device).min(6) + 1);
            let active = rng.random_range(0..64);
            Fig {
                device,
                host,
                active,
                prefill_tokens: rng.random_range(0..4) * 4096,
                unique: active * 30,
                reuse: rng.random_range(0..8),
            }
        })
        .collect()
}

/// The formula both selectors compute (module docs), evaluated independently.
pub fn reference_cost(f: &Fig) -> f64 {
    let prompt_blocks = ISL.div_ceil(BLOCK);
    let prefill = f64::from(f.prefill_tokens + ISL) / f64::from(BLOCK);
    let adjusted = (prefill - f64::from(f.device) - 0.75 * f64::from(f.host)).max(0.0);
    adjusted + f64::from(f.unique) + f64::from(prompt_blocks - f.reuse.min(prompt_blocks))
}

fn kv_cfg() -> RouterConfig {
    RouterConfig {
        block_size: BLOCK,
        router_temperature: 0.0,
        balance_slack: 0.0,
        ..Default::default()
    }
}

/// kvroute's inputs for one draw, as the service keeps them.
pub struct KvSide {
    fleet: Fleet,
    loads: Loads,
    hits: Hits,
    filters: Filters,
    merged: Vec<(u16, Overlap)>,
    reuse: Vec<(u16, u32)>,
}

impl KvSide {
    pub fn new(figs: &[Fig]) -> KvSide {
        let specs: Vec<WorkerSpec> = (0..figs.len())
            .map(|i| WorkerSpec::new(format!("worker-{i}")))
            .collect();
        let fleet = Fleet::new(&specs);
        let mut loads = Loads::new(&fleet);
        for (slot, f) in figs.iter().enumerate() {
            loads.set_live(slot as u16, true);
            let load = LoadFigures {
                active_requests: f.active,
                prefill_tokens: f64::from(f.prefill_tokens),
                blocks_total: f64::from(f.active * 40),
                output_blocks: f64::from(f.active * 2),
            };
            loads.set_load(slot as u16, &load, f64::from(f.unique));
        }
        let merged = figs
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let o = Overlap {
                    device: f.device,
                    host: f.host,
                    disk: 0,
                    shared: 0,
                };
                (i as u16, o)
            })
            .filter(|(_, o)| *o != Overlap::default())
            .collect();
        let reuse = figs
            .iter()
            .enumerate()
            .filter(|(_, f)| f.reuse != 0)
            .map(|(i, f)| (i as u16, f.reuse))
            .collect();
        let mut s = KvSide {
            fleet,
            loads,
            hits: Hits::default(),
            filters: Filters::default(),
            merged,
            reuse,
        };
        s.write_hits();
        s
    }

    /// The per-request part: the merge result and active-block reuse written into `Hits`.
    pub fn write_hits(&mut self) {
        let KvSide {
            fleet,
            hits,
            merged,
            reuse,
            ..
        } = self;
        hits.begin(fleet, Overlap::default());
        for (w, o) in black_box(&*merged) {
            hits.set_overlap(fleet, *w, o);
        }
        for &(w, r) in black_box(&*reuse) {
            hits.add_reuse(fleet, w, r);
        }
    }

    /// The decision: the chosen worker's position (= slot here).
    pub fn decide(
        &self,
        cfg: &RouterConfig,
        rng: &mut SmallRng,
        rr: &mut RrState,
        scratch: &mut Scratch,
    ) -> Option<usize> {
        self.decide_cost(cfg, rng, rr, scratch).map(|d| d.0)
    }

    /// The decision and the cost kvroute reports for the chosen worker.
    pub fn decide_cost(
        &self,
        cfg: &RouterConfig,
        rng: &mut SmallRng,
        rr: &mut RrState,
        scratch: &mut Scratch,
    ) -> Option<(usize, f64)> {
        let input = ViewInput {
            cfg,
            mode: Mode::Kv,
            req: RequestShape::new(ISL, cfg.block_size),
            filters: &self.filters,
            fleet: &self.fleet,
            loads: &self.loads,
            hits: &self.hits,
            prefill_failed: false,
            explain: false,
        };
        decide_view(black_box(&input), rng, rr, scratch)
            .ok()
            .map(|d| (usize::from(d.decode_worker), d.cost))
    }
}

/// Dynamo's inputs for one draw: its worker map and the request with its overlap and
/// load maps (what its scheduler hands to the selector).
pub struct DySide {
    workers: HashMap<u64, SimpleWorkerConfig>,
    request: SchedulingRequest,
}

impl DySide {
    pub fn new(figs: &[Fig]) -> DySide {
        let prompt_blocks = ISL.div_ceil(BLOCK) as usize;
        let mut workers = HashMap::with_capacity(figs.len());
        let mut overlap = OverlapSignals::default();
        let mut loads = rustc_hash::FxHashMap::default();
        for (i, f) in figs.iter().enumerate() {
            let id = i as u64;
            let w = WorkerWithDpRank::from_worker_id(id);
            workers.insert(id, SimpleWorkerConfig::default());
            let o = &mut overlap;
            if f.device > 0 {
                o.tier_overlap_blocks.device.insert(w, f.device as usize);
            }
            if f.host > 0 {
                o.tier_overlap_blocks.host_pinned.insert(w, f.host as usize);
            }
            if f.device + f.host > 0 {
                o.effective_overlap_blocks
                    .insert(w, f64::from(f.device + f.host));
                o.effective_cached_tokens
                    .insert(w, (f.device * BLOCK) as usize);
            }
            loads.insert(
                w,
                WorkerLoadProjection {
                    active_prefill_tokens: f.prefill_tokens as usize,
                    active_decode_blocks: f.unique as usize,
                    active_requests: f.active as usize,
                    additional_active_blocks: prompt_blocks - (f.reuse as usize).min(prompt_blocks),
                },
            );
        }
        let request = SchedulingRequest {
            mode: ScheduleMode::QueryOnly { request_id: None },
            token_seq: None,
            isl_tokens: ISL as usize,
            lora_name: None,
            expected_output_tokens: None,
            affinity_target: None,
            pinned_worker: None,
            allowed_worker_ids: None,
            routing_constraints: RoutingConstraints::default(),
            router_config_override: None,
            track_prefill_tokens: true,
            priority_jump: 0.0,
            strict_priority: 0,
            policy_class: None,
            session_context: None,
            overlap,
            kv_transfer_candidates: None,
            retain_kv_transfer_chain: false,
            shared_cache_hits: None,
            worker_loads: loads,
            resp_tx: None,
        };
        DySide { workers, request }
    }

    /// The decision: the chosen worker's id (= position here).
    pub fn decide(&self, sel: &DefaultWorkerSelector) -> Option<usize> {
        sel.select_worker(WorkerSelectionInput::configured(
            black_box(&self.workers),
            black_box(&self.request),
            self.request.eligibility(),
            black_box(BLOCK),
        ))
        .ok()
        .map(|r| r.worker.worker_id as usize)
    }
}

pub fn dy_selector() -> DefaultWorkerSelector {
    DefaultWorkerSelector::new(
        Some(KvRouterConfig {
            router_temperature: 0.0,
            ..Default::default()
        }),
        "prefill",
    )
}

/// Whether `pick` has the minimum reference cost of `figs` (relative tolerance 1e-9:
/// the two sides round differently, kvroute multiplies by 1/block_size).
pub fn is_min(figs: &[Fig], pick: Option<usize>) -> bool {
    let Some(p) = pick.filter(|&p| p < figs.len()) else {
        return false;
    };
    let min = figs
        .iter()
        .map(reference_cost)
        .fold(f64::INFINITY, f64::min);
    reference_cost(&figs[p]) <= min + 1e-9 * min.abs().max(1.0)
}

/// Decisions per sample at `n` workers (module docs).
pub fn batch(n: usize) -> usize {
    1024usize.div_ceil(n).max(1)
}

/// One fleet size's inputs: `draws` different requests (figures), both sides built.
pub struct Case {
    pub n: usize,
    pub figs: Vec<Vec<Fig>>,
    pub kv: Vec<KvSide>,
    pub dy: Vec<DySide>,
}

impl Case {
    pub fn new(n: usize, draws: usize) -> Case {
        let figs: Vec<Vec<Fig>> = (0..draws.max(1))
            .map(|d| draw(n, (n as u64) << 8 | d as u64))
            .collect();
        let kv = figs.iter().map(|f| KvSide::new(f)).collect();
        let dy = figs.iter().map(|f| DySide::new(f)).collect();
        Case { n, figs, kv, dy }
    }

    /// How many of `trials` decisions per draw picked a minimum-cost worker, per side
    /// (kvroute, Dynamo), and the total.
    pub fn check(&self, trials: usize) -> (usize, usize, usize) {
        let cfg = kv_cfg();
        let sel = dy_selector();
        let mut rng = SmallRng::seed_from_u64(7);
        let mut rr = RrState::default();
        let mut scratch = Scratch::default();
        let (mut k, mut d, mut total) = (0, 0, 0);
        for (i, figs) in self.figs.iter().enumerate() {
            for _ in 0..trials {
                total += 1;
                k += usize::from(is_min(
                    figs,
                    self.kv[i].decide(&cfg, &mut rng, &mut rr, &mut scratch),
                ));
                d += usize::from(is_min(figs, self.dy[i].decide(&sel)));
            }
        }
        (k, d, total)
    }

    /// Nanoseconds per decision of `samples` samples (each the mean of a batch), for
    /// `who`: 0 = kvroute prebuilt, 1 = kvroute with the hits write, 2 = Dynamo;
    /// samples during which the thread waited on a run queue are split out
    /// (`cpu::Watch`, as in the mixed runs).
    pub fn time(&mut self, who: u8, samples: usize, draws: usize) -> crate::cpu::Lat {
        let watch = crate::cpu::Watch::new(&[crate::cpu::tid()]);
        let cfg = kv_cfg();
        let sel = dy_selector();
        let mut rng = SmallRng::seed_from_u64(self.n as u64);
        let mut rr = RrState::default();
        let mut scratch = Scratch::default();
        let b = batch(self.n);
        let draws = draws.clamp(1, self.figs.len());
        let mut out = crate::cpu::Lat::default();
        // Warm-up: grow kvroute's scratch, touch every input once.
        for i in 0..draws {
            black_box(self.kv[i].decide(&cfg, &mut rng, &mut rr, &mut scratch));
            black_box(self.dy[i].decide(&sel));
        }
        for s in 0..samples {
            let i = s % draws;
            let before = watch.as_ref().map(|w| w.wait_ns());
            let t = Instant::now();
            for _ in 0..b {
                let p = match who {
                    0 => self.kv[i].decide(&cfg, &mut rng, &mut rr, &mut scratch),
                    1 => {
                        self.kv[i].write_hits();
                        self.kv[i].decide(&cfg, &mut rng, &mut rr, &mut scratch)
                    }
                    _ => self.dy[i].decide(&sel),
                };
                black_box(p);
            }
            let ns = (t.elapsed().as_nanos() as u64) / b as u64;
            out.push(ns, watch.as_ref().map(|w| w.wait_ns()) != before);
        }
        out
    }
}

/// Runs and prints the section: for each fleet size, the answer check, then `a.runs`
/// timed runs alternating kvroute-first / Dynamo-first, medians of p50 and p99.
pub fn section(a: &crate::Args) {
    const WHO: [(u8, &str); 3] = [
        (0, "kvroute decide_view"),
        (1, "kvroute hits + decide_view"),
        (2, "Dynamo DefaultWorkerSelector"),
    ];
    let mut f = crate::Figures::default();
    let mut cases: Vec<Case> = a.sel_workers.iter().map(|&n| Case::new(n, 4)).collect();
    let checks: Vec<(usize, usize, usize)> = cases.iter().map(|c| c.check(25)).collect();
    for run in 0..a.runs {
        for c in cases.iter_mut() {
            let mut order = WHO.to_vec();
            if run % 2 == 1 {
                order.rotate_right(1);
            }
            for (who, name) in order {
                let mut lat = c.time(who, a.sel_samples, a.sel_draws);
                let k = format!("{}|{name}", c.n);
                f.push(format!("{k}|p50"), crate::pct(&mut lat.clean, 0.5));
                f.push(format!("{k}|p99"), crate::pct(&mut lat.clean, 0.99));
                f.push(format!("{k}|a99"), crate::pct(&mut lat.all, 0.99));
                let dist = lat.all.len() - lat.clean.len();
                f.push(
                    format!("{k}|dist"),
                    100.0 * dist as f64 / lat.all.len().max(1) as f64,
                );
            }
        }
    }
    println!(
        "\n## Selection, temperature 0, same overlaps and loads ({} samples per run over {} request(s) per fleet; 4 checked), ns per decision, medians of {} runs",
        a.sel_samples, a.sel_draws, a.runs
    );
    println!(
        "  {:>7} {:>6} {:>17} {:>17} {:>19} {:>9} {:>9} {:>13} {:>17} {:>13}",
        "workers",
        "batch",
        "kvroute p50/p99",
        "kv+hits p50/p99",
        "Dynamo p50/p99",
        "ratio p50",
        "ratio p99",
        "min-cost picks",
        "all: p99 kv / Dy",
        "disturb kv/Dy"
    );
    for (c, (k, d, total)) in cases.iter().zip(&checks) {
        let med = |name: &str, p: &str| f.median(&format!("{}|{name}|{p}", c.n));
        let pair = |name: &str| format!("{:.0} / {:.0}", med(name, "p50"), med(name, "p99"));
        println!(
            "  {:>7} {:>6} {:>17} {:>17} {:>19} {:>9.3} {:>9.3} {:>13} {:>17} {:>13}",
            c.n,
            batch(c.n),
            pair(WHO[0].1),
            pair(WHO[1].1),
            pair(WHO[2].1),
            med(WHO[0].1, "p50") / med(WHO[2].1, "p50"),
            med(WHO[0].1, "p99") / med(WHO[2].1, "p99"),
            format!("{k} & {d} / {total}"),
            format!("{:.0} / {:.0}", med(WHO[0].1, "a99"), med(WHO[2].1, "a99")),
            format!(
                "{:.1}% / {:.1}%",
                med(WHO[0].1, "dist"),
                med(WHO[2].1, "dist")
            )
        );
    }
    println!(
        "  (p50/p99: samples the OS did not preempt (schedstat); all: every sample; ratio: kvroute decide_view / Dynamo; \
         min-cost picks: kvroute & Dynamo picks at the minimum of the shared formula)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mapping is right on kvroute's side: the cost it reports for its pick is the
    /// shared formula's; and both sides pick a minimum-cost worker on every draw.
    #[test]
    fn both_pick_the_minimum_of_the_same_cost() {
        let cfg = kv_cfg();
        let sel = dy_selector();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut rr = RrState::default();
        let mut scratch = Scratch::default();
        for n in [2usize, 3, 32, 1000] {
            let c = Case::new(n, 3);
            for (i, figs) in c.figs.iter().enumerate() {
                let (p, cost) = c.kv[i]
                    .decide_cost(&cfg, &mut rng, &mut rr, &mut scratch)
                    .expect("kvroute decides");
                let want = reference_cost(&figs[p]);
                assert!(
                    (cost - want).abs() <= 1e-9 * want.max(1.0),
                    "{n}: {cost} vs {want}"
                );
                assert!(is_min(figs, Some(p)), "kvroute, {n} workers");
                assert!(is_min(figs, c.dy[i].decide(&sel)), "Dynamo, {n} workers");
            }
            let (k, d, total) = c.check(5);
            assert_eq!((k, d), (total, total));
        }
    }

    /// A pick that is not at the minimum is caught (the check can fail).
    #[test]
    fn is_min_rejects_a_costlier_worker() {
        let figs = draw(64, 3);
        let costs: Vec<f64> = figs.iter().map(reference_cost).collect();
        let min = costs.iter().cloned().fold(f64::INFINITY, f64::min);
        let worst = costs.iter().position(|&c| c > min).expect("not all tied");
        assert!(!is_min(&figs, Some(worst)));
        assert!(!is_min(&figs, None));
    }
}
