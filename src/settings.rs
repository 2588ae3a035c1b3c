//! Service settings: listen addresses, cores, limits, liveness, and the routing knobs.
//!
//! Plain data with embedded defaults, so `kvroute serve` needs no config file. Sources
//! are layered: defaults < TOML file (`--config`) < environment variables < flags (see
//! `cli`). `validate` is the single place that rejects unusable combinations.

use crate::config::RouterConfig;
use serde::{Deserialize, Serialize};

/// Everything `kvroute serve` can be told.
/// Default `ingest_slice_hashes`: 128 hashes are ~3–6 µs of shard work, so a routing
/// query waits at most about that behind ingest, while the look at the urgent inbox
/// (one atomic load) stays negligible next to the slice.
pub const DEFAULT_INGEST_SLICE_HASHES: usize = 128;

/// Default `answer_spin_us` (docs/PERFORMANCE.md "Answer spin"): a cross-core round
/// trip that finds the other core parked takes ~40–120 µs on the VM it was measured
/// on; past this bound the core parks and the answer wakes it as before.
pub const DEFAULT_ANSWER_SPIN_US: u64 = 200;

/// Largest `answer_spin_us` accepted (1 s): the spin stays bounded whatever is set.
pub const MAX_ANSWER_SPIN_US: u64 = 1_000_000;

/// The `core_slice_us` the kernel takes (0.1 ms to 100 ms); 0 = the kernel's default.
pub const CORE_SLICE_US: std::ops::RangeInclusive<u64> = 100..=100_000;

/// Default `request_ttl_ms` (10 minutes): twice the proxy's default
/// `request_timeout_ms`, the longest a proxied request may go without a lifecycle call
/// (waiting for a non-streamed answer), so no live proxied request expires.
pub const DEFAULT_REQUEST_TTL_MS: u64 = 600_000;

/// Largest `request_ttl_ms` accepted (7 days).
pub const MAX_REQUEST_TTL_MS: u64 = 7 * 86_400_000;
/// Default `http_body_min_rate` (bytes/s): far below any real client's upload (a
/// 4 MiB body over a 1 Mbit/s link is 128 KiB/s), far above what a body trickled to
/// hold a connection sends (a byte every few seconds).
pub const DEFAULT_HTTP_BODY_MIN_RATE: u64 = 1024;

/// How the block-hash index is laid out over the cores (`index_layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexLayout {
    /// Each core owns one shard (the hashes whose top bits name it): every event is
    /// applied once, the index costs one copy of memory, and a decision gathers the
    /// other cores' overlaps (one cross-core round trip with `--cores` > 1).
    #[default]
    Sharded,
    /// Every core holds the whole index and applies every event: a decision reads
    /// only its own core (no round trip, no wake-up of another core), for `cores`
    /// times the index memory and ingest CPU. For a proxy tier, whose fleet's event
    /// rate is far below what one core ingests.
    Replicated,
}

