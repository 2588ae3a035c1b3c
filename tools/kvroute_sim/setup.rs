//! Command-line pieces shared by every subcommand: the workload (a Mooncake trace or a
//! synthetic load), the simulated fleet, and router knobs.
//!
//! Knobs are `key=value` pairs naming `RouterConfig` fields (`overlap_score_credit=0.5`);
//! they are applied to the in-process engine's config and, when the tool spawns a
//! router, passed as the matching `kvroute serve --key-name value` flags, so both paths
//! see the same settings. Unknown keys and bad values are errors, never panics.

use clap::Args;
use kvroute::config::RouterConfig;
use kvroute::sim::azure::{generate_from_rows, read_azure_csv};
use kvroute::sim::{
    generate, read_mooncake, FleetSpec, LenRange, SimRequest, SimWorkerSpec, SynthSpec,
    TimingModel, TraceOptions,
};
use kvroute::types::{DeviceClass, Role};
use std::path::PathBuf;

/// The multi-threaded tokio runtime of `fleet` and `replay`: `threads` workers
/// (`--threads`, at least 1), default the machine's cores.
pub fn tokio_runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime, String> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        rt.worker_threads(n.max(1));
    }
    rt.enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

/// Where the requests come from.
#[derive(Args, Clone, Debug)]
pub struct WorkloadArgs {
    /// Mooncake JSONL trace (`timestamp` or `delay`, `input_length`, `output_length`,
    /// `hash_ids`; 512 tokens per hash id).
    #[arg(long, required_unless_present = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Arrival speed-up: arrival times are divided by this (the load level).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Use at most this many requests.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed of the simulation (timing jitter, router tie-breaks, synthetic load).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Tokens per KV block (router and workers).
    #[arg(long, default_value_t = 128)]
    pub block_size: u32,
    /// Synthetic load instead of a trace (see the --synth-* flags).
    #[arg(long, conflicts_with = "trace")]
    pub synthetic: bool,
    /// Synthetic: requests to generate.
    #[arg(long, default_value_t = 2000)]
    pub synth_requests: usize,
    /// Synthetic: mean arrivals per second (Poisson).
    #[arg(long, default_value_t = 5.0)]
    pub synth_rate: f64,
    /// Synthetic: shared-prefix groups (system prompts).
    #[arg(long, default_value_t = 8)]
    pub synth_groups: u32,
    /// Synthetic: tokens of each group's shared prefix.
    #[arg(long, default_value_t = 2048)]
    pub synth_prefix_tokens: u32,
    /// Synthetic: turns per session, `MIN-MAX`.
    #[arg(long, default_value = "1-4", value_parser = parse_range)]
    pub synth_turns: LenRange,
    /// Synthetic: unique tokens after the prefix in a first prompt, `MIN-MAX`.
    #[arg(long, default_value = "256-2048", value_parser = parse_range)]
    pub synth_suffix_tokens: LenRange,
    /// Synthetic: output tokens per request, `MIN-MAX`.
    #[arg(long, default_value = "64-512", value_parser = parse_range)]
    pub synth_output_tokens: LenRange,
    /// Synthetic: take arrival times and prompt / output lengths from this CSV request
    /// log (columns `TIMESTAMP,ContextTokens,GeneratedTokens`, the Azure LLM inference
    /// trace format); content from the --synth-groups / --synth-prefix-tokens prefixes.
    #[arg(long, requires = "synthetic")]
    pub synth_csv: Option<PathBuf>,
    /// Synthetic: bursts of this many requests sharing a fresh prefix, arriving
    /// together (1 = no bursts; sessions and groups then do not apply).
    #[arg(long, default_value_t = 1)]
    pub synth_burst_size: u32,
    /// Synthetic: a burst's requests arrive within this many ms.
    #[arg(long, default_value_t = 100)]
    pub synth_burst_window_ms: u32,
    /// Cap every request's output tokens (trace or synthetic), as `replay
    /// --max-output-tokens` caps `max_tokens`: an offline run then models the live
    /// benchmark's short answers instead of the trace's long ones.
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
}

/// The simulated fleet.
#[derive(Args, Clone, Debug)]
pub struct FleetArgs {
    /// GPU workers (aggregated).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// CPU workers added to the fleet (slower by the timing model's cpu_slowdown).
    #[arg(long, default_value_t = 0)]
    pub cpu_workers: usize,
    /// KV cache capacity of each worker, in blocks.
    #[arg(long, default_value_t = 100_000)]
    pub capacity_blocks: u64,
    /// A TOML `FleetSpec` (workers with roles, devices, topology; timing) replacing
    /// --workers / --cpu-workers / --capacity-blocks.
    #[arg(long)]
    pub fleet: Option<PathBuf>,
    /// Timing-model overrides as `key=value,...` (TimingModel fields, e.g.
    /// `prefill_us_per_token=40,max_batch=128`).
    #[arg(long, default_value = "")]
    pub timing: String,
    /// The frontend passes each request's true output length as its OSL hint.
    #[arg(long)]
    pub osl_hint: bool,
    /// Offline: the workers publish no KV events; the router sees only its routes
    /// (approximate mode models them unless a knob says `approximate=false`).
    #[arg(long)]
    pub no_events: bool,
}

pub fn parse_range(s: &str) -> Result<LenRange, String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let p = |v: &str| v.trim().parse::<u32>().map_err(|e| format!("{s:?}: {e}"));
    let (min, max) = (p(a)?, p(b)?);
    if min > max {
        return Err(format!("{s:?}: min > max"));
    }
    Ok(LenRange { min, max })
}

