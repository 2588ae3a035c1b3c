//! Dynamo's side: `dynamo-kv-router` 1.6.1's indexers driven directly, on the same
//! streams: `RadixTree` (single-threaded), `PositionalIndexer` (jump size 32, the
//! value of its own tests) and `ConcurrentRadixTreeCompressed` (fed through its own
//! worker loop, as its `ThreadPoolIndexer` does). Events are built before the clock
//! starts (`make_store_event` computes the sequence hashes, as an engine would send).

use crate::streams::Stream;
use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{LocalBlockHash, RouterEvent};
use dynamo_kv_router::test_utils::{make_remove_event, make_store_event};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, RadixTree};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The indexers compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Radix,
    Positional,
    Concurrent,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Radix, Kind::Positional, Kind::Concurrent];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Radix => "RadixTree",
            Kind::Positional => "PositionalIndexer",
            Kind::Concurrent => "ConcurrentRadixTreeCompressed",
        }
    }
}

/// A built Dynamo index.
pub enum Built {
    Radix(RadixTree),
    /// With its per-worker block maps (kept by its worker thread in the service).
    #[allow(dead_code)] // the maps are only kept alive (and counted as its memory)
    Positional(PositionalIndexer, Box<dyn std::any::Any>),
    Concurrent(ConcurrentRadixTreeCompressed),
}

/// The stream's store events.
pub fn events(s: &Stream) -> Vec<RouterEvent> {
    s.seqs
        .iter()
        .map(|(w, seq)| make_store_event(u64::from(*w), seq))
        .collect()
}

/// Applies `evs` to a fresh index of `kind`; returns it and the seconds it took.
pub fn build(kind: Kind, evs: Vec<RouterEvent>) -> (Built, f64) {
    match kind {
        Kind::Radix => {
            let mut t = RadixTree::new();
            let c = Instant::now();
            for e in evs {
                let _ = t.apply_event(e);
            }
            let secs = c.elapsed().as_secs_f64();
            (Built::Radix(t), secs)
        }
        Kind::Positional => {
            let t = PositionalIndexer::new(32);
            let mut blocks = Default::default();
            let c = Instant::now();
            for e in evs {
                let _ = t.apply_event(&mut blocks, e, None);
            }
            let secs = c.elapsed().as_secs_f64();
            (Built::Positional(t, Box::new(blocks)), secs)
        }
        Kind::Concurrent => {
            let t = Arc::new(ConcurrentRadixTreeCompressed::new());
            let (tx, rx) = flume::unbounded();
            for e in evs {
                let _ = tx.send(WorkerTask::Event(e));
            }
            drop(tx);
            let c = Instant::now();
            // Its worker loop drains the channel and returns once it is closed.
            let _ = t.worker(rx, None);
            let secs = c.elapsed().as_secs_f64();
            let t = Arc::try_unwrap(t).unwrap_or_else(|_| unreachable!("one owner"));
            (Built::Concurrent(t), secs)
        }
    }
}

fn local(q: &[u64]) -> Vec<LocalBlockHash> {
    q.iter().map(|&h| LocalBlockHash(h)).collect()
}

/// Nanoseconds of each query (`passes` passes), early exit off (full per-worker
/// overlaps, like kvroute's answer).
pub fn query_ns(b: &Built, queries: &[Vec<u64>], passes: usize) -> Vec<u64> {
    let qs: Vec<Vec<LocalBlockHash>> = queries.iter().map(|q| local(q)).collect();
    let mut lat = Vec::with_capacity(qs.len() * passes);
    for _ in 0..passes {
        for q in &qs {
            let n = match b {
                Built::Radix(t) => {
                    // Its API takes the sequence by value: the copy is made off the clock.
                    let owned = q.clone();
                    let c = Instant::now();
                    let n = t.find_matches(owned, false).scores.len();
                    lat.push(c.elapsed().as_nanos() as u64);
                    n
                }
                Built::Positional(t, _) => {
                    let c = Instant::now();
                    let n = t.find_matches(q, false).scores.len();
                    lat.push(c.elapsed().as_nanos() as u64);
                    n
                }
                Built::Concurrent(t) => {
                    let c = Instant::now();
                    let n = t.find_matches(q, false).scores.len();
                    lat.push(c.elapsed().as_nanos() as u64);
                    n
                }
            };
            std::hint::black_box(n);
        }
    }
    lat
}

/// Per-worker overlap of query `q` (cross-check).
pub fn overlaps(b: &Built, q: &[u64]) -> Vec<(u64, u32)> {
    let s = match b {
        Built::Radix(t) => t.find_matches(local(q), false),
        Built::Positional(t, _) => t.find_matches(&local(q), false),
        Built::Concurrent(t) => t.find_matches(&local(q), false),
    };
    let mut v: Vec<(u64, u32)> = s.scores.iter().map(|(w, &n)| (w.worker_id, n)).collect();
    v.sort_unstable();
    v
}

/// Events the asker keeps queued for `ConcurrentRadixTreeCompressed`'s worker loop
/// (refilled in its gap between queries): 512 events of 64 hashes, far more than the
/// worker applies in one gap, so it never runs dry (`Mixed::starved` counts the
/// refills that found the channel empty).
const QUEUED: usize = 512;

