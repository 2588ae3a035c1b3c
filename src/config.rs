//! Routing knobs (DESIGN §1) with their defaults.
//!
//! `RouterConfig` is plain data: serde-deserialisable from the `[router]` table of the
//! service's TOML file, overridable by flags and environment variables, and passed by
//! reference to the pure scoring code. `validate` rejects values the cost function
//! cannot use, so the engine never has to.

use serde::{Deserialize, Serialize};

/// How in-flight prefill work is counted (DESIGN §1 "Active load model").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PrefillLoadModel {
    /// Each request's effective ISL counts in full until its first token.
    #[default]
    Full,
    /// The oldest active prefill on each worker decays linearly over its predicted
    /// duration (predictor fitted online, fixed linear model as fallback).
    Predicted,
}

/// Routing mode of a request (DESIGN §1 "Selection").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Cost = prefill work not covered by cache + decode load.
    #[default]
    Kv,
    Random,
    RoundRobin,
    /// The caller names the worker (`pin`).
    Direct,
    /// Fewest in-flight requests.
    LeastLoaded,
    /// CPU vs non-CPU groups weighted by throughput, then least-loaded inside.
    DeviceAwareWeighted,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::Kv,
        Mode::Random,
        Mode::RoundRobin,
        Mode::Direct,
        Mode::LeastLoaded,
        Mode::DeviceAwareWeighted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Kv => "kv",
            Mode::Random => "random",
            Mode::RoundRobin => "round-robin",
            Mode::Direct => "direct",
            Mode::LeastLoaded => "least-loaded",
            Mode::DeviceAwareWeighted => "device-aware-weighted",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.iter().copied().find(|m| m.name() == s)
    }

    pub fn as_u8(self) -> u8 {
        self as u8
    }

    pub fn from_u8(v: u8) -> Option<Mode> {
        Mode::ALL.get(v as usize).copied()
    }
}

/// How the decode stage of a disaggregated request treats the prefill worker's
/// topology domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TopologyPolicy {
    /// Ignore topology.
    #[default]
    None,
    /// Only decode workers in the prefill worker's domain are eligible.
    Restrict,
    /// Decode workers outside the domain pay `topology_penalty` extra cost (blocks).
    Prefer,
}

/// Largest `speculative_max_blocks` (about 100 bytes per entry: 1.6 GB per shard).
pub const MAX_SPECULATIVE_BLOCKS: usize = 1 << 24;

/// Largest `affinity_max_entries` (8 bytes per entry: 128 MiB).
pub const MAX_AFFINITY_ENTRIES: usize = 1 << 24;

/// Largest `lookahead_tokens`.
pub const MAX_LOOKAHEAD_TOKENS: u32 = 1024;

/// Largest `affinity_slack`: the affinity worker wins up to 11 times the lowest cost.
pub const MAX_AFFINITY_SLACK: f64 = 10.0;

/// Largest `session_max_entries` (16 bytes per entry: 64 MiB).
pub const MAX_SESSION_ENTRIES: usize = 1 << 22;

