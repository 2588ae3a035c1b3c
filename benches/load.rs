//! Throughput of the load tracker's hot path: route → first token → progress → finish
//! cycles with 1024 requests in flight over 64 workers (updates/s), under the `full`
//! and `predicted` (+ output blocks) models, plus the active-block shard's add/remove,
//! and the cost of one `request_ttl_ms` sweep (`LoadTracker::expire`) over a core's
//! requests when none is due (what each core pays every TTL/8).

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvroute::config::{PrefillLoadModel, RouterConfig};
use kvroute::load::{ActiveBlocksShard, LoadTracker, NewRequest};

const IN_FLIGHT: usize = 1024;
const WORKERS: u16 = 64;

fn requests() -> Vec<NewRequest> {
    (0..IN_FLIGHT)
        .map(|i| {
            let isl = 512 + (i as u32 * 37) % 8192;
            NewRequest {
                id: format!("req-{i:08}-{:016x}", i * 7919),
                decode_worker: (i as u16 * 13) % WORKERS,
                prefill_worker: None,
                input_tokens: isl,
                cached_tokens: (i as u32 * 11) % isl,
                prompt_blocks: isl.div_ceil(128),
                hashes: (0..u64::from(isl / 128)).map(|h| h ^ i as u64).collect(),
                expected_output_tokens: (i % 2 == 0).then_some(512),
                now_us: i as u64 * 10,
                pinned: false,
            }
        })
        .collect()
}

fn cycles(c: &mut Criterion) {
    let reqs = requests();
    let ids: Vec<String> = reqs.iter().map(|r| r.id.clone()).collect();
    let mut g = c.benchmark_group("load_tracker");
    // route + first token + progress + finish per request.
    g.throughput(Throughput::Elements(4 * IN_FLIGHT as u64));
    for (name, model, out) in [
        ("full", PrefillLoadModel::Full, false),
        ("predicted_output_blocks", PrefillLoadModel::Predicted, true),
    ] {
        let cfg = RouterConfig {
            prefill_load_model: model,
            track_output_blocks: out,
            predictor_min_samples: 16,
            ..Default::default()
        };
        let mut t = LoadTracker::new(128, &cfg);
        let mut dirty = Vec::new();
        g.bench_function(name, |b| {
            b.iter_batched(
                || reqs.clone(),
                |batch| {
                    for r in batch {
                        t.on_route(r).ok();
                    }
                    for (i, id) in ids.iter().enumerate() {
                        t.on_first_token(id, i as u64 * 10 + 5_000).ok();
                    }
                    for (i, id) in ids.iter().enumerate() {
                        t.on_progress(id, 300, i as u64 * 10 + 9_000).ok();
                    }
                    for id in &ids {
                        black_box(t.on_finish(id, 20_000).ok());
                    }
                    t.take_dirty(&mut dirty);
                    dirty.clear();
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

fn active_blocks(c: &mut Criterion) {
    let reqs = requests();
    let blocks: u64 = reqs.iter().map(|r| r.hashes.len() as u64).sum();
    let mut g = c.benchmark_group("active_blocks");
    g.throughput(Throughput::Elements(2 * blocks));
    let mut s = ActiveBlocksShard::new();
    g.bench_function("add_remove", |b| {
        b.iter(|| {
            for r in &reqs {
                s.add(r.decode_worker, &r.hashes);
            }
            for r in &reqs {
                s.remove(r.decode_worker, &r.hashes);
            }
        })
    });
    g.finish();
}

fn expiry_sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("load_tracker_expire");
    for n in [1024usize, 65_536] {
        let mut t = LoadTracker::new(128, &RouterConfig::default());
        for i in 0..n {
            let r = NewRequest {
                id: format!("req-{i:08}-{:016x}", i * 7919),
                decode_worker: (i as u16 * 13) % WORKERS,
                prefill_worker: None,
                input_tokens: 4096,
                cached_tokens: 0,
                prompt_blocks: 32,
                hashes: vec![i as u64],
                expected_output_tokens: None,
                now_us: 1_000_000 + i as u64,
                pinned: false,
            };
            t.on_route(r).ok();
        }
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("sweep_{n}_none_due"), |b| {
            b.iter(|| black_box(t.expire(2_000_000, 600_000_000)))
        });
    }
    g.finish();
}

criterion_group!(benches, cycles, active_blocks, expiry_sweep);
criterion_main!(benches);
