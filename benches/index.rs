//! Benchmarks of the block index: event ingest, query + merge, and memory per entry.
//!
//! - `ingest/{1,2}_shards`: steady-state stored/removed events (64-block batches, 16
//!   workers, ~64K live entries), shards run sequentially in process; throughput is in
//!   block events.
//! - `ingest_live/{65536,800000,3200000}`: the same churn on one shard with that many
//!   live entries (past the caches every event costs DRAM misses).
//! - `ingest_live_threads/{1,2}`: 800k live entries per shard, one thread per shard.
//! - `ingest_threads/shards/{1,2}`: one thread per shard, each applying its
//!   pre-partitioned share of a Mooncake-derived store/remove stream (as the service
//!   does); throughput is in block events of the whole stream.
//! - `query/{64,512}_blocks/{16,1024}_workers`: scatter + per-shard query + merge over
//!   2 shards holding ~1M entries (workers cache random prefixes of 2048 documents of
//!   512 blocks sharing an 8-block system prompt, some continuations on host).
//! - `memory`: builds 10M-entry indexes once (1, 2 and 4 holders per block) and prints
//!   heap bytes per entry; nothing is timed.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvroute::index::{IndexShard, MergeResult, ShardedIndex};
use kvroute::types::Tier;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[path = "workloads/index.rs"]
mod workload;
use workload::{build_fleet, doc_hash, mooncake_stream, partition, Event};

const BATCH: u64 = 64;

/// Batch `k` of the ingest stream: 64 distinct hashes.
fn fill(k: u64, batch: &mut [u64; BATCH as usize]) {
    for (j, h) in batch.iter_mut().enumerate() {
        *h = k * BATCH + j as u64;
    }
}

/// What the churn benches drive: one shard, or a sharded index in one thread.
trait Churn {
    fn store(&mut self, w: u16, hashes: &[u64]) -> u32;
    fn remove(&mut self, w: u16, hashes: &[u64]) -> u32;
}

impl Churn for IndexShard {
    fn store(&mut self, w: u16, hashes: &[u64]) -> u32 {
        self.stored(w, Tier::Device, hashes).added
    }
    fn remove(&mut self, w: u16, hashes: &[u64]) -> u32 {
        self.removed(w, Tier::Device, hashes)
    }
}

impl Churn for ShardedIndex {
    fn store(&mut self, w: u16, hashes: &[u64]) -> u32 {
        self.stored(w, Tier::Device, hashes).added
    }
    fn remove(&mut self, w: u16, hashes: &[u64]) -> u32 {
        self.removed(w, Tier::Device, hashes)
    }
}

/// A store/remove churn keeping `window` batches alive, like a worker's cache: step
/// `i` stores batch `base + i` (of worker `i % 16`) and removes batch `base + i -
/// window`.
struct Churner {
    window: u64,
    base: u64,
    i: u64,
    batch: [u64; BATCH as usize],
}

impl Churner {
    /// Stores the first `window` batches into `idx`.
    fn prefilled(idx: &mut impl Churn, window: u64, base: u64) -> Churner {
        let mut c = Churner {
            window,
            base,
            i: 0,
            batch: [0; BATCH as usize],
        };
        for k in 0..window {
            fill(base + k, &mut c.batch);
            idx.store((k % 16) as u16, &c.batch);
        }
        c.i = window;
        c
    }

    /// One store and one remove (2 × 64 block events).
    #[inline]
    fn step(&mut self, idx: &mut impl Churn) -> (u32, u32) {
        let i = self.i;
        fill(self.base + i, &mut self.batch);
        let a = idx.store((i % 16) as u16, &self.batch);
        let old = i - self.window;
        fill(self.base + old, &mut self.batch);
        let r = idx.remove((old % 16) as u16, &self.batch);
        self.i += 1;
        (a, r)
    }
}

fn ingest(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(2 * BATCH));
    for bits in [0u32, 1] {
        let mut idx = ShardedIndex::new(bits);
        let mut churn = Churner::prefilled(&mut idx, 1024, 0);
        g.bench_function(BenchmarkId::new("shards", 1u32 << bits), |b| {
            b.iter(|| black_box(churn.step(&mut idx)))
        });
    }
    g.finish();
}

/// `ingest_live/{entries}`: one shard, the `ingest` churn (store a 64-block batch,
/// remove the oldest) with 65k, 800k (the service bench's share per shard with 8
/// workers) and 3.2M entries alive: past the caches, each event costs DRAM misses.
fn ingest_live(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest_live");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements(2 * BATCH));
    for window in [1024u64, 12_500, 50_000] {
        let mut idx = IndexShard::new();
        let mut churn = Churner::prefilled(&mut idx, window, 0);
        g.bench_function(BenchmarkId::from_parameter(window * BATCH), |b| {
            b.iter(|| black_box(churn.step(&mut idx)))
        });
    }
    g.finish();
}

