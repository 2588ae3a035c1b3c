//! The proxy's flags (`--proxy-*`, env `KVROUTE_PROXY_*`), flattened into `kvroute
//! serve`'s arguments (`cli::ServeArgs`), and how they overlay `[proxy]`
//! ([`ProxyArgs::apply`]). The listen address itself, `--proxy-addr`, is a service
//! setting and stays in `cli`.
//!
//! Each field is named like its [`ProxySettings`] field, so the overlay is one list;
//! an unset flag leaves the file's or the default value in place. The argument ids
//! carry a `proxy_` prefix, since clap ids are shared with `ServeArgs`' own fields.

use super::config::ProxySettings;
use clap::Args;

#[derive(Args, Debug, Default, Clone)]
pub struct ProxyArgs {
    #[arg(
        id = "proxy_request_timeout_ms",
        long = "proxy-request-timeout-ms",
        env = "KVROUTE_PROXY_REQUEST_TIMEOUT_MS"
    )]
    pub request_timeout_ms: Option<u64>,
    #[arg(
        id = "proxy_connect_timeout_ms",
        long = "proxy-connect-timeout-ms",
        env = "KVROUTE_PROXY_CONNECT_TIMEOUT_MS"
    )]
    pub connect_timeout_ms: Option<u64>,
    #[arg(
        id = "proxy_max_concurrent",
        long = "proxy-max-concurrent",
        env = "KVROUTE_PROXY_MAX_CONCURRENT"
    )]
    pub max_concurrent: Option<usize>,
    #[arg(
        id = "proxy_max_body_bytes",
        long = "proxy-max-body-bytes",
        env = "KVROUTE_PROXY_MAX_BODY_BYTES"
    )]
    pub max_body_bytes: Option<usize>,
    #[arg(
        id = "proxy_retries",
        long = "proxy-retries",
        env = "KVROUTE_PROXY_RETRIES"
    )]
    pub retries: Option<u32>,
    #[arg(
        id = "proxy_retry_backoff_ms",
        long = "proxy-retry-backoff-ms",
        env = "KVROUTE_PROXY_RETRY_BACKOFF_MS"
    )]
    pub retry_backoff_ms: Option<u64>,
    #[arg(
        id = "proxy_breaker_threshold",
        long = "proxy-breaker-threshold",
        env = "KVROUTE_PROXY_BREAKER_THRESHOLD"
    )]
    pub breaker_threshold: Option<u32>,
    #[arg(
        id = "proxy_breaker_open_ms",
        long = "proxy-breaker-open-ms",
        env = "KVROUTE_PROXY_BREAKER_OPEN_MS"
    )]
    pub breaker_open_ms: Option<u64>,
    #[arg(
        id = "proxy_pool_max_idle",
        long = "proxy-pool-max-idle",
        env = "KVROUTE_PROXY_POOL_MAX_IDLE"
    )]
    pub pool_max_idle: Option<usize>,
    #[arg(
        id = "proxy_max_prefill_response_bytes",
        long = "proxy-max-prefill-response-bytes",
        env = "KVROUTE_PROXY_MAX_PREFILL_RESPONSE_BYTES"
    )]
    pub max_prefill_response_bytes: Option<usize>,
    #[arg(
        id = "proxy_tokenize_inline_max_bytes",
        long = "proxy-tokenize-inline-max-bytes",
        env = "KVROUTE_PROXY_TOKENIZE_INLINE_MAX_BYTES"
    )]
    pub tokenize_inline_max_bytes: Option<usize>,
    /// Responses ids whose worker is remembered for `previous_response_id` follow-ups.
    #[arg(
        id = "proxy_responses_max_entries",
        long = "proxy-responses-max-entries",
        env = "KVROUTE_PROXY_RESPONSES_MAX_ENTRIES"
    )]
    pub responses_max_entries: Option<usize>,
    /// How long a Responses id's worker is remembered, ms.
    #[arg(
        id = "proxy_responses_ttl_ms",
        long = "proxy-responses-ttl-ms",
        env = "KVROUTE_PROXY_RESPONSES_TTL_MS"
    )]
    pub responses_ttl_ms: Option<u64>,
    /// At the first SIGTERM / SIGINT, how long proxied requests in flight may run on
    /// (new connections refused) before the service stops; 0 = stop at once.
    #[arg(
        id = "proxy_drain_ms",
        long = "proxy-drain-ms",
        env = "KVROUTE_PROXY_DRAIN_MS"
    )]
    pub drain_ms: Option<u64>,
    /// Client API keys for the proxy port, comma-separated (prefer the file).
    #[arg(
        id = "proxy_api_keys",
        long = "proxy-api-keys",
        env = "KVROUTE_PROXY_API_KEYS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub api_keys: Option<Vec<String>>,
    /// File of client API keys for the proxy port, one per line.
    #[arg(
        id = "proxy_api_keys_file",
        long = "proxy-api-keys-file",
        env = "KVROUTE_PROXY_API_KEYS_FILE"
    )]
    pub api_keys_file: Option<String>,
    /// Key sent to the workers as `Authorization: Bearer` (prefer the file).
    #[arg(
        id = "proxy_upstream_api_key",
        long = "proxy-upstream-api-key",
        env = "KVROUTE_PROXY_UPSTREAM_API_KEY",
        hide_env_values = true
    )]
    pub upstream_api_key: Option<String>,
    /// File holding the key sent to the workers (its first non-blank line).
    #[arg(
        id = "proxy_upstream_api_key_file",
        long = "proxy-upstream-api-key-file",
        env = "KVROUTE_PROXY_UPSTREAM_API_KEY_FILE"
    )]
    pub upstream_api_key_file: Option<String>,
}

impl ProxyArgs {
    /// The flags that were given, over `p`.
    pub fn apply(&self, p: &mut ProxySettings) {
        macro_rules! overlay {
            ($($field:ident),*) => {
                $( if let Some(v) = self.$field { p.$field = v; } )*
            };
        }
        overlay!(
            request_timeout_ms,
            connect_timeout_ms,
            max_concurrent,
            max_body_bytes,
            retries,
            retry_backoff_ms,
            breaker_threshold,
            breaker_open_ms,
            pool_max_idle,
            max_prefill_response_bytes,
            tokenize_inline_max_bytes,
            responses_max_entries,
            responses_ttl_ms,
            drain_ms
        );
        if let Some(k) = &self.api_keys {
            p.api_keys = k.iter().filter(|k| !k.is_empty()).cloned().collect();
        }
        if self.api_keys_file.is_some() {
            p.api_keys_file = self.api_keys_file.clone();
        }
        // A flag or env for either form of the upstream key replaces both of the file's.
        if self.upstream_api_key.is_some() || self.upstream_api_key_file.is_some() {
            p.upstream_api_key = self.upstream_api_key.clone();
            p.upstream_api_key_file = self.upstream_api_key_file.clone();
        }
    }
}
