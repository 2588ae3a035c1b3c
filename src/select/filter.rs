//! Hard filters applied before scoring (DESIGN §1 "Selection"), each with a
//! [`Rejection`] reason for error messages and `explain`.
//!
//! A worker is considered by a stage only if it serves the request's model and its
//! role belongs to the stage's pool; those two conditions *define* the pool and are
//! not counted as rejections. Within the pool, checks run in this order and the first
//! failing one is the reason: pin, liveness, allow-list, data-parallel ranks, taints,
//! topology (`restrict`), busy. Busy runs last so that "every worker that passed
//! everything else is busy" can be reported as `AllBusy`; pin runs first so that a
//! pin naming no worker at all is told apart from a pinned worker that is filtered.

use super::cost::CostModel;
use super::fleet::Fleet;
use super::{Fig, Stage};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Inclusive data-parallel rank bounds `lo..=hi` a request accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DpBounds {
    pub lo: u32,
    pub hi: u32,
}

/// The request's hard constraints on which workers may serve it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Filters {
    /// Model requested; exact match against `WorkerSpec::model` (empty = default model).
    pub model: String,
    /// Only workers whose id is listed are eligible.
    pub allow: Option<Vec<String>>,
    /// Only the worker with this id is eligible. Applies to the single stage, and to
    /// the decode stage of a disaggregated decision (the prefill worker is still chosen
    /// by cost). Required by mode `direct`.
    pub pin: Option<String>,
    /// The worker's dp ranks must intersect these bounds; the decision's `dp_rank` is
    /// the lowest rank of the intersection.
    pub dp: Option<DpBounds>,
    /// Taints the request tolerates: a worker is eligible only if every one of its
    /// taints is listed here.
    pub tolerations: Vec<String>,
}

/// Why a worker was not eligible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rejection {
    /// Serves another model (defines the pool; not counted).
    Model,
    /// Role not in the stage's pool, e.g. a shared cache (defines the pool; not counted).
    Role,
    /// The request is pinned to another worker.
    Pin,
    /// Heartbeat timed out or not connected.
    NotLive,
    /// Not in the request's allow-list.
    AllowList,
    /// No dp rank within the request's bounds.
    DpRanks,
    /// Carries a taint the request does not tolerate.
    Taint,
    /// Outside the prefill worker's topology domain (`topology_policy = restrict`).
    Topology,
    /// Active KV blocks / capacity at or above `busy_threshold`.
    Busy,
}

impl Rejection {
    /// Every reason, in check order after the pool conditions.
    pub const ALL: [Rejection; 9] = [
        Rejection::Model,
        Rejection::Role,
        Rejection::Pin,
        Rejection::NotLive,
        Rejection::AllowList,
        Rejection::DpRanks,
        Rejection::Taint,
        Rejection::Topology,
        Rejection::Busy,
    ];

    /// Short human-readable phrase ("not live", "busy", ...).
    pub fn describe(self) -> &'static str {
        match self {
            Rejection::Model => "other model",
            Rejection::Role => "role not in pool",
            Rejection::Pin => "not the pinned worker",
            Rejection::NotLive => "not live",
            Rejection::AllowList => "not in allow-list",
            Rejection::DpRanks => "no dp rank in bounds",
            Rejection::Taint => "untolerated taint",
            Rejection::Topology => "outside topology domain",
            Rejection::Busy => "busy",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// How many workers each [`Rejection`] removed from a stage's pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RejectionCounts {
    counts: [u32; 9],
}

impl RejectionCounts {
    /// Workers rejected for `r`.
    pub fn get(&self, r: Rejection) -> u32 {
        self.counts[r as usize]
    }

    /// Records one rejection.
    #[inline]
    pub fn add(&mut self, r: Rejection) {
        let c = &mut self.counts[r as usize];
        *c = c.saturating_add(1);
    }

    /// Total rejections recorded.
    pub fn total(&self) -> u32 {
        self.counts.iter().fold(0u32, |a, &c| a.saturating_add(c))
    }
}

impl fmt::Display for RejectionCounts {
    /// `"2 not live, 1 busy"`; `"no workers"` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for r in Rejection::ALL {
            let n = self.get(r);
            if n > 0 {
                if !first {
                    f.write_str(", ")?;
                }
                write!(f, "{n} {}", r.describe())?;
                first = false;
            }
        }
        if first {
            f.write_str("no workers")?;
        }
        Ok(())
    }
}

