//! Tests of `select`, split by topic; this file holds the fleet-building helpers.

mod affinity;
mod cost;
mod disagg;
mod filter;
mod modes;
mod policies;
mod routed;
mod view;

use super::*;
use crate::config::{Mode, RouterConfig};
use crate::types::{DeviceClass, DpRanks, Overlap, Role, WorkerSpec};
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// One test worker: a spec plus the per-request figures of a [`WorkerRow`].
#[derive(Clone, Debug)]
pub(super) struct W {
    pub spec: WorkerSpec,
    pub live: bool,
    pub suspect: bool,
    pub overlap: Overlap,
    pub reuse: u32,
    pub load: LoadFigures,
    pub unique: f64,
}

impl W {
    /// A live, idle, aggregated GPU worker of the default model with no overlap.
    pub fn new(id: &str) -> W {
        W {
            spec: WorkerSpec::new(id),
            live: true,
            suspect: false,
            overlap: Overlap::default(),
            reuse: 0,
            load: LoadFigures::default(),
            unique: 0.0,
        }
    }
    pub fn role(mut self, r: Role) -> W {
        self.spec.role = r;
        self
    }
    pub fn cpu(mut self) -> W {
        self.spec.device = DeviceClass::Cpu;
        self
    }
    pub fn model(mut self, m: &str) -> W {
        self.spec.model = m.into();
        self
    }
    pub fn dp(mut self, lo: u32, hi: u32) -> W {
        self.spec.dp_ranks = DpRanks { lo, hi };
        self
    }
    pub fn taint(mut self, t: &str) -> W {
        self.spec.taints.push(t.into());
        self
    }
    pub fn topo(mut self, t: &str) -> W {
        self.spec.topology = t.into();
        self
    }
    pub fn cap(mut self, c: u64) -> W {
        self.spec.capacity_blocks = c;
        self
    }
    pub fn dead(mut self) -> W {
        self.live = false;
        self
    }
    pub fn suspect(mut self) -> W {
        self.suspect = true;
        self
    }
    /// Device-tier overlap.
    pub fn dev(mut self, blocks: u32) -> W {
        self.overlap.device = blocks;
        self
    }
    pub fn ov(mut self, o: Overlap) -> W {
        self.overlap = o;
        self
    }
    pub fn reuse(mut self, r: u32) -> W {
        self.reuse = r;
        self
    }
    pub fn unique(mut self, u: f64) -> W {
        self.unique = u;
        self
    }
    pub fn total(mut self, t: f64) -> W {
        self.load.blocks_total = t;
        self
    }
    pub fn active(mut self, a: u32) -> W {
        self.load.active_requests = a;
        self
    }
    pub fn queued(mut self, tokens: f64) -> W {
        self.load.prefill_tokens = tokens;
        self
    }
    pub fn output(mut self, b: f64) -> W {
        self.load.output_blocks = b;
        self
    }
    pub fn row(&self, slot: u16) -> WorkerRow<'_> {
        WorkerRow {
            slot,
            spec: &self.spec,
            live: self.live,
            suspect: self.suspect,
            overlap: self.overlap,
            reuse_blocks: self.reuse,
            load: self.load,
            blocks_unique: self.unique,
        }
    }
}

/// Rows of `ws`, slot = position.
pub(super) fn rows(ws: &[W]) -> Vec<WorkerRow<'_>> {
    ws.iter()
        .enumerate()
        .map(|(i, w)| w.row(i as u16))
        .collect()
}

/// Everything of a [`RouteInput`] except the workers.
#[derive(Clone, Debug)]
pub(super) struct Case {
    pub cfg: RouterConfig,
    pub mode: Mode,
    pub req: RequestShape,
    pub filters: Filters,
    pub prefill_failed: bool,
    pub explain: bool,
}

impl Case {
    /// kv mode, default config, a 10-block (1,280-token) prompt, no filters.
    pub fn new() -> Case {
        Case {
            cfg: RouterConfig::default(),
            mode: Mode::Kv,
            req: RequestShape::new(1280, 128),
            filters: Filters::default(),
            prefill_failed: false,
            explain: false,
        }
    }
    pub fn mode(mut self, m: Mode) -> Case {
        self.mode = m;
        self
    }
    pub fn cfg(mut self, f: impl FnOnce(&mut RouterConfig)) -> Case {
        f(&mut self.cfg);
        self
    }
    pub fn filters(mut self, f: impl FnOnce(&mut Filters)) -> Case {
        f(&mut self.filters);
        self
    }
    pub fn req(mut self, input_tokens: u32) -> Case {
        self.req = RequestShape::new(input_tokens, self.cfg.block_size);
        self
    }
    pub fn explain(mut self) -> Case {
        self.explain = true;
        self
    }
    pub fn prefill_failed(mut self) -> Case {
        self.prefill_failed = true;
        self
    }

    /// Decides with the given generator and cursor.
    pub fn decide_with(
        &self,
        ws: &[W],
        rng: &mut SmallRng,
        rr: &mut RrState,
    ) -> Result<Decision, RouteError> {
        let rows = rows(ws);
        let input = RouteInput {
            cfg: &self.cfg,
            mode: self.mode,
            req: self.req,
            filters: &self.filters,
            workers: &rows,
            fleet: None,
            prefill_failed: self.prefill_failed,
            explain: self.explain,
        };
        decide(&input, rng, rr)
    }

    /// Decides once with a fixed seed.
    pub fn decide(&self, ws: &[W]) -> Result<Decision, RouteError> {
        self.decide_with(ws, &mut SmallRng::seed_from_u64(7), &mut RrState::default())
    }

    /// How often each worker is chosen as decode worker over `n` decisions.
    pub fn frequencies(&self, ws: &[W], n: u32, seed: u64) -> Vec<u32> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut rr = RrState::default();
        let mut counts = vec![0u32; ws.len()];
        for _ in 0..n {
            let d = self.decide_with(ws, &mut rng, &mut rr).unwrap();
            counts[d.decode_worker as usize] += 1;
        }
        counts
    }
}

/// Cost terms of `w` under `cfg` for `req`.
pub(super) fn terms(cfg: &RouterConfig, req: RequestShape, w: &W) -> CostTerms {
    cost_terms(cfg, &req, &w.row(0))
}

/// The worked example of DESIGN §1: a new 10-block request,
/// workers with active decode loads 10 / 5 / 9 blocks (none of them this request's
/// blocks) and cached device prefixes 2 / 5 / 8. cost = (10 - overlap) + (active + 10):
/// w1 8 + 20 = 28, w2 5 + 15 = 20 (chosen), w3 2 + 19 = 21.
pub(super) fn worked_example() -> Vec<W> {
    vec![
        W::new("w1").dev(2).unique(10.0),
        W::new("w2").dev(5).unique(5.0),
        W::new("w3").dev(8).unique(9.0),
    ]
}

/// The worked example as it was reached before DESIGN §1 deduplicated only active blocks (`assume_device_reuse`):
/// decode = active + blocks not already held (max(reuse, device overlap)):
/// w1 2 + (10 - 2) = 10, w2 0 + (10 - 5) = 5, w3 7 + (10 - 8) = 9 → 18 / 10 / 11.
pub(super) fn worked_example_device_reuse() -> Vec<W> {
    vec![
        W::new("w1").dev(2).unique(2.0).reuse(2),
        W::new("w2").dev(5),
        W::new("w3").dev(8).unique(7.0).reuse(7),
    ]
}
