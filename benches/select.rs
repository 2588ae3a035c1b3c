//! Benchmarks of `select::decide_view`: kv mode over realistic fleets of 2 to 10,000
//! aggregated workers (random overlaps and loads), at temperature 0 (argmin) and 0.5
//! (softmax). Target: 1,024 workers well under 2 µs, 10,000 at most 20 µs.
//!
//! Outside the timed region, as the engine and the service keep them: the fleet's
//! static data (`Fleet`, rebuilt per registry change) and its `Loads` (updated per
//! load change). Two groups:
//! - `decide_kv`: per request, writing the merge result into `Hits` (every worker with
//!   a nonzero overlap, ~97% of the fleet, and every worker with active-block reuse,
//!   ~7/8, as `engine::plan::write_hits` does) and the decision;
//! - `decide_kv_prebuilt`: the decision alone, `Hits` written once outside the loop —
//!   the selection proper, comparable to a selector timed on prebuilt overlap scores.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvroute::config::{Mode, RouterConfig};
use kvroute::select::{
    decide_view, Filters, Fleet, Hits, LoadFigures, Loads, RequestShape, RrState, Scratch,
    ViewInput,
};
use kvroute::types::{Overlap, WorkerSpec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::Duration;

/// Per-worker figures for one request: overlap, load, distinct blocks, reused blocks.
type Figures = (Overlap, LoadFigures, f64, u32);

/// Specs of `n` workers, and per-request figures drawn like a busy fleet serving a
/// 32-block prompt: most workers hold a short shared prefix, a few hold much more.
fn fleet(n: usize, rng: &mut SmallRng) -> (Vec<WorkerSpec>, Vec<Figures>) {
    let specs = (0..n)
        .map(|i| WorkerSpec::new(format!("worker-{i}")))
        .collect();
    let figures = (0..n)
        .map(|_| {
            let device = if rng.random_bool(0.1) {
                rng.random_range(0..32)
            } else {
                rng.random_range(0..4)
            };
            let host = rng.random_range(0..(32 - device).min(6) + 1);
            let overlap = Overlap {
                device,
                host,
                disk: 0,
                shared: 0,
            };
            let active = rng.random_range(0..64);
            let load = LoadFigures {
                active_requests: active,
                prefill_tokens: f64::from(rng.random_range(0..4) * 4096),
                blocks_total: f64::from(active * 40),
                output_blocks: f64::from(active * 2),
            };
            (
                overlap,
                load,
                f64::from(active * 30),
                rng.random_range(0..8),
            )
        })
        .collect();
    (specs, figures)
}

fn bench_decide(c: &mut Criterion) {
    for (name, prebuilt) in [("decide_kv", false), ("decide_kv_prebuilt", true)] {
        let mut group = c.benchmark_group(name);
        group
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .sample_size(30);
        for n in [2usize, 32, 1024, 2048, 10_000] {
            bench_fleet(&mut group, n, prebuilt);
        }
        group.finish();
    }
}

fn bench_fleet(
    group: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>,
    n: usize,
    prebuilt: bool,
) {
    let filters = Filters::default();
    let mut rng = SmallRng::seed_from_u64(n as u64);
    let (specs, figures) = fleet(n, &mut rng);
    // Built once per registry change by the engine and the service...
    let fleet = Fleet::new(&specs);
    // ... and kept up to date as loads change.
    let mut loads = Loads::new(&fleet);
    for (slot, &(_, load, unique, _)) in figures.iter().enumerate() {
        loads.set_live(slot as u16, true);
        loads.set_load(slot as u16, &load, unique);
    }
    // What the index merge and the active-block count return for the request.
    let merged: Vec<(u16, Overlap)> = figures
        .iter()
        .enumerate()
        .filter(|(_, f)| f.0 != Overlap::default())
        .map(|(i, f)| (i as u16, f.0))
        .collect();
    let reuse: Vec<(u16, u32)> = figures
        .iter()
        .enumerate()
        .filter(|(_, f)| f.3 != 0)
        .map(|(i, f)| (i as u16, f.3))
        .collect();
    let write = |hits: &mut Hits| {
        hits.begin(&fleet, Overlap::default());
        for (w, o) in black_box(&merged) {
            hits.set_overlap(&fleet, *w, o);
        }
        for &(w, r) in black_box(&reuse) {
            hits.add_reuse(&fleet, w, r);
        }
    };
    let mut hits = Hits::default();
    write(&mut hits);
    let mut scratch = Scratch::default();
    for temperature in [0.0, 0.5] {
        let cfg = RouterConfig {
            router_temperature: temperature,
            ..Default::default()
        };
        let mut rr = RrState::default();
        group.bench_function(BenchmarkId::new(format!("t{temperature}"), n), |b| {
            b.iter(|| {
                if !prebuilt {
                    write(&mut hits);
                }
                let input = ViewInput {
                    cfg: &cfg,
                    mode: Mode::Kv,
                    req: RequestShape::new(4096, cfg.block_size),
                    filters: &filters,
                    fleet: &fleet,
                    loads: &loads,
                    hits: &hits,
                    prefill_failed: false,
                    explain: false,
                };
                decide_view(black_box(&input), &mut rng, &mut rr, &mut scratch)
                    .map(|d| d.decode_worker)
            })
        });
    }
}

criterion_group!(benches, bench_decide);
criterion_main!(benches);