impl IndexLayout {
    /// Parses `sharded` / `replicated`.
    pub fn parse(s: &str) -> Result<IndexLayout, String> {
        match s {
            "sharded" => Ok(IndexLayout::Sharded),
            "replicated" => Ok(IndexLayout::Replicated),
            _ => Err(format!("unknown index layout {s:?} (sharded | replicated)")),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Binary event protocol (workers → router). Default 127.0.0.1:7400.
    pub events_addr: String,
    /// Binary request API (frontends ↔ router). Default 127.0.0.1:7401.
    pub api_addr: String,
    /// HTTP: JSON API, admin, /metrics, /healthz. Default 127.0.0.1:7480.
    pub http_addr: String,
    /// Executors (one per core, each owning one index shard). Default: all online cores.
    pub cores: Option<usize>,
    /// The index over the cores: one shard each, or a whole copy each
    /// ([`IndexLayout`]). Default sharded.
    pub index_layout: IndexLayout,
    /// A worker with a binary connection that sends nothing (heartbeat or event) for this
    /// long leaves routing until it returns. Default 10,000 ms.
    pub heartbeat_timeout_ms: u64,
    /// An in-flight request with no lifecycle call (route, first token, progress) for
    /// this long expires: its load is released, counted and logged. Covers requests
    /// whose caller died (a crashed proxy's streams restored from a snapshot, a peer
    /// replica's routes after it went away, a frontend that never finishes); a long
    /// stream stays as long as progress calls keep coming. Default 600,000 ms.
    pub request_ttl_ms: u64,
    /// Microseconds an idle executor spins before parking (0 = park at once). Lowers
    /// cross-core hand-off latency at the price of CPU. Default 50.
    pub spin_before_park_us: u64,
    /// Directory for warm-restart snapshots (index + registry); none = no persistence.
    /// Default none.
    pub state_dir: Option<String>,
    /// Period of snapshots when `state_dir` is set (one is also taken at shutdown).
    /// Default 30,000 ms.
    pub snapshot_interval_ms: u64,
    /// Shared secret required on the event port, the binary API and HTTP (Bearer).
    /// Default none (no authentication; loopback only unless `insecure`).
    pub auth_token: Option<String>,
    /// File holding the shared secret (first line), instead of `auth_token`.
    pub auth_token_file: Option<String>,
    /// Allow listening on a non-loopback address without a token. Default false.
    pub insecure: bool,
    /// Per-worker tokens, one `worker_id token` per line (`credentials`): a listed
    /// worker is registered, fed, cleared and removed only with its own token. Needs
    /// `auth_token` / `auth_token_file`. Default none.
    pub worker_tokens_file: Option<String>,
    pub limits: Limits,
    pub router: RouterConfig,
    /// vLLM / SGLang engines to subscribe to over ZMQ (`[[engines]]`), each bound to a
    /// worker (README "Pointing kvroute at a vLLM or SGLang fleet").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub engines: Vec<crate::engines::config::EngineEndpoint>,
    /// A file of more `[[engines]]`, followed while kvroute runs: re-read every second
    /// and on SIGHUP, its changes applied without a restart (`service::ingest::engines_file`).
    /// With `[cluster]` it is read once at start, its entries added to `engines` (each
    /// replica ingests an engine only under the engine's lease, which covers the list
    /// it started with). Default none.
    pub engines_file: Option<String>,
    /// The tier credited for blocks of an engine medium neither vLLM nor SGLang
    /// defines (docs/ENGINES.md "Media and tiers"): host or disk, never device.
    /// Default disk, the least optimistic.
    pub engine_unknown_medium_tier: crate::types::Tier,
    /// Time a new binary connection (event port, request API) has to deliver its
    /// `Hello`; then it is closed. Default 5,000 ms.
    pub hello_timeout_ms: u64,
    /// A binary request-API session (after `Hello`) that sends nothing for this long
    /// while no request of it is being answered is closed. Default 300,000 ms.
    pub api_idle_timeout_ms: u64,
    /// An HTTP request head must be complete this long after its first byte (after the
    /// connection opens, for its first request). Default 10,000 ms.
    pub http_header_timeout_ms: u64,
    /// A keep-alive HTTP connection with no request for this long is closed.
    /// Default 60,000 ms.
    pub http_idle_timeout_ms: u64,
    /// A request body or response that makes no progress (no byte read or written) for
    /// this long closes the connection; slow but steady transfers are not cut.
    /// Default 30,000 ms.
    pub http_body_timeout_ms: u64,
    /// A request body must arrive at this many bytes per second on average, counted
    /// from its head with one second of slack; a slower one is cut (`http_clock`), and
    /// any connection still reading a body can be displaced for a new one
    /// (`slots`). 0 = no rate rule (the stall timeout alone). Default 1024.
    pub http_body_min_rate: u64,
    /// Host names (besides IP literals, `localhost` and `*.localhost`) the HTTP doors
    /// answer to, against DNS rebinding (`service::net::doors`): exact names, `*.domain`
    /// for a domain's subdomains, `*` for any. Default none.
    pub http_allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`, `null`, or `*`) whose browser pages may call
    /// the HTTP doors besides the router's own, with CORS answers
    /// (`service::net::doors`). Default none.
    pub http_allowed_origins: Vec<String>,
    /// Write the routed requests as a Mooncake-format trace to this file (truncated at
    /// start; `crate::record`). Default none.
    pub record: Option<String>,
    /// The trace stops growing at this many bytes. Default 256 MiB.
    pub record_max_bytes: u64,
    /// Most distinct hash ids the trace renumbers (its id map's size); the recording
    /// stops when a request needs more. Default 4,194,304.
    pub record_max_ids: usize,
    /// OpenAI-compatible proxy listener (`crate::proxy`, docs/PROXY.md); empty or
    /// `off` = none. Default 127.0.0.1:8000.
    pub proxy_addr: String,
    /// The proxy's timeouts, limits, retries, breaker and client keys (`[proxy]`).
    pub proxy: crate::proxy::config::ProxySettings,
    /// The front door's policies: admission queue, priorities, tenants
    /// (`[admission]`, `crate::admission`).
    pub admission: crate::admission::config::AdmissionSettings,
    /// HuggingFace tokenizer directory per model (`[tokenizers]` table, `model =
    /// "dir"`; `--tokenizer MODEL=DIR`): `tokenizer.json` plus optional
    /// `tokenizer_config.json` / `chat_template.jinja` (`crate::tokenize`). Default none.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tokenizers: std::collections::BTreeMap<String, String>,
    /// LoRA adapters served under their own model name (`[lora_adapters]` table,
    /// `adapter = "base model"`; `--lora-adapter ADAPTER=BASE`): requests naming the
    /// adapter use the base model's tokenizer and the adapter's hash space. Default none.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub lora_adapters: std::collections::BTreeMap<String, String>,
    /// Tokenize prompts by the lean walk of each tokenizer's pipeline where it is
    /// exact for that tokenizer (`crate::tokenize` "lean"; checked at load and on
    /// sampled prompts); `false` runs HF's pipeline for every prompt. Default true.
    pub tokenize_lean: bool,
    /// Most of a shard's block hashes applied between two looks at its urgent inbox
    /// (routing queries wait behind at most this much ingest; `service::runtime::ingest_slice`).
    pub ingest_slice_hashes: usize,
    /// Router replicas on NATS JetStream (`[cluster]`, `crate::cluster`). Default off.
    pub cluster: crate::cluster::config::ClusterSettings,
    /// OpenTelemetry traces of proxied requests (`[trace]`, `crate::trace`). Default off.
    pub trace: crate::trace::config::TraceSettings,
    /// The endpoint picker of Kubernetes inference gateways (`[epp]`, `crate::epp`,
    /// docs/ENDPOINT_PICKER.md). Default off.
    pub epp: crate::epp::config::EppSettings,
    /// Pin executor N to the Nth CPU of the process's affinity mask (a cgroup cpuset,
    /// `taskset`), wrapping around it (`service::runtime::pinning`). `false` leaves the cores' threads
    /// to the kernel's scheduler (`Placement::Unbound`): on a machine whose CPUs the
    /// router shares (with its workers, clients, other services) a pinned core must
    /// wait for its one CPU while another process runs there, even with the other CPU
    /// idle, and every route waits for every core (docs/PERFORMANCE.md "Proxy
    /// overhead"). Default true (a router with CPUs of its own).
    pub pin_cores: bool,
    /// The kernel's scheduler slice for the cores' threads, µs (`sched_setattr`;
    /// `service::runtime::sched_slice`): on a machine whose CPUs the router shares, a
    /// core that started a decision is not preempted for another thread's slice before
    /// this. 0 = the kernel's default; else 100–100,000. Default 3,000.
    pub core_slice_us: u64,
    /// Microseconds a core's run loop keeps polling its inbox instead of parking while
    /// one of its cross-core queries (a decision's shard query, a lifecycle call held
    /// elsewhere) is outstanding, counted from the youngest such query (0 = park as
    /// usual). Spares the asking core a wake-up per decision with `--cores` > 1;
    /// costs at most this much CPU per round trip. Also how long a core stays awake
    /// for a query another core announced before tokenizing a proxied prompt (0: no
    /// announcements). Default [`DEFAULT_ANSWER_SPIN_US`].
    pub answer_spin_us: u64,
}

/// Bounds that keep memory and latency finite under any input.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Open TCP connections per listener per core. Default 1024.
    pub max_connections: usize,
    /// Largest binary frame accepted (bytes after the length prefix). Default 1 MiB.
    pub max_frame_bytes: usize,
    /// Largest HTTP request body. Default 4 MiB.
    pub max_body_bytes: usize,
    /// Registered workers. Default 4096.
    pub max_workers: usize,
    /// Indexed blocks per worker, whatever capacity it declares. Default 4,194,304.
    pub max_blocks_per_worker: u64,
    /// Block hashes (or token blocks) per routing request. Default 16,384.
    pub max_hashes_per_request: usize,
    /// In-flight tracked requests per core; past it routing answers "overloaded".
    /// Default 262,144.
    pub max_active_requests: usize,
    /// Depth of each cross-core queue (messages). Default 8192.
    pub queue_depth: usize,
    /// Connections per listener per core that have not completed their handshake
    /// (binary: `Hello`; HTTP: a first request head). A new one over this cap drops the
    /// oldest. Default 256.
    pub max_preauth_connections: usize,
    /// Largest `Hello` frame (bytes after the length prefix); a bigger length prefix
    /// closes the connection before the body is read. Default 16,384.
    pub max_hello_bytes: usize,
    /// Largest ZMQ message from an engine (sum of its frames), enforced on each frame
    /// header before the frame is read. Default 8 MiB.
    pub max_engine_message_bytes: usize,
    /// (block, worker, tier) entries in the whole index, over all workers and cores;
    /// stores beyond it are refused and counted. Default 67,108,864 (2^26: about 2 GiB
    /// of index at 25–32 bytes an entry).
    pub max_index_entries: u64,
    /// Largest prompt tokenized for routing (tokens); text longer than 16 bytes per
    /// allowed token is refused before tokenizing. Default 262,144.
    pub max_prompt_tokens: usize,
    /// Template steps (minijinja fuel) one chat render may take; past it the request
    /// is refused with 400. Default 2,000,000 (about 40 ms).
    pub chat_template_fuel: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_frame_bytes: 1 << 20,
            max_body_bytes: 4 << 20,
            max_workers: 4096,
            max_blocks_per_worker: 1 << 22,
            max_hashes_per_request: 16_384,
            max_active_requests: 262_144,
            queue_depth: 8192,
            max_preauth_connections: 256,
            max_hello_bytes: 16 << 10,
            max_engine_message_bytes: 8 << 20,
            max_index_entries: 1 << 26,
            max_prompt_tokens: crate::tokenize::DEFAULT_MAX_PROMPT_TOKENS,
            chat_template_fuel: crate::tokenize::chat::DEFAULT_FUEL,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            events_addr: "127.0.0.1:7400".into(),
            api_addr: "127.0.0.1:7401".into(),
            http_addr: "127.0.0.1:7480".into(),
            cores: None,
            index_layout: IndexLayout::Sharded,
            heartbeat_timeout_ms: 10_000,
            request_ttl_ms: DEFAULT_REQUEST_TTL_MS,
            spin_before_park_us: 50,
            state_dir: None,
            snapshot_interval_ms: 30_000,
            auth_token: None,
            auth_token_file: None,
            insecure: false,
            worker_tokens_file: None,
            limits: Limits::default(),
            router: RouterConfig::default(),
            engines: Vec::new(),
            engines_file: None,
            engine_unknown_medium_tier: crate::types::Tier::Disk,
            hello_timeout_ms: 5_000,
            api_idle_timeout_ms: 300_000,
            http_header_timeout_ms: 10_000,
            http_idle_timeout_ms: 60_000,
            http_body_timeout_ms: 30_000,
            http_body_min_rate: DEFAULT_HTTP_BODY_MIN_RATE,
            http_allowed_hosts: Vec::new(),
            http_allowed_origins: Vec::new(),
            record: None,
            record_max_bytes: 256 << 20,
            record_max_ids: 1 << 22,
            proxy_addr: crate::proxy::config::DEFAULT_PROXY_ADDR.into(),
            proxy: Default::default(),
            admission: Default::default(),
            tokenizers: Default::default(),
            lora_adapters: Default::default(),
            ingest_slice_hashes: DEFAULT_INGEST_SLICE_HASHES,
            cluster: Default::default(),
            trace: Default::default(),
            epp: Default::default(),
            pin_cores: true,
            core_slice_us: 3_000,
            tokenize_lean: true,
            answer_spin_us: DEFAULT_ANSWER_SPIN_US,
        }
    }
}

