//! The cost of placing a request on a worker (DESIGN §1 "Cost"), lower is better.
//!
//! ```text
//! prefill_blocks = ((track_prefill_tokens ? load.prefill_tokens : 0) + input_tokens) / block_size
//! adjusted       = max(prefill_blocks - credit*device - host_w*host - disk_w*disk
//!                      - shared_mult*shared, 0)
//! held           = assume_device_reuse ? max(reuse, device) : reuse
//! decode_blocks  = track_active_blocks ?
//!                    (assume_kv_reuse ? blocks_unique + (prompt_blocks - min(held, prompt_blocks))
//!                                     : blocks_total + prompt_blocks)
//!                    + (track_output_blocks ? output_blocks : 0)
//!                  : 0
//! slowness       = weigh_by_throughput ? (throughput_weight declared ? 1 / throughput_weight
//!                                         : cpu ? cuda_to_cpu_ratio : 1)
//!                                      : 1
//! cost           = (prefill_load_scale * adjusted + decode_blocks) * slowness
//! ```
//!
//! With `assume_kv_reuse` the request adds only the blocks that the worker's *active
//! requests* do not already hold (`reuse`), as DESIGN §1 and Dynamo's active-sequence
//! accounting do: a block of the device cache that a new request pins becomes real
//! decode load, and its cache value is already credited once, in the prefill term.
//! `assume_device_reuse` restores the earlier form that also subtracted the device
//! overlap here (crediting a cached prefix twice); docs/ROUTING.md has the A/B.
//!
//! `slowness` turns blocks of work into GPU-time: the same prompt costs a CPU worker
//! `cuda_to_cpu_ratio` times more, so `kv` sends a CPU worker work only when the GPU
//! workers are that much busier. An all-GPU fleet multiplies by exactly 1.
//!
//! A suspect worker (its index state has a gap) gets no cache credit: its overlap is
//! treated as all zero, since the router cannot trust what it believes is cached there.
//! The functions are `#[inline]` and branch only on configuration, so the selection
//! loop over thousands of workers stays cheap.

use super::{Fig, RequestShape, WorkerRow};
use crate::config::RouterConfig;
use crate::types::Overlap;
use serde::Serialize;

/// The terms of the cost of one worker, as reported by `explain`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CostTerms {
    /// Prompt-side work in blocks: in-flight prompt tokens (if tracked) plus this
    /// request's input tokens, divided by `block_size`.
    pub prefill_blocks: f64,
    /// The overlap that earned credit (all zero for a suspect worker).
    pub overlap: Overlap,
    /// `prefill_blocks` minus the cache credit, floored at zero.
    pub adjusted_prefill: f64,
    /// Active KV blocks of the worker plus the blocks this request would add.
    pub decode_blocks: f64,
    /// `(prefill_load_scale * adjusted_prefill + decode_blocks) * slowness` (plus the
    /// topology penalty in a decode stage).
    pub cost: f64,
}

/// The overlap the cost may credit: zero for a suspect worker.
#[inline]
pub(crate) fn effective_overlap(row: &Fig) -> Overlap {
    if row.suspect {
        Overlap::default()
    } else {
        row.overlap
    }
}

/// Cost terms of placing the request `req` on the worker `row` under `cfg`.
///
/// `cfg` is the configuration of the stage being scored (the base config for a single
/// stage, `prefill_stage()` / `decode_stage()` for the disaggregated stages).
#[inline]
pub fn cost_terms(cfg: &RouterConfig, req: &RequestShape, row: &WorkerRow) -> CostTerms {
    CostModel::new(cfg, req).terms(&row.fig())
}

/// The cost formula with everything that does not depend on the worker resolved once
/// per stage (so the per-worker work is a few multiply-adds, no division).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CostModel {
    pub inv_block_size: f64,
    pub input_tokens: f64,
    pub prompt_blocks: u32,
    pub track_prefill_tokens: bool,
    device_w: f64,
    host_w: f64,
    disk_w: f64,
    shared_w: f64,
    pub scale: f64,
    pub track_active_blocks: bool,
    pub assume_kv_reuse: bool,
    pub track_output_blocks: bool,
    /// `assume_device_reuse`.
    pub device_reuse: bool,
    /// `weigh_by_throughput`, and the slowness of a CPU worker.
    pub weigh: bool,
    pub cpu_slowness: f64,
}

impl CostModel {
    pub fn new(cfg: &RouterConfig, req: &RequestShape) -> CostModel {
        CostModel {
            inv_block_size: 1.0 / f64::from(cfg.block_size.max(1)),
            input_tokens: f64::from(req.input_tokens),
            prompt_blocks: req.prompt_blocks,
            track_prefill_tokens: cfg.track_prefill_tokens,
            device_w: cfg.overlap_score_credit,
            host_w: cfg.host_cache_hit_weight,
            disk_w: cfg.disk_cache_hit_weight,
            shared_w: cfg.shared_cache_multiplier,
            scale: cfg.prefill_load_scale,
            track_active_blocks: cfg.track_active_blocks,
            assume_kv_reuse: cfg.assume_kv_reuse,
            track_output_blocks: cfg.track_output_blocks,
            device_reuse: cfg.assume_device_reuse,
            weigh: cfg.weigh_by_throughput,
            cpu_slowness: cfg.cuda_to_cpu_ratio,
        }
    }

