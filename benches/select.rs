//! Benchmarks of `select::decide`: kv mode over realistic fleets of 2 to 10,000
//! aggregated workers (random overlaps and loads), at temperature 0 (argmin) and 0.5
//! (softmax), with the fleet's static filter data prebuilt as the engine caches it. Target: 1,024 workers well under 2 µs, 10,000 at most 20 µs.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kvroute::config::{Mode, RouterConfig};
use kvroute::select::{
    decide, Filters, Fleet, LoadFigures, RequestShape, RouteInput, RrState, WorkerRow,
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
    let mut group = c.benchmark_group("decide_kv");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    let filters = Filters::default();
    for n in [2usize, 32, 1024, 2048, 10_000] {
        let mut rng = SmallRng::seed_from_u64(n as u64);
        let (specs, figures) = fleet(n, &mut rng);
        let rows: Vec<WorkerRow> = specs
            .iter()
            .zip(&figures)
            .enumerate()
            .map(|(i, (spec, &(overlap, load, unique, reuse)))| WorkerRow {
                slot: i as u16,
                spec,
                live: true,
                suspect: false,
                overlap,
                reuse_blocks: reuse,
                load,
                blocks_unique: unique,
            })
            .collect();
        // Built once per registry change by the engine and the service.
        let fleet = Fleet::new(&specs);
        for temperature in [0.0, 0.5] {
            let cfg = RouterConfig {
                router_temperature: temperature,
                ..Default::default()
            };
            let input = RouteInput {
                cfg: &cfg,
                mode: Mode::Kv,
                req: RequestShape::new(4096, cfg.block_size),
                filters: &filters,
                workers: &rows,
                fleet: Some(&fleet),
                prefill_failed: false,
                explain: false,
            };
            let mut rr = RrState::default();
            group.bench_with_input(
                BenchmarkId::new(format!("t{temperature}"), n),
                &input,
                |b, input| {
                    b.iter(|| decide(black_box(input), &mut rng, &mut rr).map(|d| d.decode_worker))
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench_decide);
criterion_main!(benches);