impl Settings {
    /// Parses a TOML document (all keys optional).
    pub fn from_toml(text: &str) -> Result<Settings, String> {
        toml::from_str(text).map_err(|e| format!("config file: {e}"))
    }

    pub fn validate(&self) -> Result<(), String> {
        self.router.validate()?;
        self.cluster.validate()?;
        self.trace.validate()?;
        self.epp.validate()?;
        for (name, addr) in [
            ("events_addr", &self.events_addr),
            ("api_addr", &self.api_addr),
            ("http_addr", &self.http_addr),
        ] {
            addr.parse::<std::net::SocketAddr>()
                .map_err(|e| format!("{name} {addr:?}: {e}"))?;
        }
        if let Some(c) = self.cores {
            if c == 0 || c > 256 {
                return Err("cores must be 1..=256".into());
            }
        }
        let l = &self.limits;
        if l.max_connections == 0
            || l.max_frame_bytes < 64
            || l.max_workers == 0
            || l.max_workers > crate::types::MAX_WORKER_SLOTS
            || l.max_blocks_per_worker == 0
            || l.max_hashes_per_request == 0
            || l.max_active_requests == 0
            || l.queue_depth < 16
            || l.max_index_entries == 0
        {
            return Err("limits must be positive (max_frame_bytes >= 64, queue_depth >= 16, max_workers <= 65535)".into());
        }
        if l.max_preauth_connections == 0 || l.max_hello_bytes < 64 {
            return Err("max_preauth_connections must be > 0 and max_hello_bytes >= 64".into());
        }
        if l.max_engine_message_bytes < 1024 {
            return Err("max_engine_message_bytes must be >= 1024".into());
        }
        for (name, v) in [
            ("hello_timeout_ms", self.hello_timeout_ms),
            ("api_idle_timeout_ms", self.api_idle_timeout_ms),
            ("http_header_timeout_ms", self.http_header_timeout_ms),
            ("http_idle_timeout_ms", self.http_idle_timeout_ms),
            ("http_body_timeout_ms", self.http_body_timeout_ms),
        ] {
            if v < 10 {
                return Err(format!("{name} must be >= 10"));
            }
        }
        validate_doors(&self.http_allowed_hosts, &self.http_allowed_origins)?;
        if self.heartbeat_timeout_ms == 0 {
            return Err("heartbeat_timeout_ms must be > 0".into());
        }
        if !(100..=MAX_REQUEST_TTL_MS).contains(&self.request_ttl_ms) {
            return Err(format!(
                "request_ttl_ms must be between 100 and {MAX_REQUEST_TTL_MS} (7 days)"
            ));
        }
        if self.snapshot_interval_ms < 100 {
            return Err("snapshot_interval_ms must be >= 100".into());
        }
        if self.auth_token.as_deref() == Some("") {
            return Err("auth_token must not be empty".into());
        }
        if self.auth_token.is_none() && self.auth_token_file.is_none() && !self.insecure {
            for addr in [&self.events_addr, &self.api_addr, &self.http_addr] {
                let loopback = addr
                    .parse::<std::net::SocketAddr>()
                    .map(|a| a.ip().is_loopback())
                    .unwrap_or(false);
                if !loopback {
                    return Err(format!(
                        "refusing to listen on non-loopback {addr} without an auth token \
                         (set auth_token / auth_token_file, or pass --insecure)"
                    ));
                }
            }
        }
        if self.worker_tokens_file.is_some()
            && self.auth_token.is_none()
            && self.auth_token_file.is_none()
        {
            return Err(
                "worker_tokens_file needs a shared auth_token or auth_token_file \
                        (frontends and admins authenticate with it)"
                    .into(),
            );
        }
        if self.engine_unknown_medium_tier == crate::types::Tier::Device {
            return Err(
                "engine_unknown_medium_tier must be host or disk: a medium neither engine \
                 defines is never credited as device"
                    .into(),
            );
        }
        crate::engines::config::validate_all(&self.engines)?;
        if self.engines_file.as_deref() == Some("") {
            return Err("engines_file must name a file".into());
        }
        self.proxy.validate()?;
        self.admission.validate()?;
        if !crate::proxy::config::is_off(&self.proxy_addr) {
            let a = self
                .proxy_addr
                .parse::<std::net::SocketAddr>()
                .map_err(|e| format!("proxy_addr {:?}: {e}", self.proxy_addr))?;
            let keyed = !self.proxy.api_keys.is_empty() || self.proxy.api_keys_file.is_some();
            if !a.ip().is_loopback()
                && !keyed
                && self.auth_token.is_none()
                && self.auth_token_file.is_none()
                && !self.insecure
            {
                return Err(format!(
                    "refusing to listen on non-loopback proxy_addr {a} without an auth token \
                     or proxy api_keys (or pass --insecure)"
                ));
            }
        }
        if self.ingest_slice_hashes == 0 {
            return Err("ingest_slice_hashes must be > 0".into());
        }
        if self.core_slice_us != 0 && !CORE_SLICE_US.contains(&self.core_slice_us) {
            return Err(format!(
                "core_slice_us must be 0 (the kernel's default) or {}..={}",
                CORE_SLICE_US.start(),
                CORE_SLICE_US.end()
            ));
        }
        if self.answer_spin_us > MAX_ANSWER_SPIN_US {
            return Err(format!(
                "answer_spin_us must be at most {MAX_ANSWER_SPIN_US} (a core spins that long per outstanding answer)"
            ));
        }
        if self.record.is_some() {
            let bs = self.router.block_size;
            if !crate::record::TOKENS_PER_ID.is_multiple_of(bs) {
                return Err(format!(
                    "record: block_size {bs} must divide {} (Mooncake hash ids cover {} tokens)",
                    crate::record::TOKENS_PER_ID,
                    crate::record::TOKENS_PER_ID
                ));
            }
            if self.record.as_deref() == Some("") {
                return Err("record must name a file".into());
            }
            if self.record_max_bytes == 0 || self.record_max_ids == 0 {
                return Err("record_max_bytes and record_max_ids must be > 0".into());
            }
        }
        if l.max_prompt_tokens == 0 {
            return Err("max_prompt_tokens must be > 0".into());
        }
        if l.chat_template_fuel == 0 {
            return Err("chat_template_fuel must be > 0".into());
        }
        for (model, dir) in &self.tokenizers {
            if model.is_empty() || dir.is_empty() {
                return Err(format!(
                    "tokenizers: {model:?} = {dir:?} needs a model and a directory"
                ));
            }
        }
        for (adapter, base) in &self.lora_adapters {
            if !self.tokenizers.contains_key(base) {
                return Err(format!(
                    "lora_adapters: {adapter:?} names base model {base:?}, which has no tokenizer"
                ));
            }
        }
        Ok(())
    }

