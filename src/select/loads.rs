//! [`Loads`]: the dynamic per-worker figures of a [`Fleet`] (liveness, suspicion, load)
//! as a struct of arrays in the fleet's position order, DESIGN §1 "Cost", "Selection".
//!
//! The split from [`super::Hits`] follows how the figures change. Load and liveness
//! change on lifecycle events, so the engine and the service keep one `Loads` per
//! fleet and update the workers an event touched; a request brings its overlaps and
//! reuse ([`super::Hits`], rebuilt per request). Together they are everything
//! [`super::decide_view`] needs, and its `kv` kernel scans the arrays densely.
//!
//! Guarantees: no method panics (unknown slots are ignored); a fresh `Loads` has every
//! worker not live, with zero load.

use super::fleet::Fleet;
use super::LoadFigures;
use crate::types::WorkerSlot;

/// Dynamic figures of every worker of one [`Fleet`], by position. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Loads {
    /// Slot → position of the fleet the loads were made for.
    pos_of_slot: Vec<u32>,
    pub(crate) live: Vec<bool>,
    /// 0 for a live worker, +∞ otherwise: added to a cost, it excludes the worker.
    pub(crate) gate: Vec<f64>,
    pub(crate) suspect: Vec<bool>,
    /// Positions of the suspect workers.
    pub(crate) suspects: Vec<u32>,
    pub(crate) active_requests: Vec<u32>,
    pub(crate) prefill_tokens: Vec<f64>,
    pub(crate) blocks_total: Vec<f64>,
    pub(crate) output_blocks: Vec<f64>,
    pub(crate) blocks_unique: Vec<f64>,
    /// All zero: stands in for a figure a stage's configuration does not count.
    pub(crate) zeros: Vec<f64>,
}

impl Loads {
    /// Figures for `fleet`: every worker not live, nothing loaded.
    pub fn new(fleet: &Fleet) -> Loads {
        let n = fleet.len();
        Loads {
            pos_of_slot: fleet.pos_of_slot.clone(),
            live: vec![false; n],
            gate: vec![f64::INFINITY; n],
            suspect: vec![false; n],
            suspects: Vec::new(),
            active_requests: vec![0; n],
            prefill_tokens: vec![0.0; n],
            blocks_total: vec![0.0; n],
            output_blocks: vec![0.0; n],
            blocks_unique: vec![0.0; n],
            zeros: vec![0.0; n],
        }
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True without workers.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    fn pos(&self, slot: WorkerSlot) -> Option<usize> {
        match self.pos_of_slot.get(slot as usize) {
            Some(&p) if (p as usize) < self.live.len() => Some(p as usize),
            _ => None,
        }
    }

    /// Sets whether the worker in `slot` is live.
    pub fn set_live(&mut self, slot: WorkerSlot, live: bool) {
        if let Some(p) = self.pos(slot) {
            self.set_live_at(p, live);
        }
    }

    pub(crate) fn set_live_at(&mut self, p: usize, live: bool) {
        self.live[p] = live;
        self.gate[p] = if live { 0.0 } else { f64::INFINITY };
    }

    /// Sets whether the index state of the worker in `slot` is suspect.
    pub fn set_suspect(&mut self, slot: WorkerSlot, suspect: bool) {
        if let Some(p) = self.pos(slot) {
            self.set_suspect_at(p, suspect);
        }
    }

    pub(crate) fn set_suspect_at(&mut self, p: usize, suspect: bool) {
        if self.suspect[p] != suspect {
            self.suspect[p] = suspect;
            if suspect {
                self.suspects.push(p as u32);
            } else {
                self.suspects.retain(|&q| q as usize != p);
            }
        }
    }

    /// Sets the load figures and distinct active blocks of the worker in `slot`.
    pub fn set_load(&mut self, slot: WorkerSlot, load: &LoadFigures, blocks_unique: f64) {
        if let Some(p) = self.pos(slot) {
            self.set_load_at(p, load, blocks_unique);
        }
    }

    pub(crate) fn set_load_at(&mut self, p: usize, load: &LoadFigures, blocks_unique: f64) {
        self.active_requests[p] = load.active_requests;
        self.prefill_tokens[p] = load.prefill_tokens;
        self.blocks_total[p] = load.blocks_total;
        self.output_blocks[p] = load.output_blocks;
        self.blocks_unique[p] = blocks_unique;
    }

    /// The load figures of position `p` (zero if out of range).
    pub(crate) fn load_at(&self, p: usize) -> LoadFigures {
        LoadFigures {
            active_requests: self.active_requests.get(p).copied().unwrap_or(0),
            prefill_tokens: self.prefill_tokens.get(p).copied().unwrap_or(0.0),
            blocks_total: self.blocks_total.get(p).copied().unwrap_or(0.0),
            output_blocks: self.output_blocks.get(p).copied().unwrap_or(0.0),
        }
    }
}
