//! The `[admission]` flags (`--admission-*`, env `KVROUTE_ADMISSION_*`), flattened into
//! `kvroute serve`'s arguments (`cli::ServeArgs`), and how they overlay the file's
//! values ([`AdmissionArgs::apply`]). Each field is named like its
//! [`AdmissionSettings`] field; an unset flag leaves the file's or the default value.
//! Named tenants (`[[admission.tenants]]`) have no flag: they come from the file or
//! from `tenants_file` (`--admission-tenants-file`), which keeps API keys off command
//! lines.

use super::config::AdmissionSettings;
use clap::Args;

#[derive(Args, Debug, Default, Clone)]
pub struct AdmissionArgs {
    /// Queue requests that every worker refused (429) or the router found busy
    /// instead of answering 429 (true|false).
    #[arg(
        id = "admission_queue",
        long = "admission-queue",
        env = "KVROUTE_ADMISSION_QUEUE"
    )]
    pub queue: Option<bool>,
    /// Also queue at the proxy's concurrency cap (true|false).
    #[arg(
        id = "admission_queue_at_max_concurrent",
        long = "admission-queue-at-max-concurrent",
        env = "KVROUTE_ADMISSION_QUEUE_AT_MAX_CONCURRENT"
    )]
    pub queue_at_max_concurrent: Option<bool>,
    /// Requests queued per model (per replica).
    #[arg(
        id = "admission_max_queued",
        long = "admission-max-queued",
        env = "KVROUTE_ADMISSION_MAX_QUEUED"
    )]
    pub max_queued: Option<usize>,
    /// Longest wait in the queue before a 429.
    #[arg(
        id = "admission_max_wait_ms",
        long = "admission-max-wait-ms",
        env = "KVROUTE_ADMISSION_MAX_WAIT_MS"
    )]
    pub max_wait_ms: Option<u64>,
    /// Share of the queue one tenant may hold, in (0, 1].
    #[arg(
        id = "admission_tenant_share",
        long = "admission-tenant-share",
        env = "KVROUTE_ADMISSION_TENANT_SHARE"
    )]
    pub tenant_share: Option<f64>,
    /// One priority class gained per this much waiting (0 = no aging).
    #[arg(
        id = "admission_aging_ms",
        long = "admission-aging-ms",
        env = "KVROUTE_ADMISSION_AGING_MS"
    )]
    pub aging_ms: Option<u64>,
    /// Priorities are clamped to [-N, N].
    #[arg(
        id = "admission_max_priority",
        long = "admission-max-priority",
        env = "KVROUTE_ADMISSION_MAX_PRIORITY"
    )]
    pub max_priority: Option<i32>,
    #[arg(
        id = "admission_priority_header",
        long = "admission-priority-header",
        env = "KVROUTE_ADMISSION_PRIORITY_HEADER"
    )]
    pub priority_header: Option<String>,
    #[arg(
        id = "admission_deadline_header",
        long = "admission-deadline-header",
        env = "KVROUTE_ADMISSION_DEADLINE_HEADER"
    )]
    pub deadline_header: Option<String>,
    /// The tenant is this header's value (else the API key).
    #[arg(
        id = "admission_tenant_header",
        long = "admission-tenant-header",
        env = "KVROUTE_ADMISSION_TENANT_HEADER"
    )]
    pub tenant_header: Option<String>,
    #[arg(
        id = "admission_tenant_requests_per_s",
        long = "admission-tenant-requests-per-s",
        env = "KVROUTE_ADMISSION_TENANT_REQUESTS_PER_S"
    )]
    pub tenant_requests_per_s: Option<f64>,
    #[arg(
        id = "admission_tenant_prompt_tokens_per_s",
        long = "admission-tenant-prompt-tokens-per-s",
        env = "KVROUTE_ADMISSION_TENANT_PROMPT_TOKENS_PER_S"
    )]
    pub tenant_prompt_tokens_per_s: Option<f64>,
    #[arg(
        id = "admission_tenant_burst_ms",
        long = "admission-tenant-burst-ms",
        env = "KVROUTE_ADMISSION_TENANT_BURST_MS"
    )]
    pub tenant_burst_ms: Option<u64>,
    #[arg(
        id = "admission_max_tenants",
        long = "admission-max-tenants",
        env = "KVROUTE_ADMISSION_MAX_TENANTS"
    )]
    pub max_tenants: Option<usize>,
    #[arg(
        id = "admission_max_tenant_labels",
        long = "admission-max-tenant-labels",
        env = "KVROUTE_ADMISSION_MAX_TENANT_LABELS"
    )]
    pub max_tenant_labels: Option<usize>,
    /// A TOML file of `[[tenants]]` (name, api_key / header_value, priority, limits).
    #[arg(
        id = "admission_tenants_file",
        long = "admission-tenants-file",
        env = "KVROUTE_ADMISSION_TENANTS_FILE"
    )]
    pub tenants_file: Option<String>,
}

