//! Service settings: listen addresses, cores, limits, liveness, and the routing knobs.
//!
//! Plain data with embedded defaults, so `kvroute serve` needs no config file. Sources
//! are layered: defaults < TOML file (`--config`) < environment variables < flags (see
//! `cli`). `validate` is the single place that rejects unusable combinations.

use crate::config::RouterConfig;
use serde::{Deserialize, Serialize};

/// Everything `kvroute serve` can be told.
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
    /// A worker with a binary connection that sends nothing (heartbeat or event) for this
    /// long leaves routing until it returns. Default 10,000 ms.
    pub heartbeat_timeout_ms: u64,
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
    pub limits: Limits,
    pub router: RouterConfig,
    /// vLLM / SGLang engines to subscribe to over ZMQ (`[[engines]]`), each bound to a
    /// worker (README "Pointing kvroute at a vLLM fleet").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub engines: Vec<crate::engines::config::EngineEndpoint>,
    /// Write the routed requests as a Mooncake-format trace to this file (truncated at
    /// start; `crate::record`). Default none.
    pub record: Option<String>,
    /// The trace stops growing at this many bytes. Default 256 MiB.
    pub record_max_bytes: u64,
    /// Most distinct hash ids the trace renumbers (its id map's size); the recording
    /// stops when a request needs more. Default 4,194,304.
    pub record_max_ids: usize,
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
            heartbeat_timeout_ms: 10_000,
            spin_before_park_us: 50,
            state_dir: None,
            snapshot_interval_ms: 30_000,
            auth_token: None,
            auth_token_file: None,
            insecure: false,
            limits: Limits::default(),
            router: RouterConfig::default(),
            engines: Vec::new(),
            record: None,
            record_max_bytes: 256 << 20,
            record_max_ids: 1 << 22,
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
        {
            return Err("limits must be positive (max_frame_bytes >= 64, queue_depth >= 16, max_workers <= 65535)".into());
        }
        if self.heartbeat_timeout_ms == 0 {
            return Err("heartbeat_timeout_ms must be > 0".into());
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
        crate::engines::config::validate_all(&self.engines)?;
        if self.record.is_some() {
            let bs = self.router.block_size;
            if crate::record::TOKENS_PER_ID % bs != 0 {
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
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_documented_ports() {
        let s = Settings::default();
        s.validate().unwrap();
        assert_eq!(s.events_addr, "127.0.0.1:7400");
        assert_eq!(s.api_addr, "127.0.0.1:7401");
        assert_eq!(s.http_addr, "127.0.0.1:7480");
    }

    #[test]
    fn toml_layers_over_defaults() {
        let s = Settings::from_toml(
            "cores = 1\n[router]\noverlap_score_credit = 0.25\n[limits]\nmax_workers = 8\n",
        )
        .unwrap();
        assert_eq!(s.cores, Some(1));
        assert_eq!(s.router.overlap_score_credit, 0.25);
        assert_eq!(s.limits.max_workers, 8);
        assert_eq!(s.limits.queue_depth, 8192);
        assert!(Settings::from_toml("bogus = 1").is_err());
        let bad = Settings {
            http_addr: "nope".into(),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }
}