    /// How many times slower than a GPU worker a worker is (`cpu`, declared
    /// `throughput` or 0), i.e. the factor of its cost; exactly 1.0 for a GPU worker
    /// without a declared throughput or without `weigh_by_throughput`.
    #[inline(always)]
    pub fn slowness(&self, cpu: bool, throughput: f64) -> f64 {
        if !self.weigh {
            1.0
        } else if throughput > 0.0 {
            1.0 / throughput
        } else if cpu {
            self.cpu_slowness
        } else {
            1.0
        }
    }

    /// Decode-side blocks the worker holds *without* this request, per the active-block
    /// rule (distinct blocks with `assume_kv_reuse`, else the per-request total; plus
    /// output placeholders with `track_output_blocks`). Used for the cost and for the
    /// `busy_threshold` filter.
    #[inline(always)]
    pub fn active_blocks(&self, row: &Fig) -> f64 {
        let held = if self.assume_kv_reuse {
            row.blocks_unique
        } else {
            row.load.blocks_total
        };
        let output = if self.track_output_blocks {
            row.load.output_blocks
        } else {
            0.0
        };
        held + output
    }

    /// Credit weights of the device, host, disk and shared overlaps.
    pub fn weights(&self) -> [f64; 4] {
        [self.device_w, self.host_w, self.disk_w, self.shared_w]
    }

    /// The cache credit of an (effective) overlap.
    #[inline(always)]
    pub fn credit(&self, overlap: &Overlap) -> f64 {
        self.device_w * f64::from(overlap.device)
            + self.host_w * f64::from(overlap.host)
            + self.disk_w * f64::from(overlap.disk)
            + self.shared_w * f64::from(overlap.shared)
    }

    /// Blocks the request adds on a worker with `reuse` blocks in active requests and
    /// `device` overlap (before `track_active_blocks`); the device overlap counts only
    /// with `assume_device_reuse`.
    #[inline(always)]
    pub fn added(&self, reuse: u32, device: u32) -> u32 {
        if self.assume_kv_reuse {
            let device = if self.device_reuse { device } else { 0 };
            let held = reuse.max(device);
            self.prompt_blocks - held.min(self.prompt_blocks)
        } else {
            self.prompt_blocks
        }
    }

    /// The cost terms of one worker.
    #[inline(always)]
    pub fn terms(&self, row: &Fig) -> CostTerms {
        let overlap = effective_overlap(row);
        let queued = if self.track_prefill_tokens {
            row.load.prefill_tokens
        } else {
            0.0
        };
        let prefill_blocks = (queued + self.input_tokens) * self.inv_block_size;
        let credit = self.credit(&overlap);
        let adjusted_prefill = (prefill_blocks - credit).max(0.0);
        let decode_blocks = if self.track_active_blocks {
            let added = self.added(row.reuse_blocks, overlap.device);
            self.active_blocks(row) + f64::from(added)
        } else {
            0.0
        };
        CostTerms {
            prefill_blocks,
            overlap,
            adjusted_prefill,
            decode_blocks,
            cost: (self.scale * adjusted_prefill + decode_blocks)
                * self.slowness(row.cpu, row.throughput),
        }
    }
}

/// Scores candidates of one stage: the stage's cost plus the topology penalty for
/// decode workers outside the prefill worker's domain (`topology_policy = prefer`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scorer<'a> {
    pub model: CostModel,
    /// `Some((topology ids of the rows, domain id, penalty))` when cross-domain
    /// candidates pay `penalty`.
    pub prefer: Option<(&'a [u32], u32, f64)>,
}

impl Scorer<'_> {
    /// Topology penalty of worker `i` (0 when not applicable).
    #[inline]
    pub fn penalty(&self, i: usize) -> f64 {
        match self.prefer {
            Some((topo, domain, penalty)) if topo.get(i) != Some(&domain) => penalty,
            _ => 0.0,
        }
    }

    /// Cost terms of worker `i`, with the topology penalty folded into `cost`.
    #[inline]
    pub fn terms(&self, i: usize, row: &Fig) -> CostTerms {
        let mut t = self.model.terms(row);
        t.cost += self.penalty(i);
        t
    }

    /// The value selection compares. Non-finite costs (impossible with sane load
    /// figures) are mapped to `f64::MAX` so they lose without poisoning min/max.
    #[inline(always)]
    pub fn cost(&self, i: usize, row: &Fig) -> f64 {
        let c = self.model.terms(row).cost + self.penalty(i);
        if c.is_finite() {
            c
        } else {
            f64::MAX
        }
    }
}