/// Every routing knob. Field docs state the default and meaning; docs/CONFIGURATION.md repeats them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Tokens per KV block. Default 128.
    pub block_size: u32,
    /// Default routing mode when a request names none. Default `kv`.
    pub mode: Mode,
    /// Credit per device-tier overlapping block, in [0,1]. Default 1.0.
    pub overlap_score_credit: f64,
    /// Credit per host-tier overlapping block. Default 0.75.
    pub host_cache_hit_weight: f64,
    /// Credit per disk-tier overlapping block. Default 0.25.
    pub disk_cache_hit_weight: f64,
    /// Credit per block loadable from the shared cache. Default 0.5.
    pub shared_cache_multiplier: f64,
    /// Weight of prompt-side work against decode blocks. Default 1.0.
    pub prefill_load_scale: f64,
    /// 0 = argmin with random tie-break; > 0 = softmax sampling. Default 0.0.
    pub router_temperature: f64,
    /// A worker whose active KV blocks / capacity is at or above this fraction is
    /// skipped. Default none (disabled).
    pub busy_threshold: Option<f64>,
    /// Blocks already held by a worker's active requests are not counted twice.
    /// Default true.
    pub assume_kv_reuse: bool,
    /// Count in-flight prompt tokens in the prefill term. Default true.
    pub track_prefill_tokens: bool,
    /// Count active KV blocks in the decode term. Default true.
    pub track_active_blocks: bool,
    /// Add placeholder blocks as generation crosses block boundaries. Default false.
    pub track_output_blocks: bool,
    /// `full` or `predicted`. Default `full`.
    pub prefill_load_model: PrefillLoadModel,
    /// Throughput of one non-CPU worker relative to one CPU worker, for
    /// `device-aware-weighted`. Default 8.0.
    pub cuda_to_cpu_ratio: f64,
    /// Decode stage of disaggregated routing keeps `assume_kv_reuse` (backend dedups
    /// transferred blocks). Default false.
    pub disagg_decode_assume_kv_reuse: bool,
    /// Decode-stage topology policy relative to the chosen prefill worker. Default none.
    pub topology_policy: TopologyPolicy,
    /// Extra cost (blocks) for a cross-domain decode worker under `prefer`. Default 32.
    pub topology_penalty: f64,
    /// Fixed prefill-duration model used until the online predictor has enough
    /// samples: micros = a + b * effective_isl + c * cached_tokens.
    pub prefill_fallback_us: [f64; 3],
    /// Samples the online predictor needs before it is trusted. Default 32.
    pub predictor_min_samples: u32,
    /// Speculative indexing: a routed request's prompt blocks count as cached on its
    /// (prefill) worker for this long, or until the worker's events confirm or drop
    /// them. 0 = off. Default 2000 ms.
    pub speculative_ttl_ms: u64,
    /// Most pending (block, worker) entries per index shard (per core in the service);
    /// the oldest go first. 0 = off. Default 65,536.
    pub speculative_max_blocks: usize,
    /// With `assume_kv_reuse`, also count the worker's device-cached prefix as blocks it
    /// already holds in the decode term (the older form, which credits a
    /// cached prefix twice: in the prefill term and again here). Default false: DESIGN
    /// §1 deduplicates only the blocks of the worker's active requests, since a cached
    /// block that a new request pins is real decode load.
    pub assume_device_reuse: bool,
    /// Weigh a worker's `kv` cost by its speed: the cost (blocks of work) is multiplied
    /// by how many times slower than a GPU worker it is, i.e. `cuda_to_cpu_ratio` for a
    /// CPU worker, `1 / throughput_weight` for a worker that declares one, 1 otherwise.
    /// Default true (an all-GPU fleet is unaffected).
    pub weigh_by_throughput: bool,
    /// `kv` at temperature 0: workers whose cost is within this fraction of the lowest
    /// cost count as tied with it (and are taken in turn), so a small cache credit
    /// (e.g. a prompt prefix every request shares) does not keep a large fleet's
    /// traffic on the few workers that happened to cache it first. In [0, 1]; 0 gives
    /// exact ties broken uniformly at random. Default 0.03 (below 0.05, the gap of
    /// 21 vs 20 in the DESIGN worked example).
    pub balance_slack: f64,
    /// Prefill stage of disaggregated routing: count in-flight prompt tokens. None
    /// (default): true whatever `track_prefill_tokens` says, since queued prompts are
    /// the only load a prefill worker has; the aggregated tuning
    /// `track_prefill_tokens = false` otherwise piles prompts on the best-cached
    /// prefill worker (docs/ROUTING.md).
    pub prefill_stage_track_prefill_tokens: Option<bool>,
    /// Prefill stage: `overlap_score_credit` of that stage. None (default): the base one.
    pub prefill_stage_overlap_score_credit: Option<f64>,
    /// Prefill stage: `prefill_load_scale` of that stage. None (default): the base one.
    pub prefill_stage_load_scale: Option<f64>,
    /// Decode stage: `track_output_blocks` of that stage. None (default): the base one.
    pub decode_stage_track_output_blocks: Option<bool>,
    /// Prefill stage: `balance_slack` of that stage. None (default): 0, exact ties. (The
    /// slack spreads first turns over a large aggregated fleet; in a prefill pool,
    /// whose cost is prompt work only, it skewed request counts, docs/ROUTING.md.)
    pub prefill_stage_balance_slack: Option<f64>,
    /// `kv` with `balance_slack`: when at least this many workers are near-tied, the
    /// tie goes to the one with the fewest requests routed to it so far (then in turn
    /// among equals); smaller tie sets are taken in turn. 0 = never. Default 6: a
    /// large fleet has many idle, near-tied workers, and request counts there drift
    /// apart through conversation length, which a count evens out; a small fleet's
    /// ties are few and load-driven, and a count there over-corrects (docs/ROUTING.md,
    /// "Ties and balance").
    pub balance_routed_min_ties: u32,
    /// Route-time prefix affinity (`select::Affinity`): entries of the table of
    /// remembered prompt prefixes (anchor blocks → the worker they were routed to),
    /// rounded up to a power of two; one table for the whole service (all cores),
    /// 8 bytes per entry, allocated at start. 0 = off. Default 1,048,576 (8 MiB: a
    /// smaller table loses prefixes to collisions, 65,536 gave 11.9 % instead of
    /// 12.2 % on the issue-18 setup).
    pub affinity_max_entries: usize,
    /// `kv` at temperature 0: the worker a request's prefix was last routed to (when
    /// that prefix covers at least half the prompt) gets the request if its cost is
    /// at most `1 + affinity_slack` times the lowest, so a conversation stays on one
    /// worker unless that worker costs several times the cheapest (docs/ROUTING.md
    /// "Prefix affinity"). In [0, 10]. Default 2: at 0.2 a light fleet's load gaps
    /// (relative to small costs) moved turns away and the hit rate fell below SGLang
    /// Model Gateway's on the issue-18 setup.
    pub affinity_slack: f64,
    /// Tokens after each block that the engines' block hashes also cover (vLLM's
    /// `lookahead_token_ids`, e.g. with EAGLE drafters): a request's block is hashed
    /// with its own next tokens, so a cached block counts only when the request
    /// continues as the cached prompt did, and a block is hashed only when that many
    /// tokens follow it. Engine events with another lookahead are refused. 0..=1024.
    /// Default 0.
    pub lookahead_tokens: u32,
    /// Session affinity (`select::Sessions`): entries of the table of sessions (a
    /// session key → the worker its last turn went to), rounded up to a power of two;
    /// one table for all cores, 16 bytes per entry, allocated at start. A session's
    /// next turn goes to that worker unless it costs more than `affinity_slack`
    /// allows, even when its prompt was rewritten. 0 = off. Default 0.
    pub session_max_entries: usize,
    /// A session not seen for this long is forgotten (its worker's cache has likely
    /// moved on). Default 600,000 ms.
    pub session_ttl_ms: u64,
    /// Header naming a request's session. Default `x-session-id`.
    pub session_header: String,
    /// Without the header, the OpenAI `user` field names the session. Default false.
    pub session_from_user: bool,
    /// Disaggregated fleets: prefill on the chosen decode worker itself (no remote
    /// prefill leg, no KV transfer) when at most this many prompt tokens are not
    /// cached there. 0 = off. Default 0.
    pub local_prefill_max_uncached_tokens: u32,
    /// Disaggregated fleets: prefill on the chosen decode worker itself when it
    /// already holds at least this fraction of the prompt (device and host tiers), in
    /// (0, 1]. Default none (off).
    pub local_prefill_min_cached_fraction: Option<f64>,
    /// Approximate mode (`index::approx`): a worker registered with a `url` and no
    /// event source (HTTP or binary `Register`, not `[[engines]]` nor the event
    /// protocol's `Hello`) has its cache modelled from the prompts routed to it, an
    /// LRU of its `capacity_blocks` credited like device blocks, until its first KV
    /// event switches it to exact. Default true.
    pub approximate: bool,
    /// Approximate mode: a modelled block no request has touched for this long is
    /// dropped (an idle TTL; the engine's own eviction is what the LRU models). At
    /// least 1. Default 120,000 ms (Dynamo's `--router-ttl-secs` 120 of the same mode).
    pub approximate_ttl_ms: u64,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            block_size: 128,
            mode: Mode::Kv,
            overlap_score_credit: 1.0,
            host_cache_hit_weight: 0.75,
            disk_cache_hit_weight: 0.25,
            shared_cache_multiplier: 0.5,
            prefill_load_scale: 1.0,
            router_temperature: 0.0,
            busy_threshold: None,
            assume_kv_reuse: true,
            track_prefill_tokens: true,
            track_active_blocks: true,
            track_output_blocks: false,
            prefill_load_model: PrefillLoadModel::Full,
            cuda_to_cpu_ratio: 8.0,
            disagg_decode_assume_kv_reuse: false,
            topology_policy: TopologyPolicy::None,
            topology_penalty: 32.0,
            prefill_fallback_us: [2_000.0, 50.0, 2.0],
            predictor_min_samples: 32,
            speculative_ttl_ms: 2_000,
            speculative_max_blocks: 65_536,
            assume_device_reuse: false,
            weigh_by_throughput: true,
            balance_slack: 0.03,
            prefill_stage_track_prefill_tokens: None,
            prefill_stage_overlap_score_credit: None,
            prefill_stage_load_scale: None,
            decode_stage_track_output_blocks: None,
            prefill_stage_balance_slack: None,
            balance_routed_min_ties: 6,
            affinity_max_entries: 1 << 20,
            affinity_slack: 2.0,
            lookahead_tokens: 0,
            session_max_entries: 0,
            session_ttl_ms: 600_000,
            session_header: "x-session-id".into(),
            session_from_user: false,
            local_prefill_max_uncached_tokens: 0,
            local_prefill_min_cached_fraction: None,
            approximate: true,
            approximate_ttl_ms: 120_000,
        }
    }
}

