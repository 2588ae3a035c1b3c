//! Command line of the `kvroute` binary: `kvroute serve` and its flags.
//!
//! Every setting of [`Settings`] has a flag and an environment variable (`KVROUTE_*`);
//! they override the optional TOML file, which overrides the embedded defaults.

use crate::config::{Mode, PrefillLoadModel, TopologyPolicy};
use crate::settings::Settings;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "kvroute",
    version,
    about = "KV-cache-aware router for LLM inference fleets"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the router service.
    Serve(ServeArgs),
    /// Print the effective settings (defaults < file < env < flags) as TOML and exit.
    PrintConfig(ServeArgs),
}

/// Flags of `kvroute serve`. Unset flags leave the file/default value in place.
#[derive(Args, Debug, Default, Clone)]
pub struct ServeArgs {
    /// TOML settings file (all keys optional; see docs/CONFIGURATION.md).
    #[arg(long, env = "KVROUTE_CONFIG")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "KVROUTE_EVENTS_ADDR")]
    pub events_addr: Option<String>,
    #[arg(long, env = "KVROUTE_API_ADDR")]
    pub api_addr: Option<String>,
    #[arg(long, env = "KVROUTE_HTTP_ADDR")]
    pub http_addr: Option<String>,
    /// Executors / index shards (default: all online cores).
    #[arg(long, env = "KVROUTE_CORES")]
    pub cores: Option<usize>,
    /// sharded | replicated: one index shard per core, or a whole copy per core.
    #[arg(long, env = "KVROUTE_INDEX_LAYOUT", value_parser = crate::settings::IndexLayout::parse)]
    pub index_layout: Option<crate::settings::IndexLayout>,
    #[arg(long, env = "KVROUTE_HEARTBEAT_TIMEOUT_MS")]
    pub heartbeat_timeout_ms: Option<u64>,
    /// An in-flight request with no lifecycle call for this long expires.
    #[arg(long, env = "KVROUTE_REQUEST_TTL_MS")]
    pub request_ttl_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_SPIN_BEFORE_PARK_US")]
    pub spin_before_park_us: Option<u64>,
    /// Warm-restart snapshots directory.
    #[arg(long, env = "KVROUTE_STATE_DIR")]
    pub state_dir: Option<String>,
    #[arg(long, env = "KVROUTE_SNAPSHOT_INTERVAL_MS")]
    pub snapshot_interval_ms: Option<u64>,
    /// Shared secret required on every port (prefer the env var or a file).
    #[arg(long, env = "KVROUTE_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    #[arg(long, env = "KVROUTE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<String>,
    /// Allow non-loopback listen addresses without a token.
    #[arg(long, env = "KVROUTE_INSECURE")]
    pub insecure: bool,
    /// Per-worker tokens file (`worker_id token` per line).
    #[arg(long, alias = "worker-tokens", env = "KVROUTE_WORKER_TOKENS_FILE")]
    pub worker_tokens_file: Option<String>,
    // Limits.
    #[arg(long, env = "KVROUTE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_FRAME_BYTES")]
    pub max_frame_bytes: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_WORKERS")]
    pub max_workers: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_BLOCKS_PER_WORKER")]
    pub max_blocks_per_worker: Option<u64>,
    #[arg(long, env = "KVROUTE_MAX_HASHES_PER_REQUEST")]
    pub max_hashes_per_request: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_ACTIVE_REQUESTS")]
    pub max_active_requests: Option<usize>,
    #[arg(long, env = "KVROUTE_QUEUE_DEPTH")]
    pub queue_depth: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_ENGINE_MESSAGE_BYTES")]
    pub max_engine_message_bytes: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_INDEX_ENTRIES")]
    pub max_index_entries: Option<u64>,
    // Routing knobs (DESIGN §1).
    #[arg(long, env = "KVROUTE_BLOCK_SIZE")]
    pub block_size: Option<u32>,
    /// kv | random | round-robin | direct | least-loaded | device-aware-weighted
    #[arg(long, env = "KVROUTE_MODE", value_parser = parse_mode)]
    pub mode: Option<Mode>,
    #[arg(long, env = "KVROUTE_OVERLAP_SCORE_CREDIT")]
    pub overlap_score_credit: Option<f64>,
    #[arg(long, env = "KVROUTE_HOST_CACHE_HIT_WEIGHT")]
    pub host_cache_hit_weight: Option<f64>,
    #[arg(long, env = "KVROUTE_DISK_CACHE_HIT_WEIGHT")]
    pub disk_cache_hit_weight: Option<f64>,
    #[arg(long, env = "KVROUTE_SHARED_CACHE_MULTIPLIER")]
    pub shared_cache_multiplier: Option<f64>,
    #[arg(long, env = "KVROUTE_PREFILL_LOAD_SCALE")]
    pub prefill_load_scale: Option<f64>,
    #[arg(long, env = "KVROUTE_ROUTER_TEMPERATURE")]
    pub router_temperature: Option<f64>,
    #[arg(long, env = "KVROUTE_BUSY_THRESHOLD")]
    pub busy_threshold: Option<f64>,
    #[arg(long, env = "KVROUTE_ASSUME_KV_REUSE")]
    pub assume_kv_reuse: Option<bool>,
    #[arg(long, env = "KVROUTE_TRACK_PREFILL_TOKENS")]
    pub track_prefill_tokens: Option<bool>,
    #[arg(long, env = "KVROUTE_TRACK_ACTIVE_BLOCKS")]
    pub track_active_blocks: Option<bool>,
    #[arg(long, env = "KVROUTE_TRACK_OUTPUT_BLOCKS")]
    pub track_output_blocks: Option<bool>,
    /// full | predicted
    #[arg(long, env = "KVROUTE_PREFILL_LOAD_MODEL", value_parser = parse_prefill_model)]
    pub prefill_load_model: Option<PrefillLoadModel>,
    #[arg(long, env = "KVROUTE_CUDA_TO_CPU_RATIO")]
    pub cuda_to_cpu_ratio: Option<f64>,
    #[arg(long, env = "KVROUTE_DISAGG_DECODE_ASSUME_KV_REUSE")]
    pub disagg_decode_assume_kv_reuse: Option<bool>,
    /// none | restrict | prefer
    #[arg(long, env = "KVROUTE_TOPOLOGY_POLICY", value_parser = parse_topology)]
    pub topology_policy: Option<TopologyPolicy>,
    #[arg(long, env = "KVROUTE_TOPOLOGY_PENALTY")]
    pub topology_penalty: Option<f64>,
    #[arg(long, env = "KVROUTE_PREDICTOR_MIN_SAMPLES")]
    pub predictor_min_samples: Option<u32>,
    /// Write the routed requests as a Mooncake-format trace to this file.
    #[arg(long, env = "KVROUTE_RECORD")]
    pub record: Option<String>,
    #[arg(long, env = "KVROUTE_RECORD_MAX_BYTES")]
    pub record_max_bytes: Option<u64>,
    #[arg(long, env = "KVROUTE_RECORD_MAX_IDS")]
    pub record_max_ids: Option<usize>,
    /// Most block hashes a shard applies between two looks at its routing queue.
    #[arg(long, env = "KVROUTE_INGEST_SLICE_HASHES")]
    pub ingest_slice_hashes: Option<usize>,
    /// Pin executor N to the Nth CPU of the affinity mask (`false`: the kernel places).
    #[arg(long, env = "KVROUTE_PIN_CORES")]
    pub pin_cores: Option<bool>,
    /// The kernel's scheduler slice for the cores' threads, µs (0 = the kernel's).
    #[arg(long, env = "KVROUTE_CORE_SLICE_US")]
    pub core_slice_us: Option<u64>,
    /// Tokenize prompts by the lean walk of each tokenizer's pipeline where it is
    /// exact (`false`: HF's pipeline for every prompt).
    #[arg(long, env = "KVROUTE_TOKENIZE_LEAN")]
    pub tokenize_lean: Option<bool>,
    /// Microseconds a core keeps polling for an outstanding cross-core answer (or an
    /// announced query) before parking (0 = park at once).
    #[arg(long, env = "KVROUTE_ANSWER_SPIN_US")]
    pub answer_spin_us: Option<u64>,
    /// Join a replica tier through this NATS server (nats://HOST:PORT).
    #[arg(long, env = "KVROUTE_CLUSTER")]
    pub cluster: Option<String>,
    #[arg(long, env = "KVROUTE_CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    #[arg(long, env = "KVROUTE_CLUSTER_REPLICA_ID")]
    pub cluster_replica_id: Option<String>,
    #[arg(long, env = "KVROUTE_CLUSTER_TOKEN")]
    pub cluster_token: Option<String>,
    #[arg(long, env = "KVROUTE_CLUSTER_USER")]
    pub cluster_user: Option<String>,
    #[arg(long, env = "KVROUTE_CLUSTER_PASSWORD")]
    pub cluster_password: Option<String>,
    #[arg(long, env = "KVROUTE_CLUSTER_CREDS_FILE")]
    pub cluster_creds_file: Option<String>,
    /// The tier secret replicas seal their messages with (prefer the env var or a file).
    #[arg(long, env = "KVROUTE_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,
    #[arg(long, env = "KVROUTE_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<String>,
    /// Run the replica tier without a secret (any NATS client can forge its state).
    #[arg(long, env = "KVROUTE_CLUSTER_UNAUTHENTICATED")]
    pub cluster_unauthenticated: bool,
    #[arg(long, env = "KVROUTE_CLUSTER_MAX_AGE_MS")]
    pub cluster_max_age_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_CLUSTER_MAX_BYTES")]
    pub cluster_max_bytes: Option<u64>,
    #[arg(long, env = "KVROUTE_CLUSTER_PUBLISH_BUFFER")]
    pub cluster_publish_buffer: Option<usize>,
    #[arg(long, env = "KVROUTE_SPECULATIVE_TTL_MS")]
    pub speculative_ttl_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_SPECULATIVE_MAX_BLOCKS")]
    pub speculative_max_blocks: Option<usize>,
    /// Approximate mode for workers registered with a url and no event source.
    #[arg(long, env = "KVROUTE_APPROXIMATE")]
    pub approximate: Option<bool>,
    #[arg(long, env = "KVROUTE_APPROXIMATE_TTL_MS")]
    pub approximate_ttl_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_ASSUME_DEVICE_REUSE")]
    pub assume_device_reuse: Option<bool>,
    #[arg(long, env = "KVROUTE_WEIGH_BY_THROUGHPUT")]
    pub weigh_by_throughput: Option<bool>,
    #[arg(long, env = "KVROUTE_BALANCE_SLACK")]
    pub balance_slack: Option<f64>,
    #[arg(long, env = "KVROUTE_PREFILL_STAGE_TRACK_PREFILL_TOKENS")]
    pub prefill_stage_track_prefill_tokens: Option<bool>,
    #[arg(long, env = "KVROUTE_PREFILL_STAGE_OVERLAP_SCORE_CREDIT")]
    pub prefill_stage_overlap_score_credit: Option<f64>,
    #[arg(long, env = "KVROUTE_PREFILL_STAGE_LOAD_SCALE")]
    pub prefill_stage_load_scale: Option<f64>,
    #[arg(long, env = "KVROUTE_DECODE_STAGE_TRACK_OUTPUT_BLOCKS")]
    pub decode_stage_track_output_blocks: Option<bool>,
    #[arg(long, env = "KVROUTE_PREFILL_STAGE_BALANCE_SLACK")]
    pub prefill_stage_balance_slack: Option<f64>,
    #[arg(long, env = "KVROUTE_BALANCE_ROUTED_MIN_TIES")]
    pub balance_routed_min_ties: Option<u32>,
    #[arg(long, env = "KVROUTE_AFFINITY_MAX_ENTRIES")]
    pub affinity_max_entries: Option<usize>,
    #[arg(long, env = "KVROUTE_AFFINITY_SLACK")]
    pub affinity_slack: Option<f64>,
    #[arg(long, env = "KVROUTE_LOOKAHEAD_TOKENS")]
    pub lookahead_tokens: Option<u32>,
    #[command(flatten)]
    pub policy_router: crate::admission::args::PolicyRouterArgs,
    /// host | disk: the tier credited for an engine medium no engine defines (never device).
    #[arg(long, env = "KVROUTE_ENGINE_UNKNOWN_MEDIUM_TIER", value_parser = parse_tier)]
    pub engine_unknown_medium_tier: Option<crate::types::Tier>,
    /// A vLLM / SGLang engine to subscribe to over ZMQ, repeatable; replaces the file's
    /// `[[engines]]` when given. Compact form:
    /// `worker_id=w1,endpoint=tcp://127.0.0.1:5557[,replay_endpoint=...,role=...,device=...,
    /// model=...,capacity_blocks=...,dp_rank=...,block_size=...,lora=...,topic=...]`
    #[arg(long = "engine", value_parser = parse_engine)]
    pub engines: Vec<crate::engines::config::EngineEndpoint>,
    /// A file of more `[[engines]]`, re-read every second and on SIGHUP.
    #[arg(long, env = "KVROUTE_ENGINES_FILE")]
    pub engines_file: Option<String>,
    // Connection hardening (handshake, idle and HTTP timeouts; pre-auth limits).
    #[arg(long, env = "KVROUTE_HELLO_TIMEOUT_MS")]
    pub hello_timeout_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_API_IDLE_TIMEOUT_MS")]
    pub api_idle_timeout_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_HTTP_HEADER_TIMEOUT_MS")]
    pub http_header_timeout_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_HTTP_IDLE_TIMEOUT_MS")]
    pub http_idle_timeout_ms: Option<u64>,
    #[arg(long, env = "KVROUTE_HTTP_BODY_TIMEOUT_MS")]
    pub http_body_timeout_ms: Option<u64>,
    /// Bytes/s a request body must average (0 = no rate rule).
    #[arg(long, env = "KVROUTE_HTTP_BODY_MIN_RATE")]
    pub http_body_min_rate: Option<u64>,
    /// Host names the HTTP doors answer to besides IP literals and localhost (comma
    /// separated or repeated; `*.domain`, `*`); replaces the file's list when given.
    #[arg(long, env = "KVROUTE_HTTP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub http_allowed_hosts: Vec<String>,
    /// Origins whose browser pages may call the HTTP doors (`http[s]://host[:port]`,
    /// comma separated or repeated; `null`, `*`); replaces the file's list when given.
    #[arg(long, env = "KVROUTE_HTTP_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub http_allowed_origins: Vec<String>,
    #[arg(long, env = "KVROUTE_MAX_PREAUTH_CONNECTIONS")]
    pub max_preauth_connections: Option<usize>,
    #[arg(long, env = "KVROUTE_MAX_HELLO_BYTES")]
    pub max_hello_bytes: Option<usize>,
    // The OpenAI proxy (docs/PROXY.md).
    /// Proxy listen address; empty or `off` disables the proxy.
    #[arg(long, env = "KVROUTE_PROXY_ADDR")]
    pub proxy_addr: Option<String>,
    // Groups of their own: the proxy (`--proxy-*`), its policies (`--admission-*`),
    // tracing (`--otlp-*`, `--trace-*`), the endpoint picker (`--epp-*`).
    #[command(flatten)]
    pub proxy: crate::proxy::args::ProxyArgs,
    #[command(flatten)]
    pub admission: crate::admission::args::AdmissionArgs,
    #[command(flatten)]
    pub trace: crate::trace::args::TraceArgs,
    #[command(flatten)]
    pub epp: crate::epp::args::EppArgs,
    /// HuggingFace tokenizer directory of a model, `MODEL=DIR`, repeatable (env: comma
    /// separated); replaces the file's `[tokenizers]` when given.
    #[arg(long = "tokenizer", env = "KVROUTE_TOKENIZERS", value_delimiter = ',', value_parser = parse_pair)]
    pub tokenizers: Vec<(String, String)>,
    /// A LoRA adapter's base model, `ADAPTER=BASE`, repeatable (env: comma separated);
    /// replaces the file's `[lora_adapters]` when given.
    #[arg(long = "lora-adapter", env = "KVROUTE_LORA_ADAPTERS", value_delimiter = ',', value_parser = parse_pair)]
    pub lora_adapters: Vec<(String, String)>,
    #[arg(long, env = "KVROUTE_MAX_PROMPT_TOKENS")]
    pub max_prompt_tokens: Option<usize>,
    /// Template steps one chat render may take (past it: 400).
    #[arg(long, env = "KVROUTE_CHAT_TEMPLATE_FUEL")]
    pub chat_template_fuel: Option<u64>,
}

