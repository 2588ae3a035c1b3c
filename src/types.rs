//! Vocabulary shared by every module: worker slots, cache tiers, roles, device classes.
//!
//! These types carry no behaviour beyond parsing and display. A worker is known to the
//! outside world by a string id (`WorkerSpec::id`) and inside the engine by a dense
//! [`WorkerSlot`], which indexes per-worker arrays and is packed into index entries.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Dense internal handle of a registered worker. Slots are reused after a worker is
/// removed, so every structure keyed by slot must be cleared on removal (the index does
/// this in O(1) with generations, see `index`).
pub type WorkerSlot = u16;

/// Largest number of worker slots the engine can address (slot is 16 bits).
pub const MAX_WORKER_SLOTS: usize = u16::MAX as usize;

/// Where a cached block lives on a worker. Ordered fastest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// GPU / accelerator memory.
    Device = 0,
    /// CPU memory of the worker.
    Host = 1,
    /// Local disk of the worker.
    Disk = 2,
}

impl Tier {
    /// All tiers, fastest first.
    pub const ALL: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];

    /// Wire / packed representation.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Inverse of [`Tier::as_u8`]; `None` for unknown values.
    pub fn from_u8(v: u8) -> Option<Tier> {
        match v {
            0 => Some(Tier::Device),
            1 => Some(Tier::Host),
            2 => Some(Tier::Disk),
            _ => None,
        }
    }

    /// Lower-case name as used in JSON and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a worker does in the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Does prefill and decode (plain fleet).
    #[default]
    Aggregated = 0,
    /// Prefill-only worker of a disaggregated fleet.
    Prefill = 1,
    /// Decode-only worker of a disaggregated fleet.
    Decode = 2,
    /// A shared KV store (e.g. LMCache / Mooncake store) that every worker of the model
    /// can load from. Never a routing target; its blocks count as `shared` overlap.
    Shared = 3,
}

impl Role {
    pub fn from_u8(v: u8) -> Option<Role> {
        match v {
            0 => Some(Role::Aggregated),
            1 => Some(Role::Prefill),
            2 => Some(Role::Decode),
            3 => Some(Role::Shared),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Shared => "shared",
        }
    }
}

/// Hardware class of a worker, used by `device-aware-weighted` routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    /// GPU or other accelerator ("non-CPU" in DESIGN §1).
    #[default]
    Gpu = 0,
    /// CPU-only worker.
    Cpu = 1,
}

impl DeviceClass {
    pub fn from_u8(v: u8) -> Option<DeviceClass> {
        match v {
            0 => Some(DeviceClass::Gpu),
            1 => Some(DeviceClass::Cpu),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceClass::Gpu => "gpu",
            DeviceClass::Cpu => "cpu",
        }
    }
}

/// Inclusive range of data-parallel ranks a worker serves (`[0, 0]` for a worker
/// without data parallelism).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DpRanks {
    pub lo: u32,
    pub hi: u32,
}

impl DpRanks {
    /// Intersection with the inclusive bounds `[lo, hi]`, if any.
    pub fn intersect(self, lo: u32, hi: u32) -> Option<DpRanks> {
        let l = self.lo.max(lo);
        let h = self.hi.min(hi);
        (l <= h).then_some(DpRanks { lo: l, hi: h })
    }
}

/// Everything a worker declares about itself when it registers (HTTP `POST /v1/workers`
/// or the binary handshake).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    /// External id, unique in the fleet (the id rule of `crate::ids`: 1..=128 bytes of `[A-Za-z0-9._:@+=-]`).
    pub id: String,
    #[serde(default)]
    pub role: Role,
    #[serde(default)]
    pub device: DeviceClass,
    /// Model served; requests only reach workers of their model. Empty = default model.
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub dp_ranks: DpRanks,
    /// A worker tainted X is only eligible for requests that tolerate X.
    #[serde(default)]
    pub taints: Vec<String>,
    /// Topology domain (zone / rack / NVLink island); empty = none.
    #[serde(default)]
    pub topology: String,
    /// KV capacity in blocks; also the cap on blocks indexed for this worker.
    #[serde(default = "default_capacity_blocks")]
    pub capacity_blocks: u64,
    /// Instance epoch: a new epoch on re-registration clears the worker's blocks.
    #[serde(default)]
    pub epoch: u64,
    /// Throughput of this worker relative to one GPU worker (1.0), when it declares
    /// one: the `kv` cost of a worker is multiplied by `1 / throughput_weight` (with
    /// `weigh_by_throughput`). None: 1.0 for a GPU worker, `1 / cuda_to_cpu_ratio` for
    /// a CPU worker. HTTP and TOML only (the binary handshake does not carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput_weight: Option<f64>,
    /// Upstream OpenAI-compatible base URL (`http://host:port`) the proxy forwards this
    /// worker's requests to (`crate::proxy`); none = not proxied to (route-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// `validate` rejects a non-finite `throughput_weight`, so equality is reflexive.
impl Eq for WorkerSpec {}

/// Capacity assumed when a worker does not declare one.
pub fn default_capacity_blocks() -> u64 {
    1 << 20
}

impl WorkerSpec {
    /// A GPU aggregated worker of the default model with default settings.
    pub fn new(id: impl Into<String>) -> WorkerSpec {
        WorkerSpec {
            id: id.into(),
            role: Role::Aggregated,
            device: DeviceClass::Gpu,
            model: String::new(),
            dp_ranks: DpRanks::default(),
            taints: Vec::new(),
            topology: String::new(),
            capacity_blocks: default_capacity_blocks(),
            epoch: 0,
            throughput_weight: None,
            url: None,
        }
    }

    /// Checks the fields that cannot be expressed by types alone.
    pub fn validate(&self) -> Result<(), String> {
        crate::ids::check("worker id", &self.id)?;
        if self.model.len() > 256 || self.topology.len() > 256 {
            return Err("model and topology must be at most 256 bytes".into());
        }
        if self.taints.len() > 64 || self.taints.iter().any(|t| t.is_empty() || t.len() > 128) {
            return Err("at most 64 taints of 1..=128 bytes each".into());
        }
        if self.dp_ranks.lo > self.dp_ranks.hi {
            return Err("dp_ranks.lo must be <= dp_ranks.hi".into());
        }
        if self.capacity_blocks == 0 {
            return Err("capacity_blocks must be > 0".into());
        }
        if let Some(t) = self.throughput_weight {
            if !(t.is_finite() && (1e-6..=1e6).contains(&t)) {
                return Err("throughput_weight must be in [1e-6, 1e6]".into());
            }
        }
        if let Some(u) = &self.url {
            crate::proxy::url::UpstreamUrl::parse(u)?;
        }
        Ok(())
    }
}

/// Per-worker prefix overlap of one request, in blocks (DESIGN §1 "Cache tiers and
/// overlap"): `device` consecutive blocks from the start on device, then `host` further
/// blocks on host (or better), then `disk` further blocks on disk (or better), then
/// `shared` further blocks present in the fleet's shared cache.
///
/// `repr(C)`: the selection kernel reads four `u32`s per worker in this order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[repr(C)]
pub struct Overlap {
    pub device: u32,
    pub host: u32,
    pub disk: u32,
    pub shared: u32,
}

impl Overlap {
    /// Blocks the worker holds itself (all tiers, without the shared cache).
    pub fn own(&self) -> u32 {
        self.device
            .saturating_add(self.host)
            .saturating_add(self.disk)
    }
}
