//! kvroute's side: its public index API (`kvroute::index::ShardedIndex`) driven
//! directly, as the in-process engine and the service's shards drive it.

use crate::streams::Stream;
use kvroute::index::{MergeResult, ShardedIndex};
use kvroute::sync::mailbox::Mailbox;
use kvroute::types::Tier;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
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
    /// Round-trip latency of every query, and of those no OS preemption touched.
    pub lat: crate::cpu::Lat,
    pub events_per_s: f64,
    /// Times the ingest side found nothing to apply (Dynamo's refilled channel empty);
    /// 0 for kvroute, whose owner generates its churn itself.
    pub starved: u64,
}

/// A query handed to the shard owner, with the buffer its answer is written into (the
/// asker's, handed back with the answer: no allocation per query).
struct Ask {
    q: usize,
    out: MergeResult,
}

/// The churn both sides apply: store sequence `k`, remove the one stored
/// `churn.len() / 2` sequences before (so the index keeps its size).
pub fn churn_step(churn: &[(u32, Vec<u64>)], k: usize) -> [(bool, u32, &[u64]); 2] {
    let live = churn.len() / 2;
    let (w, seq) = &churn[k % churn.len()];
    let (ow, old) = &churn[(k + churn.len() - live) % churn.len()];
    [(true, *w, seq), (false, *ow, old)]
}

/// Query latency while the shard owner ingests unpaced, the service's way
/// (`service::runtime::run_loop`): the owner thread applies churn ([`churn_step`]) in slices of
/// at most `slice` hashes, and after each slice drains its inbox (a
/// `kvroute::sync::mailbox::Mailbox`, the service's urgent-lane type) of queries,
/// answering each into the buffer that came with it and handing it back through a
/// second mailbox. The asker, on another CPU, hands one query at a time and spins
/// until the answer is back, `gap_us` apart. Both threads are pinned (`cpus`) and
/// never park (`crate::cpu`). `slice = None`: the owner does not ingest, only polls
/// its inbox (the hand-off floor). `slice = 1024` is the service before preemptible
/// ingest (a whole `BATCH_HASHES` batch), `128` its default `ingest_slice_hashes`.
pub fn mixed(
    s: &Stream,
    churn: &[(u32, Vec<u64>)],
    slice: Option<usize>,
    secs: f64,
    gap_us: u64,
    cpus: Option<(usize, usize)>,
) -> Mixed {
    let mut idx = build(s, 0);
    let inbox: Mailbox<Ask> = Mailbox::new(64);
    let answers: Mailbox<Ask> = Mailbox::new(64);
    let stop = AtomicBool::new(false);
    let queries = &s.queries;
    let mut applied = 0u64;
    let mut lat = crate::cpu::Lat::default();
    let mut elapsed = 0.0;
    let owner_tid = AtomicI32::new(0);
    std::thread::scope(|sc| {
        let owner = sc.spawn(|| {
            crate::cpu::pin(cpus.map(|c| c.0));
            owner_tid.store(crate::cpu::tid(), Ordering::Release);
            let answer = |idx: &ShardedIndex| {
                while let Some(mut a) = inbox.pop() {
                    idx.query(&queries[a.q % queries.len()], |_| false, &mut a.out);
                    // Capacity 64 > the one query in flight: never full.
                    let _ = answers.push(a);
                }
            };
            let t = Instant::now();
            let Some(slice) = slice.map(|s| s.max(1)) else {
                while !stop.load(Ordering::Relaxed) {
                    answer(&idx);
                    std::hint::spin_loop();
                }
                elapsed = t.elapsed().as_secs_f64();
                return;
            };
            let mut since = 0usize;
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                for (store, w, seq) in churn_step(churn, k) {
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
                            if !inbox.is_empty() {
                                answer(&idx);
                            }
                            since = 0;
                        }
                    }
                }
                k = k.wrapping_add(1);
            }
            elapsed = t.elapsed().as_secs_f64();
        });
        crate::cpu::pin(cpus.map(|c| c.1));
        crate::cpu::spin_until(|| owner_tid.load(Ordering::Acquire) != 0);
        let watch = crate::cpu::Watch::new(&[owner_tid.load(Ordering::Acquire), crate::cpu::tid()]);
        let mut buf = Some(MergeResult::new());
        let t = Instant::now();
        let mut i = 0usize;
        while t.elapsed().as_secs_f64() < secs {
            let out = buf.take().unwrap_or_default();
            let before = watch.as_ref().map(|w| w.wait_ns());
            let t0 = Instant::now();
            if inbox.push(Ask { q: i, out }).is_err() {
                break; // cannot happen: one query in flight, capacity 64
            }
            let mut back = None;
            // Spin on the queue's indices only (read-shared), pop once it has the answer.
            crate::cpu::spin_until(|| {
                back = if answers.is_empty() {
                    None
                } else {
                    answers.pop()
                };
                back.is_some()
            });
            let ns = t0.elapsed().as_nanos() as u64;
            lat.push(ns, watch.as_ref().map(|w| w.wait_ns()) != before);
            if let Some(a) = back {
                std::hint::black_box(a.out.workers().len());
                buf = Some(a.out);
            }
            i += 1;
            crate::cpu::spin_for(gap_us);
        }
        stop.store(true, Ordering::Release);
        let _ = owner.join();
    });
    Mixed {
        lat,
        events_per_s: applied as f64 / elapsed.max(1e-9),
        starved: 0,
    }
}