/// `KEY=VALUE` with both sides non-empty, split at the first `=` (model names have
/// none; a directory might).
fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
            Ok((k.trim().to_string(), v.trim().to_string()))
        }
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn parse_engine(s: &str) -> Result<crate::engines::config::EngineEndpoint, String> {
    crate::engines::config::EngineEndpoint::parse_compact(s)
}

fn parse_tier(s: &str) -> Result<crate::types::Tier, String> {
    crate::types::Tier::ALL
        .into_iter()
        .find(|t| t.name() == s)
        .ok_or_else(|| format!("unknown tier {s:?} (device | host | disk)"))
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    Mode::parse(s).ok_or_else(|| format!("unknown mode {s:?}"))
}

fn parse_prefill_model(s: &str) -> Result<PrefillLoadModel, String> {
    match s {
        "full" => Ok(PrefillLoadModel::Full),
        "predicted" => Ok(PrefillLoadModel::Predicted),
        _ => Err(format!(
            "unknown prefill load model {s:?} (full | predicted)"
        )),
    }
}

fn parse_topology(s: &str) -> Result<TopologyPolicy, String> {
    match s {
        "none" => Ok(TopologyPolicy::None),
        "restrict" => Ok(TopologyPolicy::Restrict),
        "prefer" => Ok(TopologyPolicy::Prefer),
        _ => Err(format!(
            "unknown topology policy {s:?} (none | restrict | prefer)"
        )),
    }
}