impl RouterConfig {
    /// Rejects values the cost function cannot use.
    pub fn validate(&self) -> Result<(), String> {
        fn finite_nonneg(name: &str, v: f64) -> Result<(), String> {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number >= 0 (got {v})"))
            }
        }
        if self.block_size == 0 || self.block_size as usize > crate::hash::MAX_BLOCK_SIZE {
            return Err(format!(
                "block_size must be 1..={}",
                crate::hash::MAX_BLOCK_SIZE
            ));
        }
        if !(0.0..=1.0).contains(&self.overlap_score_credit) {
            return Err("overlap_score_credit must be in [0, 1]".into());
        }
        finite_nonneg("host_cache_hit_weight", self.host_cache_hit_weight)?;
        finite_nonneg("disk_cache_hit_weight", self.disk_cache_hit_weight)?;
        finite_nonneg("shared_cache_multiplier", self.shared_cache_multiplier)?;
        finite_nonneg("prefill_load_scale", self.prefill_load_scale)?;
        finite_nonneg("router_temperature", self.router_temperature)?;
        finite_nonneg("topology_penalty", self.topology_penalty)?;
        if let Some(c) = self.prefill_stage_overlap_score_credit {
            if !(0.0..=1.0).contains(&c) {
                return Err("prefill_stage_overlap_score_credit must be in [0, 1]".into());
            }
        }
        if let Some(s) = self.prefill_stage_load_scale {
            finite_nonneg("prefill_stage_load_scale", s)?;
        }
        if !(0.0..=1.0).contains(&self.prefill_stage_balance_slack.unwrap_or(0.0)) {
            return Err("prefill_stage_balance_slack must be in [0, 1]".into());
        }
        if !(0.0..=1.0).contains(&self.balance_slack) {
            return Err("balance_slack must be in [0, 1]".into());
        }
        if !(0.0..=MAX_AFFINITY_SLACK).contains(&self.affinity_slack) {
            return Err(format!(
                "affinity_slack must be in [0, {MAX_AFFINITY_SLACK}]"
            ));
        }
        if self.lookahead_tokens > MAX_LOOKAHEAD_TOKENS {
            return Err(format!(
                "lookahead_tokens must be at most {MAX_LOOKAHEAD_TOKENS}"
            ));
        }
        if self.affinity_max_entries > MAX_AFFINITY_ENTRIES {
            return Err(format!(
                "affinity_max_entries must be at most {MAX_AFFINITY_ENTRIES}"
            ));
        }
        if let Some(b) = self.busy_threshold {
            if !(b.is_finite() && b > 0.0) {
                return Err("busy_threshold must be > 0".into());
            }
        }
        if !(self.cuda_to_cpu_ratio.is_finite() && self.cuda_to_cpu_ratio > 0.0) {
            return Err("cuda_to_cpu_ratio must be > 0".into());
        }
        if self.approximate_ttl_ms == 0 {
            return Err(
                "approximate_ttl_ms must be >= 1 (turn the mode off with approximate = false)"
                    .into(),
            );
        }
        if self.speculative_max_blocks > MAX_SPECULATIVE_BLOCKS {
            return Err(format!(
                "speculative_max_blocks must be at most {MAX_SPECULATIVE_BLOCKS}"
            ));
        }
        for v in self.prefill_fallback_us {
            finite_nonneg("prefill_fallback_us", v)?;
        }
        if self.session_max_entries > MAX_SESSION_ENTRIES {
            return Err(format!(
                "session_max_entries must be at most {MAX_SESSION_ENTRIES}"
            ));
        }
        if !(1_000..=7 * 86_400_000).contains(&self.session_ttl_ms) {
            return Err("session_ttl_ms must be 1000..=604800000 (7 days)".into());
        }
        let h = &self.session_header;
        if h.is_empty()
            || h.len() > 128
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            return Err(format!("session_header {h:?} is not a header name"));
        }
        if let Some(f) = self.local_prefill_min_cached_fraction {
            if !(f > 0.0 && f <= 1.0) {
                return Err("local_prefill_min_cached_fraction must be in (0, 1]".into());
            }
        }
        Ok(())
    }

    /// Prefill stage of disaggregated routing: prefill workers do no decode; the
    /// `prefill_stage_*` knobs apply.
    pub fn prefill_stage(&self) -> RouterConfig {
        RouterConfig {
            track_active_blocks: false,
            track_prefill_tokens: self.prefill_stage_track_prefill_tokens.unwrap_or(true),
            overlap_score_credit: self
                .prefill_stage_overlap_score_credit
                .unwrap_or(self.overlap_score_credit),
            prefill_load_scale: self
                .prefill_stage_load_scale
                .unwrap_or(self.prefill_load_scale),
            balance_slack: self.prefill_stage_balance_slack.unwrap_or(0.0),
            ..self.clone()
        }
    }

    /// Decode stage of disaggregated routing: decode load reflects decode work only.
    pub fn decode_stage(&self) -> RouterConfig {
        RouterConfig {
            overlap_score_credit: 0.0,
            host_cache_hit_weight: 0.0,
            disk_cache_hit_weight: 0.0,
            shared_cache_multiplier: 0.0,
            assume_kv_reuse: self.disagg_decode_assume_kv_reuse,
            track_prefill_tokens: false,
            track_output_blocks: self
                .decode_stage_track_output_blocks
                .unwrap_or(self.track_output_blocks),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_roundtrip_toml() {
        let c = RouterConfig::default();
        c.validate().unwrap();
        let s = toml::to_string(&c).unwrap();
        let back: RouterConfig = toml::from_str(&s).unwrap();
        assert_eq!(back, c);
        let partial: RouterConfig = toml::from_str("overlap_score_credit = 0.5").unwrap();
        assert_eq!(partial.overlap_score_credit, 0.5);
        assert_eq!(partial.block_size, 128);
        assert!(toml::from_str::<RouterConfig>("nonsense = 1").is_err());
    }

    #[test]
    fn validate_rejects_bad_values() {
        let bad = [
            RouterConfig {
                overlap_score_credit: 1.5,
                ..Default::default()
            },
            RouterConfig {
                block_size: 0,
                ..Default::default()
            },
            RouterConfig {
                router_temperature: -1.0,
                ..Default::default()
            },
            RouterConfig {
                busy_threshold: Some(0.0),
                ..Default::default()
            },
            RouterConfig {
                cuda_to_cpu_ratio: f64::NAN,
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    #[test]
    fn stage_configs_follow_design() {
        let c = RouterConfig::default();
        let p = c.prefill_stage();
        assert!(!p.track_active_blocks);
        assert_eq!(p.overlap_score_credit, 1.0);
        let d = c.decode_stage();
        assert_eq!(d.overlap_score_credit, 0.0);
        assert!(!d.assume_kv_reuse);
        assert!(!d.track_prefill_tokens);
        let d2 = RouterConfig {
            disagg_decode_assume_kv_reuse: true,
            ..c.clone()
        }
        .decode_stage();
        assert!(d2.assume_kv_reuse);
    }

    #[test]
    fn per_stage_knobs() {
        // The aggregated tuning does not reach the prefill stage unless asked.
        let tuned = RouterConfig {
            track_prefill_tokens: false,
            prefill_load_scale: 8.0,
            ..Default::default()
        };
        let p = tuned.prefill_stage();
        assert!(p.track_prefill_tokens);
        assert_eq!(p.prefill_load_scale, 8.0);
        assert!(!tuned.decode_stage().track_prefill_tokens);
        let apart = RouterConfig {
            prefill_stage_track_prefill_tokens: Some(false),
            prefill_stage_overlap_score_credit: Some(0.5),
            prefill_stage_load_scale: Some(2.0),
            decode_stage_track_output_blocks: Some(true),
            prefill_stage_balance_slack: Some(0.1),
            ..tuned
        };
        apart.validate().unwrap();
        let p = apart.prefill_stage();
        assert!(!p.track_prefill_tokens);
        assert_eq!((p.overlap_score_credit, p.prefill_load_scale), (0.5, 2.0));
        assert_eq!(p.balance_slack, 0.1);
        assert_eq!(RouterConfig::default().prefill_stage().balance_slack, 0.0);
        let d = apart.decode_stage();
        assert!(d.track_output_blocks);
        assert!(!apart.track_output_blocks, "the base config is unchanged");
        let s = toml::to_string(&apart).unwrap();
        assert_eq!(toml::from_str::<RouterConfig>(&s).unwrap(), apart);
        let bad = RouterConfig {
            prefill_stage_overlap_score_credit: Some(2.0),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}
