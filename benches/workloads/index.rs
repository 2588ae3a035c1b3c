//! Block-index workloads shared by `benches/index.rs` (timed) and
//! `examples/index_prof.rs` (instruction counts under callgrind), so both measure the
//! same thing. Included with `#[path]`; not a bench target of its own.

use kvroute::index::{shard_of, ShardedIndex};
use kvroute::sim::trace::{read_mooncake, TraceOptions};
use kvroute::types::Tier;
use rand::rngs::SmallRng;
use rand::Rng;

/// One cache event of the threaded ingest stream: `(worker, store?, hashes)`.
pub type Event = (u16, bool, Vec<u64>);

/// A Mooncake-derived event stream: the trace slice's requests replayed `rounds` times
/// (hashes salted per round, so each round is new content with the trace's prefix
/// sharing), each request stored on worker `i % 16` and removed 256 requests later;
/// ends with every block removed, so a pass leaves the index empty.
pub fn mooncake_stream(rounds: u64) -> Vec<Event> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/mooncake_slice.jsonl"
    );
    let reqs =
        read_mooncake(std::path::Path::new(path), &TraceOptions::default()).unwrap_or_default();
    let mut seqs = Vec::new();
    for r in 0..rounds {
        let salt = r.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for q in &reqs {
            seqs.push(q.hashes.iter().map(|h| h ^ salt).collect::<Vec<u64>>());
        }
    }
    const WINDOW: usize = 256;
    let mut out = Vec::new();
    for (i, h) in seqs.iter().enumerate() {
        out.push(((i % 16) as u16, true, h.clone()));
        if i >= WINDOW {
            out.push((((i - WINDOW) % 16) as u16, false, seqs[i - WINDOW].clone()));
        }
    }
    let start = seqs.len().saturating_sub(WINDOW);
    for (i, h) in seqs.iter().enumerate().skip(start) {
        out.push(((i % 16) as u16, false, h.clone()));
    }
    out
}

/// The part of `stream` owned by shard `s` of `1 << bits`.
pub fn partition(stream: &[Event], bits: u32, s: usize) -> Vec<Event> {
    stream
        .iter()
        .map(|(w, st, h)| {
            let mine = h.iter().copied().filter(|&x| shard_of(x, bits) == s);
            (*w, *st, mine.collect::<Vec<u64>>())
        })
        .filter(|e| !e.2.is_empty())
        .collect()
}

/// Hash of block `i` of document `d`; blocks 0..8 are a system prompt shared by all.
pub fn doc_hash(d: u64, i: u64) -> u64 {
    if i < 8 {
        i
    } else {
        ((d + 1) << 20) | i
    }
}

pub fn build_fleet(workers: u16, entries: u64, rng: &mut SmallRng) -> ShardedIndex {
    const DOCS: u64 = 2048;
    let mut idx = ShardedIndex::new(1);
    let per_worker = entries / workers as u64;
    let mut buf = Vec::with_capacity(512);
    for w in 0..workers {
        idx.set_worker_cap(w, 2 * per_worker + 1024);
        let mut held = 0;
        while held < per_worker {
            let d = rng.random_range(0..DOCS);
            let len = rng.random_range(1..=512u64).min(per_worker - held + 8);
            buf.clear();
            buf.extend((0..len).map(|i| doc_hash(d, i)));
            held += idx.stored(w, Tier::Device, &buf).added as u64;
            if rng.random_bool(0.1) && len < 512 {
                let more = rng.random_range(len..=512);
                buf.clear();
                buf.extend((len..more).map(|i| doc_hash(d, i)));
                held += idx.stored(w, Tier::Host, &buf).added as u64;
            }
        }
    }
    idx
}
