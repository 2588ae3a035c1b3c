//! Fixed workloads of the block index for instruction counting under callgrind (the
//! timed versions are `benches/index.rs`; the workloads are the same).
//!
//! ```text
//! cargo build --release --example index_prof
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='index_prof::run_*' \
//!     target/release/examples/index_prof ingest 1
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='index_prof::run_*' \
//!     target/release/examples/index_prof query 1024 1048576 64
//! ```
//!
//! `ingest BITS [PASSES]`: applies each shard's share of the Mooncake-derived stream of
//! `ingest_threads` (sequentially, one shard after the other) and prints the block
//! events applied. `query WORKERS ENTRIES BLOCKS [QUERIES]`: builds the fleet of the
//! `query` group and runs that many queries. Divide callgrind's `Ir` by the printed
//! counts for instructions per block event / per query.

use kvroute::index::{shard_of, IndexShard, MergeResult, ShardedIndex};
use kvroute::types::Tier;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::hint::black_box;

#[path = "../benches/workloads/index.rs"]
mod workload;
use workload::{build_fleet, doc_hash, mooncake_stream, partition, Event};

#[inline(never)]
fn run_ingest(shards: &mut [IndexShard], parts: &[Vec<Event>], passes: u32) -> u64 {
    let mut n = 0u64;
    for _ in 0..passes {
        for (shard, events) in shards.iter_mut().zip(parts) {
            for (w, store, h) in events {
                n += if *store {
                    u64::from(shard.stored(*w, Tier::Device, h).added)
                } else {
                    u64::from(shard.removed(*w, Tier::Device, h))
                };
            }
        }
    }
    n
}

#[inline(never)]
fn run_query(idx: &ShardedIndex, reqs: &[Vec<u64>], count: usize) -> (usize, usize) {
    let mut out = MergeResult::new();
    let mut touched = 0;
    for k in 0..count {
        idx.query(&reqs[k % reqs.len()], |w| w == u16::MAX, &mut out);
        touched += black_box(out.workers().len());
    }
    (count, touched)
}

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("ingest") => {
            let bits = arg(&args, 2, 0) as u32;
            let passes = arg(&args, 3, 1) as u32;
            let stream = mooncake_stream(8);
            let total: u64 = stream.iter().map(|e| e.2.len() as u64).sum();
            let parts: Vec<Vec<Event>> = (0..1usize << bits)
                .map(|s| partition(&stream, bits, s))
                .collect();
            let mut shards: Vec<IndexShard> = parts.iter().map(|_| IndexShard::new()).collect();
            let n = run_ingest(&mut shards, &parts, passes);
            println!(
                "block events: {} ({} entries changed)",
                total * u64::from(passes),
                n
            );
        }
        Some("query") => {
            let workers = arg(&args, 2, 16) as u16;
            let entries = arg(&args, 3, 1 << 20);
            let n = arg(&args, 4, 64);
            let count = arg(&args, 5, 1000) as usize;
            let mut rng = SmallRng::seed_from_u64(7);
            let idx = build_fleet(workers, entries, &mut rng);
            let reqs: Vec<Vec<u64>> = (0..256)
                .map(|_| {
                    let d = rng.random_range(0..2048);
                    (0..n).map(|i| doc_hash(d, i)).collect()
                })
                .collect();
            let (q, touched) = run_query(&idx, &reqs, count);
            let mut matches = 0;
            let mut probes = 0;
            for r in &reqs {
                for (s, shard) in idx.shards.iter().enumerate() {
                    let items: Vec<(u32, u64)> = (0u32..)
                        .zip(r.iter().copied())
                        .filter(|&(_, h)| shard_of(h, idx.shard_bits) == s)
                        .collect();
                    let mut a = kvroute::index::ShardAnswer::default();
                    shard.query(&items, &mut a);
                    matches += a.matches().count();
                    probes += items.partition_point(|&(p, _)| p <= a.first_miss);
                }
            }
            println!(
                "per query (both shards queried in full): {:.1} matches, {:.1} lookups",
                matches as f64 / reqs.len() as f64,
                probes as f64 / reqs.len() as f64
            );
            let st = idx.stats();
            println!(
                "queries: {q}, mean workers touched {:.1}; fleet {} entries, {} blocks",
                touched as f64 / q as f64,
                st.live_entries,
                st.blocks
            );
        }
        _ => eprintln!("usage: index_prof ingest BITS [PASSES] | query WORKERS ENTRIES BLOCKS [N]"),
    }
}