/// The same queries, pacing and pinning as [`mixed`] without an owner: the asking
/// thread queries the index itself, nothing ingests. With [`mixed`]'s idle owner this
/// splits a handed-over query into its hand-off and the query proper.
pub fn direct(s: &Stream, secs: f64, gap_us: u64, cpus: Option<(usize, usize)>) -> Mixed {
    let idx = build(s, 0);
    crate::cpu::pin(cpus.map(|c| c.1));
    let watch = crate::cpu::Watch::new(&[crate::cpu::tid()]);
    let mut out = MergeResult::new();
    let mut lat = crate::cpu::Lat::default();
    let t = Instant::now();
    let mut i = 0usize;
    while t.elapsed().as_secs_f64() < secs {
        let before = watch.as_ref().map(|w| w.wait_ns());
        let t0 = Instant::now();
        idx.query(&s.queries[i % s.queries.len()], |_| false, &mut out);
        std::hint::black_box(out.workers().len());
        let ns = t0.elapsed().as_nanos() as u64;
        lat.push(ns, watch.as_ref().map(|w| w.wait_ns()) != before);
        i += 1;
        crate::cpu::spin_for(gap_us);
    }
    Mixed {
        lat,
        events_per_s: 0.0,
        starved: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> (Stream, Vec<(u32, Vec<u64>)>) {
        let s = crate::streams::one_holder(4, 4096, 50);
        let mut seed = 9;
        let churn = (0..64u32)
            .map(|i| (i % 4, crate::streams::fresh_seq(&mut seed, 64)))
            .collect();
        (s, churn)
    }

    /// The owner answers handed-over queries while it ingests, at any slice, and with
    /// nothing to ingest; the answers are real (every stored query has a holder).
    #[test]
    fn owner_answers_between_slices() {
        let (s, churn) = small();
        for slice in [None, Some(1), Some(8), Some(1024)] {
            let r = mixed(&s, &churn, slice, 0.05, 5, crate::cpu::pair());
            assert!(!r.lat.all.is_empty(), "{slice:?}: no query answered");
            assert!(r.lat.clean.len() <= r.lat.all.len());
            if slice.is_some() {
                assert!(r.events_per_s > 0.0, "{slice:?}: nothing ingested");
            } else {
                assert_eq!(r.events_per_s, 0.0);
            }
        }
    }

    /// Churn keeps the index at its size: each step stores one fresh sequence and
    /// removes the one stored half the churn before.
    #[test]
    fn churn_keeps_the_index_size() {
        let (s, churn) = small();
        let mut idx = build(&s, 0);
        let start = entries(&idx);
        let half = churn.len() / 2;
        // Store the first half once (the sequences the first removes name), then churn.
        for (w, seq) in churn.iter().skip(half) {
            idx.stored(*w as u16, Tier::Device, seq);
        }
        let full = entries(&idx);
        assert_eq!(full, start + half as u64 * 64);
        for k in 0..3 * churn.len() {
            for (store, w, seq) in churn_step(&churn, k) {
                if store {
                    idx.stored(w as u16, Tier::Device, seq);
                } else {
                    idx.removed(w as u16, Tier::Device, seq);
                }
            }
            assert_eq!(entries(&idx), full, "step {k}");
        }
    }
}
