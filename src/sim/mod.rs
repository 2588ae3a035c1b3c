//! Fleet simulation model shared by the bundled load tools (DESIGN §4).
//!
//! The load tools replay traces against the router with simulated workers, either in
//! real time over TCP or offline on virtual time. Both use this one model so their
//! numbers are comparable:
//!
//! - [`trace`]: the Mooncake JSONL reader, turning `hash_ids` into router sequence
//!   hashes; [`synth`]: a seeded synthetic workload generator; [`azure`]: synthetic
//!   loads timed and sized by an Azure-format CSV request log.
//! - [`bound`]: the hit-rate upper bound of a workload (one shared unlimited cache).
//! - [`cache`]: one worker's LRU KV cache that emits exactly the events a router needs
//!   to mirror it.
//! - [`timing`]: the prefill / decode time model.
//! - [`worker`]: a discrete-event simulated worker (prefill queue, decode batch).
//! - [`driver`]: the offline driver over virtual time, talking to a router through
//!   the [`driver::RouterApi`] trait.
//! - [`router_impls`]: the engine in-process and a running service over TCP as
//!   [`driver::RouterApi`]s.
//! - [`report`]: the per-run report, its text table and an SVG chart.
//! - [`openai`], [`agent_api`] and [`live`]: the OpenAI, Anthropic and Responses
//!   shapes and the wall-clock worker state of
//!   `kvroute-sim fleet` (simulated vLLM workers over HTTP).
//! - [`sglang`]: SGLang Model Gateway's `cache_aware` policy as a baseline router.
//! - [`tune`]: the knob search of `kvroute-sim tune` (objective, iterated local search).
//!
//! Everything here is pure and single-threaded: time is virtual (µs), the only I/O is
//! reading a trace file, and a run is deterministic for a given seed.

pub mod agent_api;
pub mod azure;
pub mod bound;
pub mod cache;
pub mod driver;
pub mod live;
pub mod openai;
pub mod report;
pub mod restart_plan;
pub mod router_impls;
pub mod service_restart;
pub mod sglang;
pub mod synth;
pub mod timing;
pub mod trace;
pub mod tune;
pub mod worker;

pub use bound::{hit_rate_bound, Bound};
pub use cache::{CacheEvent, KvCache};
pub use driver::{
    run_offline, FleetSpec, RouteQuery, Routed, RouterApi, SimWorkerSpec, TimedRouter,
};
pub use report::{
    device_table, hit_rate_between, svg_chart, svg_chart_with_bound, table, HitSample, Percentiles,
    Recorder, Report,
};
pub use restart_plan::{RestartPlan, RestartStats, RouterRestart};
pub use router_impls::{EngineRouter, Pace, ServiceRouter};
pub use synth::{generate, LenRange, SynthSpec};
pub use timing::TimingModel;
pub use trace::{mooncake_hashes, parse_mooncake, read_mooncake, TraceError, TraceOptions};
pub use worker::{Outcome, SimWorker, Stage, WorkerStats};

/// One request of a workload, as the simulator and the load tools see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRequest {
    /// Unique request id (`mc-N` for trace lines, `syn-N` for synthetic requests).
    pub id: String,
    /// Arrival time in µs of virtual time (already divided by the speed factor).
    pub arrival_us: u64,
    /// Prompt length in tokens.
    pub input_tokens: u32,
    /// Tokens to generate (the simulator generates at least one).
    pub output_tokens: u32,
    /// Router sequence hashes of the prompt's complete blocks, in order.
    pub hashes: Vec<u64>,
    /// Conversation the request belongs to, if the workload knows it.
    pub session: Option<u64>,
}
