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
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Query latency while ingest runs unpaced in another thread, for the two indexers
/// that allow it: `PositionalIndexer` (its `apply_event` on a thread of its own) and
/// `ConcurrentRadixTreeCompressed` (its worker loop draining a prefilled channel).
/// Same churn and query pacing as `kv::mixed`.
pub fn mixed(
    kind: Kind,
    s: &Stream,
    churn: &[(u32, Vec<u64>)],
    secs: f64,
    gap_us: u64,
) -> crate::kv::Mixed {
    let live = churn.len() / 2;
    let churn_ev = |k: usize| -> [RouterEvent; 2] {
        let (w, seq) = &churn[k % churn.len()];
        let (ow, old) = &churn[(k + churn.len() - live) % churn.len()];
        [
            make_store_event(u64::from(*w), seq),
            make_remove_event(u64::from(*ow), old),
        ]
    };
    let qs: Vec<Vec<LocalBlockHash>> = s.queries.iter().map(|q| local(q)).collect();
    let stop = AtomicBool::new(false);
    let ready = AtomicBool::new(false);
    let mut lat = Vec::new();
    let mut applied = 0u64;
    let mut elapsed = 0.0;
    // Asks one query at a time, `gap_us` apart, while `find` answers (`None`: stop).
    let ask = |find: &dyn Fn(&[LocalBlockHash]) -> Option<usize>, lat: &mut Vec<u64>| {
        let t = Instant::now();
        let mut i = 0usize;
        while t.elapsed().as_secs_f64() < secs {
            let c = Instant::now();
            let Some(n) = find(&qs[i % qs.len()]) else {
                break;
            };
            lat.push(c.elapsed().as_nanos() as u64);
            std::hint::black_box(n);
            i += 1;
            crate::streams::pause(gap_us);
        }
    };
    match kind {
        Kind::Positional => {
            let t = PositionalIndexer::new(32);
            let t = &t;
            std::thread::scope(|sc| {
                let ing = sc.spawn(|| {
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
                        applied += 2 * churn[k % churn.len()].1.len() as u64;
                        k += 1;
                    }
                    elapsed = c.elapsed().as_secs_f64();
                });
                while !ready.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                ask(&|q| Some(t.find_matches(q, false).scores.len()), &mut lat);
                stop.store(true, Ordering::Release);
                let _ = ing.join();
            });
        }
        Kind::Concurrent => {
            let (Built::Concurrent(t), _) = build(kind, events(s)) else {
                unreachable!()
            };
            // 2 M hashes of churn, sent before the clock (more would take GBs of
            // events); queries are timed only while the worker loop still ingests.
            let (tx, rx) = flume::unbounded();
            let per = 2 * churn.first().map_or(64, |c| c.1.len()) as u64;
            let n = (2_000_000 / per).max(1) as usize;
            for k in 0..n {
                for e in churn_ev(k) {
                    let _ = tx.send(WorkerTask::Event(e));
                }
            }
            drop(tx);
            let t = &t;
            std::thread::scope(|sc| {
                let ing = sc.spawn(|| {
                    let c = Instant::now();
                    let _ = t.worker(rx, None);
                    elapsed = c.elapsed().as_secs_f64();
                });
                ask(
                    &|q| (!ing.is_finished()).then(|| t.find_matches(q, false).scores.len()),
                    &mut lat,
                );
                let _ = ing.join();
            });
            applied = n as u64 * per;
        }
        Kind::Radix => unreachable!("RadixTree is single-threaded"),
    }
    crate::kv::Mixed {
        query_ns: lat,
        events_per_s: applied as f64 / elapsed.max(1e-9),
    }
}
