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
mod hashmix;
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
pub use hashmix::{mix, shard_of, unmix, MAX_SHARD_BITS};
pub use merge::{merge, MergeResult};
pub use pending::{speculate, PendingShard, PendingStats, Speculated};
pub use shard::{IndexShard, ShardStats, StoreOutcome, DEFAULT_WORKER_CAP};
pub use sharded::ShardedIndex;