macro_rules! overlay {
    ($dst:expr, $src:expr, $($field:ident),* $(,)?) => {
        $( if let Some(v) = $src.$field.clone() { $dst.$field = v; } )*
    };
}

impl ServeArgs {
    /// Effective settings: defaults < `--config` file < env < flags; validated.
    pub fn settings(&self) -> Result<Settings, String> {
        let mut s = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                Settings::from_toml(&text)?
            }
            None => Settings::default(),
        };
        self.apply(&mut s);
        s.validate()?;
        Ok(s)
    }

    /// Overlays the flags that were given onto `s`.
    pub fn apply(&self, s: &mut Settings) {
        overlay!(
            s,
            self,
            events_addr,
            api_addr,
            http_addr,
            heartbeat_timeout_ms,
            request_ttl_ms,
            spin_before_park_us
        );
        if self.cores.is_some() {
            s.cores = self.cores;
        }
        for (dst, src) in [
            (&mut s.state_dir, &self.state_dir),
            (&mut s.auth_token, &self.auth_token),
            (&mut s.auth_token_file, &self.auth_token_file),
            (&mut s.worker_tokens_file, &self.worker_tokens_file),
        ] {
            if src.is_some() {
                *dst = src.clone();
            }
        }
        if let Some(v) = self.snapshot_interval_ms {
            s.snapshot_interval_ms = v;
        }
        if self.insecure {
            s.insecure = true;
        }
        overlay!(
            s.limits,
            self,
            max_connections,
            max_frame_bytes,
            max_body_bytes,
            max_workers,
            max_blocks_per_worker,
            max_hashes_per_request,
            max_active_requests,
            queue_depth,
            max_engine_message_bytes,
            max_index_entries,
        );
        overlay!(
            s.router,
            self,
            block_size,
            mode,
            overlap_score_credit,
            host_cache_hit_weight,
            disk_cache_hit_weight,
            shared_cache_multiplier,
            prefill_load_scale,
            router_temperature,
            assume_kv_reuse,
            track_prefill_tokens,
            track_active_blocks,
            track_output_blocks,
            prefill_load_model,
            cuda_to_cpu_ratio,
            disagg_decode_assume_kv_reuse,
            topology_policy,
            topology_penalty,
            predictor_min_samples,
            speculative_ttl_ms,
            speculative_max_blocks,
            approximate,
            approximate_ttl_ms,
            assume_device_reuse,
            weigh_by_throughput,
            balance_slack,
            balance_routed_min_ties,
            affinity_max_entries,
            affinity_slack,
            lookahead_tokens,
        );
        // Optional per-stage knobs: a given flag sets Some(value).
        for (dst, src) in [
            (
                &mut s.router.prefill_stage_track_prefill_tokens,
                self.prefill_stage_track_prefill_tokens,
            ),
            (
                &mut s.router.decode_stage_track_output_blocks,
                self.decode_stage_track_output_blocks,
            ),
        ] {
            if src.is_some() {
                *dst = src;
            }
        }
        for (dst, src) in [
            (
                &mut s.router.prefill_stage_overlap_score_credit,
                self.prefill_stage_overlap_score_credit,
            ),
            (
                &mut s.router.prefill_stage_load_scale,
                self.prefill_stage_load_scale,
            ),
            (
                &mut s.router.prefill_stage_balance_slack,
                self.prefill_stage_balance_slack,
            ),
        ] {
            if src.is_some() {
                *dst = src;
            }
        }
        if self.busy_threshold.is_some() {
            s.router.busy_threshold = self.busy_threshold;
        }
        if !self.engines.is_empty() {
            s.engines = self.engines.clone();
        }
        if self.engines_file.is_some() {
            s.engines_file.clone_from(&self.engines_file);
        }
        overlay!(s, self, engine_unknown_medium_tier);
        overlay!(
            s,
            self,
            hello_timeout_ms,
            api_idle_timeout_ms,
            http_header_timeout_ms,
            http_idle_timeout_ms,
            http_body_timeout_ms,
            http_body_min_rate,
        );
        for (dst, src) in [
            (&mut s.http_allowed_hosts, &self.http_allowed_hosts),
            (&mut s.http_allowed_origins, &self.http_allowed_origins),
        ] {
            if !src.is_empty() {
                dst.clone_from(src);
            }
        }
        overlay!(s.limits, self, max_preauth_connections, max_hello_bytes);
        if self.record.is_some() {
            s.record = self.record.clone();
        }
        overlay!(s, self, record_max_bytes, record_max_ids);
        if !self.tokenizers.is_empty() {
            s.tokenizers = self.tokenizers.iter().cloned().collect();
        }
        if !self.lora_adapters.is_empty() {
            s.lora_adapters = self.lora_adapters.iter().cloned().collect();
        }
        overlay!(s.limits, self, max_prompt_tokens, chat_template_fuel);
        self.apply_proxy(s);
        self.policy_router.apply(&mut s.router);
        self.admission.apply(&mut s.admission);
    }

    /// The proxy's flags (`--proxy-*`) onto `s.proxy_addr` / `s.proxy`.
    fn apply_proxy(&self, s: &mut Settings) {
        self.proxy.apply(&mut s.proxy);
        self.epp.apply(&mut s.epp);
        overlay!(s, self, proxy_addr, ingest_slice_hashes);
        overlay!(s, self, index_layout, pin_cores, core_slice_us);
        overlay!(s, self, tokenize_lean, answer_spin_us);
        self.apply_cluster(&mut s.cluster);
        self.trace.apply(&mut s.trace);
    }

    /// The `--cluster*` flags over `[cluster]`.
    fn apply_cluster(&self, c: &mut crate::cluster::config::ClusterSettings) {
        let opt = |dst: &mut Option<String>, src: &Option<String>| {
            if src.is_some() {
                dst.clone_from(src);
            }
        };
        opt(&mut c.url, &self.cluster);
        opt(&mut c.replica_id, &self.cluster_replica_id);
        opt(&mut c.token, &self.cluster_token);
        opt(&mut c.user, &self.cluster_user);
        opt(&mut c.password, &self.cluster_password);
        opt(&mut c.creds_file, &self.cluster_creds_file);
        opt(&mut c.secret, &self.cluster_secret);
        opt(&mut c.secret_file, &self.cluster_secret_file);
        if self.cluster_unauthenticated {
            c.unauthenticated = true;
        }
        if let Some(n) = &self.cluster_name {
            c.name.clone_from(n);
        }
        if let Some(v) = self.cluster_max_age_ms {
            c.max_age_ms = v;
        }
        if let Some(v) = self.cluster_max_bytes {
            c.max_bytes = v;
        }
        if let Some(v) = self.cluster_publish_buffer {
            c.publish_buffer = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_defaults() {
        let cli = Cli::try_parse_from([
            "kvroute",
            "serve",
            "--cores",
            "1",
            "--mode",
            "round-robin",
            "--overlap-score-credit",
            "0.5",
            "--busy-threshold",
            "0.9",
            "--assume-kv-reuse",
            "false",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        let s = args.settings().unwrap();
        assert_eq!(s.cores, Some(1));
        assert_eq!(s.router.mode, Mode::RoundRobin);
        assert_eq!(s.router.overlap_score_credit, 0.5);
        assert_eq!(s.router.busy_threshold, Some(0.9));
        assert!(!s.router.assume_kv_reuse);
        assert_eq!(s.router.block_size, 128);
    }

    #[test]
    fn invalid_flag_values_are_refused() {
        assert!(Cli::try_parse_from(["kvroute", "serve", "--mode", "fastest"]).is_err());
        let cli = Cli::try_parse_from(["kvroute", "serve", "--overlap-score-credit", "3"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        assert!(args.settings().is_err());
    }
}
