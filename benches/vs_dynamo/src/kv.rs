//! kvroute's side: its public index API (`kvroute::index::ShardedIndex`) driven
//! directly, as the in-process engine and the service's shards drive it.

use crate::streams::Stream;
use kvroute::index::{MergeResult, ShardedIndex};
use kvroute::types::Tier;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// An index of `1 << bits` shards holding the stream (caps lifted).
pub fn build(s: &Stream, bits: u32) -> ShardedIndex {
    let mut idx = ShardedIndex::new(bits);
    for w in 0..s.workers {
        idx.set_worker_cap(w as u16, 1 << 40);
    }
    for (w, seq) in &s.seqs {
        idx.stored(*w as u16, Tier::Device, seq);
    }
    idx
}

/// Nanoseconds of each query (`passes` passes over the queries).
pub fn query_ns(idx: &ShardedIndex, queries: &[Vec<u64>], passes: usize) -> Vec<u64> {
    let mut out = MergeResult::new();
    let mut lat = Vec::with_capacity(queries.len() * passes);
    for _ in 0..passes {
        for q in queries {
            let t = Instant::now();
            idx.query(q, |_| false, &mut out);
            std::hint::black_box(out.workers().len());
            lat.push(t.elapsed().as_nanos() as u64);
        }
    }
    lat
}

/// Per-worker device overlap of query `q` (for the cross-check against Dynamo).
pub fn overlaps(idx: &ShardedIndex, q: &[u64]) -> Vec<(u64, u32)> {
    let mut out = MergeResult::new();
    idx.query(q, |_| false, &mut out);
    let mut v: Vec<(u64, u32)> = out
        .workers()
        .iter()
        .map(|&w| (u64::from(w), out.get(w).device))
        .collect();
    v.sort_unstable();
    v
}

/// Live (block, worker, tier) entries of the index.
pub fn entries(idx: &ShardedIndex) -> u64 {
    idx.stats().live_entries
}

/// What a mixed run measured.
pub struct Mixed {
    pub query_ns: Vec<u64>,
    pub events_per_s: f64,
}

/// Query latency while one thread ingests unpaced, the service's way: the thread
/// owning the shard applies churn (store a sequence, remove the one stored
/// `churn.len() / 2` sequences before) and looks for a waiting query every `slice`
/// hashes; another thread asks the queries (one at a time, `gap_us` apart) and times
/// each from asking to answer. `slice = 1024` (a whole `BATCH_HASHES` batch) is the
/// service before preemptible ingest, `128` its default `ingest_slice_hashes` now.
pub fn mixed(s: &Stream, churn: &[(u32, Vec<u64>)], slice: usize, secs: f64, gap_us: u64) -> Mixed {
    let mut idx = build(s, 0);
    let req = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let queries = &s.queries;
    let mut applied = 0u64;
    let mut lat = Vec::new();
    let mut elapsed = 0.0;
    std::thread::scope(|sc| {
        let owner = sc.spawn(|| {
            let mut out = MergeResult::new();
            let mut answer = |idx: &ShardedIndex| {
                let r = req.load(Ordering::Acquire);
                if r != done.load(Ordering::Relaxed) {
                    idx.query(&queries[(r - 1) % queries.len()], |_| false, &mut out);
                    done.store(r, Ordering::Release);
                }
            };
            let t = Instant::now();
            let live = churn.len() / 2;
            let mut since = 0usize;
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let (w, seq) = &churn[k];
                let old = &churn[(k + churn.len() - live) % churn.len()];
                k = (k + 1) % churn.len();
                for (store, w, seq) in [(true, *w, seq), (false, old.0, &old.1)] {
                    let mut off = 0;
                    while off < seq.len() {
                        let n = (slice - since).min(seq.len() - off);
                        let part = &seq[off..off + n];
                        if store {
                            idx.stored(w as u16, Tier::Device, part);
                        } else {
                            idx.removed(w as u16, Tier::Device, part);
                        }
                        off += n;
                        since += n;
                        applied += n as u64;
                        if since >= slice {
                            answer(&idx);
                            since = 0;
                        }
                    }
                }
            }
            elapsed = t.elapsed().as_secs_f64();
            // Answer a last waiting query so the asker never hangs.
            while req.load(Ordering::Acquire) != done.load(Ordering::Acquire) {
                answer(&idx);
            }
        });
        let t = Instant::now();
        let mut r = 0usize;
        while t.elapsed().as_secs_f64() < secs {
            r += 1;
            let t0 = Instant::now();
            req.store(r, Ordering::Release);
            let mut spins = 0u32;
            while done.load(Ordering::Acquire) != r {
                crate::streams::relax(&mut spins);
            }
            lat.push(t0.elapsed().as_nanos() as u64);
            crate::streams::pause(gap_us);
        }
        stop.store(true, Ordering::Release);
        let _ = owner.join();
    });
    Mixed {
        query_ns: lat,
        events_per_s: applied as f64 / elapsed.max(1e-9),
    }
}
