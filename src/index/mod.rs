//! The sharded block index and the merge of per-shard matches into per-worker overlaps.
//!
//! Each [`IndexShard`] maps a block's sequence hash to the small set of (worker, tier)
//! entries holding it (DESIGN §2 "Index shards"). The service runs one shard per core; a
//! routing query scatters the request's positions to the shards owning them
//! ([`shard_of`]), each shard answers with its positions' holders, run-length encoded
//! ([`ShardAnswer`]), and
//! [`merge`] turns those partial answers into per-worker [`Overlap`](crate::types::Overlap)s
//! following DESIGN §1 "Cache tiers and overlap". [`ShardedIndex`] wires the three
//! together in one process (tests, the in-process engine, benches).
//!
//! Guarantees:
//! - memory is bounded: every worker has a per-shard cap (default
//!   [`DEFAULT_WORKER_CAP`]), or, for shards attached to a shared [`Budget`] (the
//!   service), an exact cap over all shards plus a global limit on the whole index;
//!   entries invalidated by O(1) clears are reclaimed by an amortised compaction;
//! - clearing a worker or one of its tiers is O(1) (a generation bump), except once per
//!   `2^14` clears of the same (worker, tier), when the generation wraps and a full
//!   compaction guarantees that no stale entry can ever become live again;
//! - queries never allocate once their output buffers have grown to size.

mod answer;
pub mod approx;
mod budget;
mod holders;
mod merge;
pub mod pending;
mod shard;
mod sharded;
mod table;

#[cfg(test)]
mod tests_answer;
#[cfg(test)]
mod tests_merge;
#[cfg(test)]
mod tests_prop;
#[cfg(test)]
mod tests_query;
#[cfg(test)]
mod tests_shard;

pub use answer::{Holder, Match, Run, ShardAnswer};
pub use approx::{ApproxShard, ApproxStats};
pub use budget::{Budget, Grant};
pub use merge::{merge, MergeResult};
pub use pending::{speculate, PendingShard, PendingStats, Speculated};
pub use shard::{IndexShard, ShardStats, StoreOutcome, DEFAULT_WORKER_CAP};
pub use sharded::{ShardedIndex, MAX_SHARD_BITS};

/// Fixed bijective 64-bit mixer (the SplitMix64 finaliser).
///
/// Client-supplied precomputed hashes may be small integers (e.g. Mooncake `hash_ids`);
/// mixing spreads them uniformly over shards and hash-table buckets. Being a bijection,
/// the mixed value can itself serve as the table key: two different hashes never share
/// a key, so the index stores `mix(h)` and never `h`.
#[inline]
pub fn mix(h: u64) -> u64 {
    let mut z = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Inverse of [`mix`] (each xor-shift and odd multiplication of the finaliser undone).
#[inline]
pub fn unmix(z: u64) -> u64 {
    let mut z = z ^ (z >> 31) ^ (z >> 62);
    z = z.wrapping_mul(0x3196_42B2_D24D_8EC3);
    z = z ^ (z >> 27) ^ (z >> 54);
    z = z.wrapping_mul(0x96DE_1B17_3F11_9089);
    z = z ^ (z >> 30) ^ (z >> 60);
    z.wrapping_sub(0x9E37_79B9_7F4A_7C15)
}

/// Shard owning hash `h` among `1 << shard_bits` shards: the top `shard_bits` bits of
/// `mix(h)` (0 when `shard_bits == 0`). `shard_bits` is clamped to [`MAX_SHARD_BITS`].
#[inline]
pub fn shard_of(h: u64, shard_bits: u32) -> usize {
    let bits = shard_bits.min(MAX_SHARD_BITS);
    if bits == 0 {
        0
    } else {
        (mix(h) >> (64 - bits)) as usize
    }
}
