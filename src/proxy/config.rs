//! Settings of the proxy (`[proxy]` in TOML; flags `--proxy-*`, env `KVROUTE_PROXY_*`).
//! The listen address itself is `Settings::proxy_addr` (empty or `off` = no proxy).
//! `validate` is the one place that rejects unusable values.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxySettings {
    /// Time the upstream has to answer with response headers, and the longest gap
    /// between two chunks of its body afterwards. Before the headers an expiry is a
    /// retried failure; after, the stream ends with an error event. Default 300,000 ms.
    pub request_timeout_ms: u64,
    /// TCP connect timeout to a worker (a retried failure). Default 2,000 ms.
    pub connect_timeout_ms: u64,
    /// Proxied requests in flight over all cores; beyond it 429. Default 4096.
    pub max_concurrent: usize,
    /// Largest client request body; beyond it 413 (refused from `content-length`
    /// before reading, else as soon as the read passes it). Default 8 MiB.
    pub max_body_bytes: usize,
    /// Re-routes after a failure before the first response byte. Default 2.
    pub retries: u32,
    /// Backoff before the first re-route, doubled for each further one. Default 25 ms.
    pub retry_backoff_ms: u64,
    /// Consecutive failures that open a worker's circuit breaker. Default 3.
    pub breaker_threshold: u32,
    /// An open breaker stays open this long, then one `GET {url}/health` probe decides
    /// (half-open). Default 5,000 ms.
    pub breaker_open_ms: u64,
    /// Idle keep-alive connections kept per worker per core. Default 32.
    pub pool_max_idle: usize,
    /// Client API keys accepted as `Authorization: Bearer` on the proxy port, besides
    /// the service token. Default none.
    pub api_keys: Vec<String>,
    /// File of client API keys, one per line (blank lines and `#` comments skipped).
    pub api_keys_file: Option<String>,
    /// Key sent to every worker as `Authorization: Bearer` (both legs of a P/D
    /// request and the breaker's health probe): for engines started with an API key
    /// (vLLM `--api-key`), which answer 401 without it. Default none.
    pub upstream_api_key: Option<String>,
    /// File holding the upstream key (its first non-blank line), instead of
    /// `upstream_api_key`.
    pub upstream_api_key_file: Option<String>,
    /// Largest prefill-leg answer read (P/D flow), in bytes. Default 1 MiB.
    pub max_prefill_response_bytes: usize,
    /// At the first SIGTERM / SIGINT the proxy drains: it stops accepting connections,
    /// `/health` and `/readyz` answer 503 `draining`, every response closes its
    /// connection, and proxied requests in flight run on for up to this long before the
    /// service stops (a second signal stops it at once). Keep it below the
    /// orchestrator's kill deadline (Kubernetes: 30 s by default) less the shutdown
    /// snapshot's time. 0 = stop at once. Default 20,000 ms.
    pub drain_ms: u64,
    /// Request bodies up to this many bytes are tokenized on the core that accepted
    /// them; larger ones on that core's blocking thread (glommio `spawn_blocking`),
    /// so a long prompt (a 40 KB prompt takes ~2 ms) does not hold the core's other
    /// streams. 0 = every tokenized prompt off the core. Default 8,192 bytes.
    pub tokenize_inline_max_bytes: usize,
    /// Responses ids whose worker the proxy remembers for `previous_response_id`
    /// follow-ups (per process; the oldest is forgotten first). Default 65,536.
    pub responses_max_entries: usize,
    /// A remembered Responses id is forgotten this long after its answer. Default
    /// 3,600,000 ms (one hour).
    pub responses_ttl_ms: u64,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            request_timeout_ms: 300_000,
            connect_timeout_ms: 2_000,
            max_concurrent: 4096,
            max_body_bytes: 8 << 20,
            retries: 2,
            retry_backoff_ms: 25,
            breaker_threshold: 3,
            breaker_open_ms: 5_000,
            pool_max_idle: 32,
            api_keys: Vec::new(),
            api_keys_file: None,
            upstream_api_key: None,
            upstream_api_key_file: None,
            max_prefill_response_bytes: 1 << 20,
            tokenize_inline_max_bytes: 8192,
            drain_ms: 20_000,
            responses_max_entries: super::agents::RESPONSES_CAPACITY,
            responses_ttl_ms: super::agents::RESPONSES_TTL_MS,
        }
    }
}

/// Largest `responses_max_entries` (each entry holds an id of at most 256 bytes).
pub const MAX_RESPONSES: usize = 1 << 20;

/// Default `proxy_addr`.
pub const DEFAULT_PROXY_ADDR: &str = "127.0.0.1:8000";

/// Whether `proxy_addr` disables the proxy.
pub fn is_off(addr: &str) -> bool {
    addr.is_empty() || addr.eq_ignore_ascii_case("off")
}