impl WorkloadArgs {
    pub fn load(&self) -> Result<Vec<SimRequest>, String> {
        let mut reqs = self.load_uncapped()?;
        if let Some(cap) = self.max_output_tokens {
            for r in &mut reqs {
                r.output_tokens = r.output_tokens.min(cap.max(1));
            }
        }
        Ok(reqs)
    }

    fn load_uncapped(&self) -> Result<Vec<SimRequest>, String> {
        if !(self.speed.is_finite() && self.speed > 0.0) {
            return Err("--speed must be > 0".into());
        }
        if let (true, Some(csv)) = (self.synthetic, &self.synth_csv) {
            let rows = read_azure_csv(csv, self.limit)?;
            let spec = SynthSpec {
                seed: self.seed,
                block_size: self.block_size,
                groups: self.synth_groups,
                prefix_tokens: self.synth_prefix_tokens,
                ..SynthSpec::default()
            };
            return generate_from_rows(&spec, &rows, self.speed);
        }
        if self.synthetic {
            let spec = SynthSpec {
                seed: self.seed,
                requests: self.limit.unwrap_or(self.synth_requests),
                rate_per_s: self.synth_rate * self.speed,
                block_size: self.block_size,
                groups: self.synth_groups,
                prefix_tokens: self.synth_prefix_tokens,
                suffix_tokens: self.synth_suffix_tokens,
                output_tokens: self.synth_output_tokens,
                turns: self.synth_turns,
                burst_size: self.synth_burst_size,
                burst_window_ms: self.synth_burst_window_ms,
                ..SynthSpec::default()
            };
            return generate(&spec);
        }
        let path = self
            .trace
            .as_ref()
            .ok_or("--trace or --synthetic is required")?;
        let opts = TraceOptions {
            block_size: self.block_size,
            speed: self.speed,
            limit: self.limit,
        };
        read_mooncake(path, &opts).map_err(|e| e.to_string())
    }
}

/// Applies `key=value,...` pairs to a serde-serialisable struct through JSON, so any
/// field can be set by name and the struct's own validation still applies.
pub fn apply_pairs<T>(base: &T, pairs: &[(String, String)], what: &str) -> Result<T, String>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut v = serde_json::to_value(base).map_err(|e| e.to_string())?;
    let obj = v.as_object_mut().ok_or("not an object")?;
    for (k, val) in pairs {
        if !obj.contains_key(k) {
            return Err(format!("unknown {what} key {k:?}"));
        }
        let parsed = serde_json::from_str(val).unwrap_or(serde_json::Value::String(val.clone()));
        obj.insert(k.clone(), parsed);
    }
    serde_json::from_value(v).map_err(|e| format!("{what}: {e}"))
}

/// Splits `a=1,b=x` into pairs (empty string → none).
pub fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| format!("expected key=value, got {p:?}"))
        })
        .collect()
}

/// A router configuration with `pairs` applied and validated.
pub fn router_config(block_size: u32, pairs: &[(String, String)]) -> Result<RouterConfig, String> {
    let base = RouterConfig {
        block_size,
        ..RouterConfig::default()
    };
    let cfg: RouterConfig = apply_pairs(&base, pairs, "router knob")?;
    cfg.validate()?;
    Ok(cfg)
}

impl FleetArgs {
    pub fn fleet(&self, block_size: u32) -> Result<FleetSpec, String> {
        let mut fleet = match &self.fleet {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                toml::from_str::<FleetSpec>(&text).map_err(|e| format!("{}: {e}", p.display()))?
            }
            None => {
                let mut f = FleetSpec::uniform(self.workers, self.capacity_blocks);
                f.workers
                    .extend((0..self.cpu_workers).map(|i| SimWorkerSpec {
                        id: format!("cpu{i}"),
                        device: DeviceClass::Cpu,
                        role: Role::Aggregated,
                        topology: String::new(),
                        capacity_blocks: self.capacity_blocks,
                    }));
                f
            }
        };
        fleet.block_size = block_size;
        fleet.osl_hint |= self.osl_hint;
        fleet.events &= !self.no_events;
        let pairs = parse_pairs(&self.timing)?;
        fleet.timing = apply_pairs::<TimingModel>(&fleet.timing, &pairs, "timing")?;
        fleet.validate()?;
        Ok(fleet)
    }

    /// Whether the fleet mixes CPU and GPU workers.
    pub fn mixed(fleet: &FleetSpec) -> bool {
        let cpu = fleet.workers.iter().any(|w| w.device == DeviceClass::Cpu);
        let gpu = fleet.workers.iter().any(|w| w.device == DeviceClass::Gpu);
        cpu && gpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_apply_by_name_and_reject_unknown_keys() {
        let p = parse_pairs("overlap_score_credit=0.5, router_temperature=0.1").unwrap();
        let c = router_config(128, &p).unwrap();
        assert_eq!(c.overlap_score_credit, 0.5);
        assert_eq!(c.router_temperature, 0.1);
        assert!(router_config(128, &parse_pairs("nope=1").unwrap()).is_err());
        assert!(router_config(128, &parse_pairs("overlap_score_credit=7").unwrap()).is_err());
        assert!(parse_pairs("a").is_err());
        assert_eq!(parse_range("3-9").unwrap(), LenRange { min: 3, max: 9 });
        assert!(parse_range("9-3").is_err());
    }
}