/// Outcome of filtering one worker for one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Eval {
    /// Not in the stage's pool (other model or role); not a rejection.
    Skip,
    /// A Prefill/Decode worker of the model seen while probing for an aggregated
    /// fleet: the fleet is disaggregated, the probe stops.
    Split,
    /// In the pool but filtered out.
    Reject(Rejection),
    /// Eligible, serving at this dp rank.
    Pass(u32),
}

/// The hard filters of one stage, resolved once per decision against the [`Fleet`]'s
/// interned names, so the per-worker check is a handful of integer comparisons.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StageFilter<'a> {
    pub fleet: &'a Fleet,
    pub stage: Stage,
    /// Interned model ([`UNKNOWN`]: no worker serves it).
    pub model: u32,
    /// Roles whose workers are candidates of this stage.
    pub pool: u8,
    /// Roles that reveal a disaggregated fleet (only when probing the aggregated stage).
    pub split: u8,
    /// The pin as given (error messages) and its interned id.
    pub pin: Option<&'a str>,
    pub pin_id: u32,
    pub allow: Option<&'a [String]>,
    pub dp: Option<DpBounds>,
    pub tolerations: &'a [String],
    /// `tolerations` as a bitmask of the fleet's interned taints.
    pub tolerated: u64,
    /// `topology_policy = restrict`: only workers of this domain (name and id).
    pub domain: Option<(&'a str, u32)>,
    /// `busy_threshold` and the stage cost model whose active-block rule measures load.
    pub busy: Option<(f64, CostModel)>,
}

impl StageFilter<'_> {
    /// Filters worker `i` (its static data in the fleet, its figures in `row`). Pure and
    /// allocation-free.
    #[inline(always)]
    pub fn eval(&self, i: usize, row: &Fig) -> Eval {
        let fleet = self.fleet;
        if fleet.model[i] != self.model {
            return Eval::Skip;
        }
        let bit = fleet.role_bit(i);
        if self.split & bit != 0 {
            return Eval::Split;
        }
        if self.pool & bit == 0 {
            return Eval::Skip;
        }
        if self.pin.is_some() && fleet.id[i] != self.pin_id {
            return Eval::Reject(Rejection::Pin);
        }
        if !row.live {
            return Eval::Reject(Rejection::NotLive);
        }
        if let Some(allow) = self.allow {
            if !allow.contains(&fleet.names[i]) {
                return Eval::Reject(Rejection::AllowList);
            }
        }
        let (lo, hi) = (fleet.dp_lo[i], fleet.dp_hi[i]);
        let dp = match self.dp {
            None => lo,
            Some(b) => {
                let (l, h) = (lo.max(b.lo), hi.min(b.hi));
                if l > h {
                    return Eval::Reject(Rejection::DpRanks);
                }
                l
            }
        };
        if fleet.untolerated(i, self.tolerated, self.tolerations) {
            return Eval::Reject(Rejection::Taint);
        }
        if let Some((_, domain)) = self.domain {
            if fleet.topology[i] != domain {
                return Eval::Reject(Rejection::Topology);
            }
        }
        if let Some((threshold, model)) = &self.busy {
            // blocks / capacity >= threshold, without a division.
            if model.active_blocks(row) >= threshold * fleet.capacity[i] {
                return Eval::Reject(Rejection::Busy);
            }
        }
        Eval::Pass(dp)
    }
}

/// What one stage's filtering saw, for error reporting and fallbacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScanStats {
    /// Workers of the model whose role is in the pool.
    pub in_pool: u32,
    /// Of those, how many passed every filter.
    pub eligible: u32,
    pub rejections: RejectionCounts,
}

impl ScanStats {
    /// Pool workers that are live (whatever the other filters said).
    pub fn live(&self) -> u32 {
        self.in_pool - self.rejections.get(Rejection::NotLive)
    }
}