impl AdmissionArgs {
    /// The flags that were given, over `a`.
    pub fn apply(&self, a: &mut AdmissionSettings) {
        macro_rules! overlay {
            ($($field:ident),*) => {
                $( if let Some(v) = self.$field.clone() { a.$field = v; } )*
            };
        }
        overlay!(
            queue,
            queue_at_max_concurrent,
            max_queued,
            max_wait_ms,
            tenant_share,
            aging_ms,
            max_priority,
            priority_header,
            deadline_header,
            tenant_burst_ms,
            max_tenants,
            max_tenant_labels
        );
        macro_rules! overlay_opt {
            ($($field:ident),*) => {
                $( if self.$field.is_some() { a.$field = self.$field.clone(); } )*
            };
        }
        overlay_opt!(
            tenant_header,
            tenant_requests_per_s,
            tenant_prompt_tokens_per_s,
            tenants_file
        );
    }
}

/// The policies' routing knobs (`[router]` keys: sessions and local prefill), flagged
/// like the other routing knobs (`--session-*`, `--local-prefill-*`, env `KVROUTE_*`).
#[derive(Args, Debug, Default, Clone)]
pub struct PolicyRouterArgs {
    /// Session affinity table entries (0 = off).
    #[arg(long, env = "KVROUTE_SESSION_MAX_ENTRIES")]
    pub session_max_entries: Option<usize>,
    /// A session unseen this long is forgotten.
    #[arg(long, env = "KVROUTE_SESSION_TTL_MS")]
    pub session_ttl_ms: Option<u64>,
    /// Header naming a request's session.
    #[arg(long, env = "KVROUTE_SESSION_HEADER")]
    pub session_header: Option<String>,
    /// Without the header, the OpenAI `user` field names the session (true|false).
    #[arg(long, env = "KVROUTE_SESSION_FROM_USER")]
    pub session_from_user: Option<bool>,
    /// P/D: prefill on the decode worker when at most this many prompt tokens are
    /// uncached there (0 = off).
    #[arg(long, env = "KVROUTE_LOCAL_PREFILL_MAX_UNCACHED_TOKENS")]
    pub local_prefill_max_uncached_tokens: Option<u32>,
    /// P/D: prefill on the decode worker when it holds at least this fraction of the
    /// prompt.
    #[arg(long, env = "KVROUTE_LOCAL_PREFILL_MIN_CACHED_FRACTION")]
    pub local_prefill_min_cached_fraction: Option<f64>,
}

impl PolicyRouterArgs {
    /// The flags that were given, over `r`.
    pub fn apply(&self, r: &mut crate::config::RouterConfig) {
        macro_rules! overlay {
            ($($field:ident),*) => {
                $( if let Some(v) = self.$field.clone() { r.$field = v; } )*
            };
        }
        overlay!(
            session_max_entries,
            session_ttl_ms,
            session_header,
            session_from_user,
            local_prefill_max_uncached_tokens
        );
        if self.local_prefill_min_cached_fraction.is_some() {
            r.local_prefill_min_cached_fraction = self.local_prefill_min_cached_fraction;
        }
    }
}