    /// The tokenizers of `tokenizers`, bounded by `limits.max_prompt_tokens` and
    /// `limits.chat_template_fuel`, with `lora_adapters` (loaded from disk: any
    /// unreadable or broken file is an error naming the model and file).
    pub fn load_tokenizers(&self) -> Result<crate::tokenize::Tokenizers, String> {
        let models: Vec<(String, std::path::PathBuf)> = self
            .tokenizers
            .iter()
            .map(|(m, d)| (m.clone(), std::path::PathBuf::from(d)))
            .collect();
        let adapters: Vec<(String, String)> = self
            .lora_adapters
            .iter()
            .map(|(a, b)| (a.clone(), b.clone()))
            .collect();
        crate::tokenize::Tokenizers::load(&models)?
            .with_max_prompt_tokens(self.limits.max_prompt_tokens)
            .with_template_fuel(self.limits.chat_template_fuel)
            .with_lean(self.tokenize_lean)
            .with_adapters(&adapters)
    }

    /// The effective shared secret: `auth_token`, or the first line of
    /// `auth_token_file`.
    pub fn resolve_token(&self) -> Result<Option<String>, String> {
        if let Some(t) = &self.auth_token {
            return Ok(Some(t.clone()));
        }
        match &self.auth_token_file {
            None => Ok(None),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("reading auth_token_file {path}: {e}"))?;
                let t = text.lines().next().unwrap_or("").trim().to_string();
                if t.is_empty() {
                    return Err(format!("auth_token_file {path} is empty"));
                }
                Ok(Some(t))
            }
        }
    }
}

/// `http_allowed_hosts` are bare names (no scheme, path or port; `*.domain` or `*`);
/// `http_allowed_origins` are `scheme://host[:port]`, `null` or `*`.
fn validate_doors(hosts: &[String], origins: &[String]) -> Result<(), String> {
    let name_ok = |h: &str| {
        let h = h.strip_prefix("*.").unwrap_or(h);
        !h.is_empty()
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    for h in hosts {
        if h != "*" && !name_ok(h) {
            return Err(format!(
                "http_allowed_hosts: {h:?} is not a host name (NAME, *.DOMAIN or *; no scheme or port)"
            ));
        }
    }
    for o in origins {
        let ok = o == "*"
            || o == "null"
            || o.split_once("://").is_some_and(|(scheme, rest)| {
                matches!(scheme, "http" | "https")
                    && !rest.is_empty()
                    && !rest.contains('/')
                    && !rest.contains(char::is_whitespace)
            });
        if !ok {
            return Err(format!(
                "http_allowed_origins: {o:?} is not an origin (http[s]://HOST[:PORT], null or *)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