/// `ingest_live_threads/{1,2}`: the `ingest_live` churn at 800k live entries per
/// shard, one thread per shard, as the service's cores run it (8 workers x 200k
/// blocks over 2 shards). With two 20 MB tables the shards no longer share the L3
/// comfortably: this shows what two cores get together.
fn ingest_live_threads(c: &mut Criterion) {
    const STEPS: u64 = 256;
    let mut g = c.benchmark_group("ingest_live_threads");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    g.sample_size(20);
    for threads in [1u64, 2] {
        g.throughput(Throughput::Elements(threads * STEPS * 2 * BATCH));
        let mut shards: Vec<(IndexShard, Churner)> = (0..threads)
            .map(|t| {
                let mut idx = IndexShard::new();
                let churn = Churner::prefilled(&mut idx, 12_500, t << 40);
                (idx, churn)
            })
            .collect();
        g.bench_function(BenchmarkId::from_parameter(threads), |b| {
            b.iter_custom(|iters| {
                let t0 = Instant::now();
                std::thread::scope(|sc| {
                    for (idx, churn) in shards.iter_mut() {
                        sc.spawn(move || {
                            for _ in 0..iters * STEPS {
                                black_box(churn.step(idx));
                            }
                        });
                    }
                });
                t0.elapsed()
            })
        });
    }
    g.finish();
}

fn apply(shard: &mut IndexShard, events: &[Event]) -> u64 {
    let mut n = 0u64;
    for (w, store, h) in events {
        n += if *store {
            u64::from(shard.stored(*w, Tier::Device, h).added)
        } else {
            u64::from(shard.removed(*w, Tier::Device, h))
        };
    }
    n
}

/// `ingest_threads/shards/{1,2}`: the service's layout — one shard per thread, each
/// fed its pre-partitioned share of a Mooncake-derived stream. Throughput counts every
/// block event (stores and removes) of the whole stream.
fn ingest_threads(c: &mut Criterion) {
    let stream = mooncake_stream(8);
    let total: u64 = stream.iter().map(|e| e.2.len() as u64).sum();
    let mut g = c.benchmark_group("ingest_threads");
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    g.sample_size(10);
    g.throughput(Throughput::Elements(total));
    for bits in [0u32, 1] {
        let parts: Vec<Vec<Event>> = (0..1usize << bits)
            .map(|s| partition(&stream, bits, s))
            .collect();
        let mut shards: Vec<IndexShard> = parts.iter().map(|_| IndexShard::new()).collect();
        g.bench_function(BenchmarkId::new("shards", 1u32 << bits), |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    std::thread::scope(|sc| {
                        for (shard, part) in shards.iter_mut().zip(&parts) {
                            sc.spawn(move || black_box(apply(shard, part)));
                        }
                    });
                }
                t.elapsed()
            })
        });
    }
    g.finish();
}

fn query(c: &mut Criterion) {
    let mut g = c.benchmark_group("query");
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    let mut rng = SmallRng::seed_from_u64(7);
    for (workers, entries, tag) in [
        (16u16, 1u64 << 20, "1M"),
        (1024, 1 << 20, "1M"),
        (16, 10_000_000, "10M"),
        (1024, 10_000_000, "10M"),
    ] {
        let idx = build_fleet(workers, entries, &mut rng);
        let st = idx.stats();
        eprintln!(
            "query fleet: {workers} workers, {} entries, {} blocks",
            st.live_entries, st.blocks
        );
        for n in [64u64, 512] {
            let reqs: Vec<Vec<u64>> = (0..256)
                .map(|_| {
                    let d = rng.random_range(0..2048);
                    (0..n).map(|i| doc_hash(d, i)).collect()
                })
                .collect();
            let mut out = MergeResult::new();
            let mut k = 0;
            g.throughput(Throughput::Elements(1));
            g.bench_function(
                BenchmarkId::new(
                    format!("{n}_blocks"),
                    format!("{tag}_entries/{workers}_workers"),
                ),
                |b| {
                    b.iter(|| {
                        idx.query(&reqs[k % reqs.len()], |w| w == u16::MAX, &mut out);
                        k += 1;
                        black_box(out.workers().len())
                    })
                },
            );
        }
    }
    g.finish();
}

/// Prints heap bytes per entry of 10M-entry single-shard indexes. Not timed.
fn memory(_c: &mut Criterion) {
    const ENTRIES: u64 = 10_000_000;
    for holders in [1u64, 2, 4] {
        let mut idx = ShardedIndex::new(0);
        let blocks = ENTRIES / holders;
        let mut buf = Vec::with_capacity(1024);
        for w in 0..holders {
            idx.set_worker_cap(w as u16, u64::MAX);
            for start in (0..blocks).step_by(1024) {
                buf.clear();
                buf.extend(start..(start + 1024).min(blocks));
                idx.stored(w as u16, Tier::Device, &buf);
            }
        }
        let st = idx.stats();
        eprintln!(
            "memory: {} entries ({} blocks x {holders} holders): {} heap bytes, {:.1} bytes/entry",
            st.live_entries,
            st.blocks,
            st.heap_bytes,
            st.heap_bytes as f64 / st.live_entries as f64
        );
    }
}

criterion_group!(
    benches,
    ingest,
    ingest_live,
    ingest_live_threads,
    ingest_threads,
    query,
    memory
);
criterion_main!(benches);
