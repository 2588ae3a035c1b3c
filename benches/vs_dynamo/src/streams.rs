//! The streams both indexes are driven with, built once and shared byte for byte:
//! - `trace`: the Mooncake conversation trace (each request's `hash_ids` are block
//!   hashes chained from the root; request `i` is stored on worker `i % workers`), so
//!   shared prefixes (the system prompt) have many holders;
//! - `one_holder`: synthetic, every block unique to one sequence on one worker (the
//!   well-routed fleet's common case), 64 blocks per sequence.
//!
//! Queries are stored sequences (full hits); the mixed run's churn stores fresh
//! sequences and removes them again, so the index keeps its size.

/// One stream: sequences to store (worker, block hashes from the root) and queries.
pub struct Stream {
    pub name: String,
    pub workers: u32,
    pub seqs: Vec<(u32, Vec<u64>)>,
    pub queries: Vec<Vec<u64>>,
}

impl Stream {
    /// Block events (hashes) in `seqs`.
    pub fn hashes(&self) -> usize {
        self.seqs.iter().map(|(_, s)| s.len()).sum()
    }
}

/// SplitMix64 step: the bench's deterministic randomness.
pub fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The trace's requests (`hash_ids` of each JSON line).
pub fn read_trace(path: &str) -> Result<Vec<Vec<u64>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{path}: {e}"))?;
        let ids = v["hash_ids"]
            .as_array()
            .ok_or_else(|| format!("{path}: a line without hash_ids"))?
            .iter()
            .filter_map(|x| x.as_u64())
            .collect::<Vec<_>>();
        if !ids.is_empty() {
            out.push(ids);
        }
    }
    Ok(out)
}

/// Every request of the trace stored on worker `i % workers`; `queries` requests
/// (spread over the trace) as queries.
pub fn trace(reqs: &[Vec<u64>], workers: u32, queries: usize) -> Stream {
    let seqs = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| ((i as u32) % workers, r.clone()))
        .collect();
    let step = (reqs.len() / queries.max(1)).max(1);
    let queries = reqs.iter().step_by(step).take(queries).cloned().collect();
    Stream {
        name: format!("trace/{workers}w"),
        workers,
        seqs,
        queries,
    }
}

/// A fresh sequence of `len` unique block hashes.
pub fn fresh_seq(seed: &mut u64, len: usize) -> Vec<u64> {
    // The top bit marks synthetic hashes, so they never collide with trace ids.
    (0..len).map(|_| splitmix(seed) | 1 << 63).collect()
}

/// `entries` (block, worker) entries with one holder each: sequences of 64 blocks on
/// workers round robin; `queries` random stored sequences as queries.
pub fn one_holder(workers: u32, entries: usize, queries: usize) -> Stream {
    let mut seed = 0x6f6e_655f_686f_6c64 ^ u64::from(workers);
    let n = (entries / 64).max(1);
    let seqs: Vec<(u32, Vec<u64>)> = (0..n)
        .map(|i| ((i as u32) % workers, fresh_seq(&mut seed, 64)))
        .collect();
    let queries = (0..queries)
        .map(|_| seqs[(splitmix(&mut seed) % n as u64) as usize].1.clone())
        .collect();
    Stream {
        name: format!("one-holder/{workers}w"),
        workers,
        seqs,
        queries,
    }
}
