//! Index updates on one core: applying a worker's KV-event batch to this core's shard
//! slice by slice (`run_loop` interleaves slices with urgent messages), and forgetting
//! a worker (deregistration or a new identity).
//!
//! Guarantees: a slice is applied only while the slot still has the identity the batch
//! was about, so a `Forget` handled between two slices drops the rest of a stale batch;
//! forgetting a worker clears its index, active, pending and modelled blocks on this
//! shard and ends the requests it held here. An approximate worker's first KV event
//! switches it to exact: the first core to see the batch clears its flag (so no core
//! models a route it applies after handling the batch) and every core drops its
//! modelled blocks before applying the batch's first slice.

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
        let event = cur.ops().iter().any(|o| !matches!(o, IndexOp::SetCap(_)));
        // Every core sees every index batch; core 0 notes it for the status page.
        if self.id == 0 && event {
            let now = self.shared.now_ms();
            self.shared.status.counters.cache_event(cur.slot(), now);
        }
        if event {
            self.first_event(cur.slot(), cur.gen());
        }
        Ok(cur)
    }

    /// A KV event batch of `slot` (identity `gen`) arrived: an approximate worker is
    /// exact from now on, and this shard's modelled blocks of it go.
    fn first_event(&self, slot: WorkerSlot, gen: u64) {
        let Some(c) = self.shared.cells(slot) else {
            return;
        };
        if c.gen.load(Ordering::Acquire) != gen {
            return; // about a previous identity of the slot
        }
        self.st.borrow_mut().approx.clear_worker(slot);
        if c.approximate.swap(false, Ordering::AcqRel) {
            self.shared.metrics.approximate_switches.inc();
            let reg = self.shared.registry.load();
            let id = reg.get(slot).map_or("?", |e| e.spec.id.as_str());
            eprintln!(
                "kvroute: worker {id:?} sent its first KV event: approximate mode off, its cache is now as its events say"
            );
        }
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
                Piece::Other(IndexOp::SetCap(cap)) => {
                    st.index.set_worker_cap(slot, *cap);
                    st.approx.set_worker_cap(slot, *cap);
                }
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
        st.approx.clear_worker(slot);
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