/// Query latency while ingest runs unpaced on another thread, for the two indexers
/// that allow it: `PositionalIndexer` (its `apply_event` on a thread of its own,
/// building the churn events itself) and `ConcurrentRadixTreeCompressed` (its own
/// worker loop draining a flume channel, as its `ThreadPoolIndexer` runs it; its
/// `apply_event` is private). The channel is refilled by the asking thread in its gap
/// between queries, to [`QUEUED`] events, so the tree ingests for the whole run, as
/// kvroute's owner does (a prefilled channel drained after ~15 queries). Same churn
/// (`kv::churn_step`), pacing, pinning and spinning as `kv::mixed`; the query is
/// answered on the asking thread (these indexes are read concurrently with the writer).
pub fn mixed(
    kind: Kind,
    s: &Stream,
    churn: &[(u32, Vec<u64>)],
    secs: f64,
    gap_us: u64,
    cpus: Option<(usize, usize)>,
) -> crate::kv::Mixed {
    let churn_ev = |k: usize| -> [RouterEvent; 2] {
        crate::kv::churn_step(churn, k).map(|(store, w, seq)| {
            if store {
                make_store_event(u64::from(w), seq)
            } else {
                make_remove_event(u64::from(w), seq)
            }
        })
    };
    let per_step = |k: usize| -> u64 {
        crate::kv::churn_step(churn, k)
            .iter()
            .map(|c| c.2.len() as u64)
            .sum()
    };
    let qs: Vec<Vec<LocalBlockHash>> = s.queries.iter().map(|q| local(q)).collect();
    let stop = AtomicBool::new(false);
    let ready = AtomicBool::new(false);
    let mut lat = crate::cpu::Lat::default();
    let writer_tid = AtomicI32::new(0);
    let mut applied = 0u64;
    let mut elapsed = 0.0;
    let mut starved = 0u64;
    // Asks one query at a time, `gap_us` apart (`between` runs at the start of each
    // gap, off the clock).
    let ask = |find: &dyn Fn(&[LocalBlockHash]) -> usize,
               between: &mut dyn FnMut(),
               lat: &mut crate::cpu::Lat| {
        crate::cpu::spin_until(|| writer_tid.load(Ordering::Acquire) != 0);
        let watch =
            crate::cpu::Watch::new(&[writer_tid.load(Ordering::Acquire), crate::cpu::tid()]);
        let t = Instant::now();
        let mut i = 0usize;
        while t.elapsed().as_secs_f64() < secs {
            let before = watch.as_ref().map(|w| w.wait_ns());
            let c = Instant::now();
            let n = find(&qs[i % qs.len()]);
            let ns = c.elapsed().as_nanos() as u64;
            lat.push(ns, watch.as_ref().map(|w| w.wait_ns()) != before);
            std::hint::black_box(n);
            i += 1;
            let g = Instant::now();
            between();
            let left = gap_us.saturating_sub(g.elapsed().as_micros() as u64);
            crate::cpu::spin_for(left);
        }
    };
    match kind {
        Kind::Positional => {
            let t = PositionalIndexer::new(32);
            let t = &t;
            std::thread::scope(|sc| {
                let ing = sc.spawn(|| {
                    crate::cpu::pin(cpus.map(|c| c.0));
                    writer_tid.store(crate::cpu::tid(), Ordering::Release);
                    // The ingest thread owns the per-worker maps: it builds the
                    // stream first (untimed), then churns.
                    let mut blocks = Default::default();
                    for e in events(s) {
                        let _ = t.apply_event(&mut blocks, e, None);
                    }
                    ready.store(true, Ordering::Release);
                    let c = Instant::now();
                    let mut k = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        for e in churn_ev(k) {
                            let _ = t.apply_event(&mut blocks, e, None);
                        }
                        applied += per_step(k);
                        k += 1;
                    }
                    elapsed = c.elapsed().as_secs_f64();
                });
                crate::cpu::pin(cpus.map(|c| c.1));
                crate::cpu::spin_until(|| ready.load(Ordering::Acquire));
                ask(
                    &|q| t.find_matches(q, false).scores.len(),
                    &mut || {},
                    &mut lat,
                );
                stop.store(true, Ordering::Release);
                let _ = ing.join();
            });
        }
        Kind::Concurrent => {
            let (Built::Concurrent(t), _) = build(kind, events(s)) else {
                unreachable!()
            };
            let (tx, rx) = flume::unbounded();
            let mut k = 0usize;
            let mut sent = 0u64;
            let mut refill = |tx: &flume::Sender<WorkerTask>, starved: &mut u64| {
                if tx.is_empty() {
                    *starved += 1;
                }
                while tx.len() < QUEUED {
                    for e in churn_ev(k) {
                        let _ = tx.send(WorkerTask::Event(e));
                    }
                    sent += per_step(k);
                    k += 1;
                }
            };
            refill(&tx, &mut 0);
            let t = &t;
            std::thread::scope(|sc| {
                let ing = sc.spawn(|| {
                    crate::cpu::pin(cpus.map(|c| c.0));
                    writer_tid.store(crate::cpu::tid(), Ordering::Release);
                    let c = Instant::now();
                    // Returns once the channel is closed and drained.
                    let _ = t.worker(rx, None);
                    elapsed = c.elapsed().as_secs_f64();
                });
                crate::cpu::pin(cpus.map(|c| c.1));
                ask(
                    &|q| t.find_matches(q, false).scores.len(),
                    &mut || refill(&tx, &mut starved),
                    &mut lat,
                );
                drop(tx);
                let _ = ing.join();
            });
            // Everything sent was applied by the time the worker returned.
            applied = sent;
        }
        Kind::Radix => unreachable!("RadixTree is single-threaded"),
    }
    crate::kv::Mixed {
        lat,
        events_per_s: applied as f64 / elapsed.max(1e-9),
        starved,
    }
}
