//! Index updates on one core: applying a worker's KV-event batch to this core's shard
//! slice by slice (`run_loop` interleaves slices with urgent messages), and forgetting
//! a worker (deregistration or a new identity).
//!
//! Guarantees: a slice is applied only while the slot still has the identity the batch
//! was about, so a `Forget` handled between two slices drops the rest of a stale batch;
//! forgetting a worker clears its index, active and pending blocks on this shard and
//! ends the requests it held here.

use super::Core;
use crate::service::runtime::ingest_slice::{IngestCursor, Piece};
use crate::service::runtime::msg::{IndexOp, Msg};
use crate::types::{Tier, WorkerSlot};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Core {
    /// Starts applying an index message slice by slice (`run_loop`); any other
    /// message is returned as is.
    pub fn begin_index(&self, msg: Msg) -> Result<IngestCursor, Msg> {
        let cur = IngestCursor::from_msg(msg)?;
        // Every core sees every index batch; core 0 notes it for the status page.
        if self.id == 0 && cur.ops().iter().any(|o| !matches!(o, IndexOp::SetCap(_))) {
            let now = self.shared.now_ms();
            self.shared.status.counters.cache_event(cur.slot(), now);
        }
        Ok(cur)
    }

    /// Applies the next slice of `cur`: at most `budget` of this shard's hashes
    /// (`runtime::ingest_slice`). Returns whether more remains. The slot's identity is checked
    /// before every slice, so a `Forget` handled between two slices drops the rest of
    /// a batch that was about the previous identity.
    pub fn apply_index_slice(&self, cur: &mut IngestCursor, budget: usize) -> bool {
        let slot = cur.slot();
        let current = self
            .shared
            .cells(slot)
            .map(|c| c.gen.load(Ordering::Acquire));
        if current != Some(cur.gen()) {
            return false; // about a previous identity of the slot
        }
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let bits = self.shared.shard_bits;
        let shard = self.shared.shard_index(self.id);
        let reports = self.shared.reports_index(self.id);
        let metrics = &self.shared.metrics;
        let more = cur.step(
            budget,
            |hashes, out| hashes.select(shard, bits, out),
            |piece| match piece {
                Piece::Stored(tier, hashes) => {
                    let o = st.index.stored(slot, tier, hashes);
                    if o.rejected > 0 && reports {
                        metrics.index_refused(o.rejected, o.over_budget);
                    }
                    if !st.speculative.is_empty() {
                        st.speculative.confirm(slot, hashes);
                    }
                }
                Piece::Removed(tier, hashes) => {
                    st.index.removed(slot, tier, hashes);
                    if !st.speculative.is_empty() {
                        st.speculative.drop_hashes(slot, hashes);
                    }
                }
                Piece::Other(IndexOp::Cleared { tier }) => {
                    match tier {
                        Some(t) => st.index.clear_tier(slot, *t),
                        None => {
                            for t in Tier::ALL {
                                st.index.clear_tier(slot, t);
                            }
                        }
                    }
                    st.speculative.clear_worker(slot);
                }
                Piece::Other(IndexOp::SetCap(cap)) => st.index.set_worker_cap(slot, *cap),
                // Operations with hashes always come as `Stored` / `Removed` pieces.
                Piece::Other(IndexOp::Stored { .. } | IndexOp::Removed { .. }) => {}
            },
        );
        st.mark(slot);
        more
    }

    pub(super) fn forget(&self, slot: WorkerSlot) {
        let mut st = self.st.borrow_mut();
        st.index.clear_worker(slot);
        st.active.clear_worker(slot);
        st.speculative.clear_worker(slot);
        for f in st.tracker.remove_worker(slot) {
            st.retained.remove(&f.id);
            self.unregister(&f.id);
            // The decode worker's active blocks live in every shard: other shards drop
            // them on their own Forget (clear_worker) when decode_worker == slot; a
            // request that only prefilled on `slot` keeps its decode-side blocks.
            if f.decode_worker != slot {
                drop(st);
                self.broadcast_active(f.decode_worker, false, Arc::from(f.hashes.as_slice()), None);
                st = self.st.borrow_mut();
            }
        }
        st.mark(slot);
    }
}