impl ProxySettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.request_timeout_ms < 10 || self.connect_timeout_ms < 10 {
            return Err("proxy request_timeout_ms and connect_timeout_ms must be >= 10".into());
        }
        if self.max_concurrent == 0 || self.max_body_bytes < 64 {
            return Err("proxy max_concurrent must be > 0 and max_body_bytes >= 64".into());
        }
        if self.drain_ms > 3_600_000 {
            return Err("proxy drain_ms must be <= 3600000 (one hour)".into());
        }
        if self.retries > 16 || self.retry_backoff_ms > 60_000 {
            return Err("proxy retries must be <= 16 and retry_backoff_ms <= 60000".into());
        }
        if self.breaker_threshold == 0 || self.breaker_open_ms < 10 {
            return Err("proxy breaker_threshold must be > 0 and breaker_open_ms >= 10".into());
        }
        if self.max_prefill_response_bytes < 1024 {
            return Err("proxy max_prefill_response_bytes must be >= 1024".into());
        }
        if !(1..=MAX_RESPONSES).contains(&self.responses_max_entries)
            || !(1_000..=7 * 86_400_000).contains(&self.responses_ttl_ms)
        {
            return Err(format!(
                "proxy responses_max_entries must be 1..={MAX_RESPONSES} and responses_ttl_ms 1000..=604800000"
            ));
        }
        if self.api_keys.iter().any(|k| k.is_empty()) {
            return Err("proxy api_keys must not be empty strings".into());
        }
        if self.upstream_api_key.is_some() && self.upstream_api_key_file.is_some() {
            return Err("set proxy upstream_api_key or upstream_api_key_file, not both".into());
        }
        if let Some(k) = &self.upstream_api_key {
            check_upstream_key(k)?;
        }
        Ok(())
    }

    /// The key sent to the workers: `upstream_api_key`, or the first non-blank line
    /// of `upstream_api_key_file` (read once, at start).
    pub fn resolve_upstream_key(&self) -> Result<Option<String>, String> {
        let key = match (&self.upstream_api_key, &self.upstream_api_key_file) {
            (Some(k), _) => k.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| format!("reading proxy upstream_api_key_file {path}: {e}"))?
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .ok_or_else(|| format!("proxy upstream_api_key_file {path} holds no key"))?
                .to_string(),
            (None, None) => return Ok(None),
        };
        check_upstream_key(&key)?;
        Ok(Some(key))
    }

    /// The accepted client keys: `api_keys` plus the lines of `api_keys_file`.
    pub fn resolve_keys(&self) -> Result<Vec<String>, String> {
        let mut keys = self.api_keys.clone();
        if let Some(path) = &self.api_keys_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading proxy api_keys_file {path}: {e}"))?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(String::from),
            );
        }
        Ok(keys)
    }
}

/// An upstream key must make a valid header value, `Bearer <key>`: printable ASCII
/// without spaces (a control character would split the request head).
fn check_upstream_key(k: &str) -> Result<(), String> {
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "proxy upstream_api_key must be non-empty printable ASCII without spaces".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_refused() {
        ProxySettings::default().validate().unwrap();
        let bad = ProxySettings {
            breaker_threshold: 0,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        for (n, ttl) in [(0, 60_000), (MAX_RESPONSES + 1, 60_000), (16, 999)] {
            let bad = ProxySettings {
                responses_max_entries: n,
                responses_ttl_ms: ttl,
                ..Default::default()
            };
            assert!(bad.validate().is_err(), "{n} {ttl}");
        }
        assert!(is_off("") && is_off("OFF") && !is_off(DEFAULT_PROXY_ADDR));
    }

    #[test]
    fn keys_come_from_the_list_and_the_file() {
        let dir = std::env::temp_dir().join(format!("kvr-keys-{}", std::process::id()));
        std::fs::write(&dir, "# comment\nk2\n\n k3 \n").unwrap();
        let s = ProxySettings {
            api_keys: vec!["k1".into()],
            api_keys_file: Some(dir.display().to_string()),
            ..Default::default()
        };
        assert_eq!(s.resolve_keys().unwrap(), ["k1", "k2", "k3"]);
        let _ = std::fs::remove_file(dir);
    }

    #[test]
    fn the_upstream_key_comes_from_the_setting_or_the_file_and_must_be_a_header() {
        assert_eq!(ProxySettings::default().resolve_upstream_key(), Ok(None));
        let set = |k: &str| ProxySettings {
            upstream_api_key: Some(k.into()),
            ..Default::default()
        };
        assert_eq!(set("sk-1").resolve_upstream_key(), Ok(Some("sk-1".into())));
        for bad in ["", "a b", "a\r\nx-evil: 1", "ключ"] {
            assert!(set(bad).validate().is_err(), "{bad:?}");
            assert!(set(bad).resolve_upstream_key().is_err(), "{bad:?}");
        }
        let path = std::env::temp_dir().join(format!("kvr-upkey-{}", std::process::id()));
        let from_file = ProxySettings {
            upstream_api_key_file: Some(path.display().to_string()),
            ..Default::default()
        };
        std::fs::write(&path, "\n  sk-file  \nsecond\n").unwrap();
        assert_eq!(from_file.resolve_upstream_key(), Ok(Some("sk-file".into())));
        std::fs::write(&path, "\n \n").unwrap();
        assert!(from_file.resolve_upstream_key().is_err());
        let both = ProxySettings {
            upstream_api_key: Some("k".into()),
            ..from_file.clone()
        };
        assert!(both.validate().is_err());
        let _ = std::fs::remove_file(path);
        assert!(ProxySettings {
            upstream_api_key_file: Some("/nonexistent/kvr-key".into()),
            ..Default::default()
        }
        .resolve_upstream_key()
        .is_err());
    }
}
