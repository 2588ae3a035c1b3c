//! Settings of the front door's policies (`[admission]` in TOML; flags `--admission-*`,
//! env `KVROUTE_ADMISSION_*`, see `args`): the admission queue, priorities and
//! deadlines, tenants. `validate` is the one place that rejects unusable values.
//! Sessions and local prefill are routing knobs (`[router]`, `crate::config`).

use super::hints::HintConfig;
use super::queue::QueueConfig;
use serde::{Deserialize, Serialize};

/// Largest `max_queued` (per model per replica).
pub const MAX_QUEUED: usize = 1 << 20;
/// Largest `max_tenants` (per replica).
pub const MAX_TENANTS: usize = 1 << 20;
/// Largest `max_tenant_labels`.
pub const MAX_TENANT_LABELS: usize = 1024;
/// Largest `max_priority`.
pub const MAX_PRIORITY: i32 = 1000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionSettings {
    /// Queue requests that every worker tried refused with 429, or that find every
    /// eligible worker busy (`router.busy_threshold`), instead of answering 429 at
    /// once. Default true.
    pub queue: bool,
    /// Also queue requests that find the proxy at `proxy.max_concurrent` (ordered by
    /// their headers' hints; their bodies are not read while they wait) instead of an
    /// immediate 429. Default false.
    pub queue_at_max_concurrent: bool,
    /// Requests queued per model (per replica); past it, 429 at once. Default 1024.
    pub max_queued: usize,
    /// A queued request waits at most this long, then gets 429 with `retry-after`.
    /// Default 30,000 ms.
    pub max_wait_ms: u64,
    /// Share of `max_queued` one tenant may hold, in (0, 1]. Default 0.5.
    pub tenant_share: f64,
    /// A waiting request gains one priority class per this much waiting (0 = no
    /// aging: strict priority). Default 1,000 ms.
    pub aging_ms: u64,
    /// Priorities are clamped to `[-max_priority, max_priority]` (the aging bound grows
    /// with it). Default 10.
    pub max_priority: i32,
    /// Header carrying a request's priority (lower first). Default `x-kvroute-priority`.
    pub priority_header: String,
    /// Header carrying a request's deadline, in ms from arrival. Default
    /// `x-kvroute-deadline-ms`.
    pub deadline_header: String,
    /// The tenant is this header's value (else the request's API key). Default none.
    pub tenant_header: Option<String>,
    /// Requests per second a tenant not listed in `tenants` may send. Default none
    /// (unlimited).
    pub tenant_requests_per_s: Option<f64>,
    /// Prompt tokens per second a tenant not listed in `tenants` may send. Default
    /// none (unlimited).
    pub tenant_prompt_tokens_per_s: Option<f64>,
    /// A tenant's bucket holds this much of its rate (the burst it may send at once).
    /// Default 1,000 ms.
    pub tenant_burst_ms: u64,
    /// Tenants not listed in `tenants` whose buckets are tracked at once (per
    /// replica); when all are busy, newer ones share one overflow bucket. Default 10,000.
    pub max_tenants: usize,
    /// Distinct tenant labels in the metrics besides the listed tenants' names; the
    /// rest are counted as `other`. Default 32.
    pub max_tenant_labels: usize,
    /// A TOML file of more `[[tenants]]` (read at start). Default none.
    pub tenants_file: Option<String>,
    /// Named tenants: how they are recognised, their pinned priority and limits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantSpec>,
}

/// One named tenant (`[[admission.tenants]]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// Its name in metrics and logs (`[A-Za-z0-9_.-]`, at most 64 bytes).
    pub name: String,
    /// Requests bearing this API key (`Authorization: Bearer`) are this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Requests whose `tenant_header` has this value are this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_value: Option<String>,
    /// The priority of all its requests, whatever they ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Its requests per second (else `tenant_requests_per_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_s: Option<f64>,
    /// Its prompt tokens per second (else `tenant_prompt_tokens_per_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_per_s: Option<f64>,
}

/// The file named by `tenants_file`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsFile {
    pub tenants: Vec<TenantSpec>,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings {
            queue: true,
            queue_at_max_concurrent: false,
            max_queued: 1024,
            max_wait_ms: 30_000,
            tenant_share: 0.5,
            aging_ms: 1_000,
            max_priority: 10,
            priority_header: "x-kvroute-priority".into(),
            deadline_header: "x-kvroute-deadline-ms".into(),
            tenant_header: None,
            tenant_requests_per_s: None,
            tenant_prompt_tokens_per_s: None,
            tenant_burst_ms: 1_000,
            max_tenants: 10_000,
            max_tenant_labels: 32,
            tenants_file: None,
            tenants: Vec::new(),
        }
    }
}

/// A header name: an HTTP token (RFC 9110), lower-cased on use.
fn header_name_ok(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 128
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A tenant name (and a metric label value).
pub fn label_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn rate_ok(name: &str, v: Option<f64>) -> Result<(), String> {
    match v {
        Some(r) if !(r.is_finite() && r > 0.0) => Err(format!(
            "admission {name} must be a finite number > 0 (got {r})"
        )),
        _ => Ok(()),
    }
}

impl AdmissionSettings {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_queued > MAX_QUEUED {
            return Err(format!("admission max_queued must be at most {MAX_QUEUED}"));
        }
        if !(10..=3_600_000).contains(&self.max_wait_ms) {
            return Err("admission max_wait_ms must be 10..=3600000".into());
        }
        if !(self.tenant_share > 0.0 && self.tenant_share <= 1.0) {
            return Err("admission tenant_share must be in (0, 1]".into());
        }
        if self.aging_ms > 3_600_000 {
            return Err("admission aging_ms must be at most 3600000 (0 = no aging)".into());
        }
        if !(0..=MAX_PRIORITY).contains(&self.max_priority) {
            return Err(format!("admission max_priority must be 0..={MAX_PRIORITY}"));
        }
        for (name, h) in [
            ("priority_header", Some(&self.priority_header)),
            ("deadline_header", Some(&self.deadline_header)),
            ("tenant_header", self.tenant_header.as_ref()),
        ] {
            if let Some(h) = h {
                if !header_name_ok(h) {
                    return Err(format!("admission {name} {h:?} is not a header name"));
                }
            }
        }
        rate_ok("tenant_requests_per_s", self.tenant_requests_per_s)?;
        rate_ok(
            "tenant_prompt_tokens_per_s",
            self.tenant_prompt_tokens_per_s,
        )?;
        if !(1..=3_600_000).contains(&self.tenant_burst_ms) {
            return Err("admission tenant_burst_ms must be 1..=3600000".into());
        }
        if self.max_tenants == 0 || self.max_tenants > MAX_TENANTS {
            return Err(format!("admission max_tenants must be 1..={MAX_TENANTS}"));
        }
        if self.max_tenant_labels > MAX_TENANT_LABELS {
            return Err(format!(
                "admission max_tenant_labels must be at most {MAX_TENANT_LABELS}"
            ));
        }
        if self.tenants_file.as_deref() == Some("") {
            return Err("admission tenants_file must name a file".into());
        }
        validate_tenants(&self.tenants, self.tenant_header.is_some())
    }

    /// `tenants` plus those of `tenants_file` (read now), validated together.
    pub fn resolve_tenants(&self) -> Result<Vec<TenantSpec>, String> {
        let mut all = self.tenants.clone();
        if let Some(path) = &self.tenants_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading admission tenants_file {path}: {e}"))?;
            let f: TenantsFile =
                toml::from_str(&text).map_err(|e| format!("admission tenants_file {path}: {e}"))?;
            all.extend(f.tenants);
        }
        validate_tenants(&all, self.tenant_header.is_some())?;
        Ok(all)
    }

    /// The queue's configuration.
    pub fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            max_len: if self.queue { self.max_queued } else { 0 },
            max_wait_us: self.max_wait_ms.saturating_mul(1000),
            tenant_share: self.tenant_share,
            aging_us: self.aging_ms.saturating_mul(1000),
            max_priority: self.max_priority,
        }
    }

    /// Where hints are read, with the session settings of `[router]`.
    pub fn hint_config(&self, router: &crate::config::RouterConfig) -> HintConfig {
        HintConfig {
            priority_header: self.priority_header.to_ascii_lowercase(),
            deadline_header: self.deadline_header.to_ascii_lowercase(),
            session_header: if router.session_max_entries == 0 {
                String::new()
            } else {
                router.session_header.to_ascii_lowercase()
            },
            session_from_user: router.session_max_entries > 0 && router.session_from_user,
            max_priority: self.max_priority,
        }
    }

    /// Whether tenants are configured at all (else no request has a tenant).
    pub fn tenants_enabled(&self) -> bool {
        !self.tenants.is_empty()
            || self.tenants_file.is_some()
            || self.tenant_header.is_some()
            || self.tenant_requests_per_s.is_some()
            || self.tenant_prompt_tokens_per_s.is_some()
    }
}

fn validate_tenants(ts: &[TenantSpec], has_header: bool) -> Result<(), String> {
    let mut names = std::collections::HashSet::new();
    let mut keys = std::collections::HashSet::new();
    let mut values = std::collections::HashSet::new();
    for t in ts {
        let name = &t.name;
        if !label_ok(name) || name == "other" {
            return Err(format!(
                "admission tenant name {name:?} must be 1..=64 bytes of [A-Za-z0-9_.-] (and not \"other\")"
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("admission tenant {name:?} is listed twice"));
        }
        match (&t.api_key, &t.header_value) {
            (None, None) => {
                return Err(format!(
                    "admission tenant {name:?} needs an api_key or a header_value"
                ))
            }
            (_, Some(_)) if !has_header => {
                return Err(format!(
                    "admission tenant {name:?} has a header_value but no tenant_header is set"
                ))
            }
            _ => {}
        }
        if let Some(k) = &t.api_key {
            if k.is_empty() || !keys.insert(k.as_str()) {
                return Err(format!(
                    "admission tenant {name:?}: api_key empty or used by another tenant"
                ));
            }
        }
        if let Some(v) = &t.header_value {
            if v.is_empty() || !values.insert(v.as_str()) {
                return Err(format!(
                    "admission tenant {name:?}: header_value empty or used by another tenant"
                ));
            }
        }
        if let Some(p) = t.priority {
            if !(-MAX_PRIORITY..=MAX_PRIORITY).contains(&p) {
                return Err(format!(
                    "admission tenant {name:?}: priority must be in [-{MAX_PRIORITY}, {MAX_PRIORITY}]"
                ));
            }
        }
        rate_ok("tenant requests_per_s", t.requests_per_s)?;
        rate_ok("tenant prompt_tokens_per_s", t.prompt_tokens_per_s)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, key: &str) -> TenantSpec {
        TenantSpec {
            name: name.into(),
            api_key: Some(key.into()),
            header_value: None,
            priority: None,
            requests_per_s: None,
            prompt_tokens_per_s: None,
        }
    }

    #[test]
    fn defaults_validate_and_roundtrip_toml() {
        let s = AdmissionSettings::default();
        s.validate().unwrap();
        assert!(!s.tenants_enabled());
        let back: AdmissionSettings = toml::from_str(&toml::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let q = s.queue_config();
        assert_eq!(
            (q.max_len, q.max_wait_us, q.aging_us),
            (1024, 30_000_000, 1_000_000)
        );
        let off = AdmissionSettings { queue: false, ..s };
        assert_eq!(off.queue_config().max_len, 0);
        let t: AdmissionSettings = toml::from_str(
            "tenant_header = \"x-tenant\"\n[[tenants]]\nname = \"a\"\nheader_value = \"A\"\npriority = -2\n",
        )
        .unwrap();
        t.validate().unwrap();
        assert!(t.tenants_enabled());
        assert!(toml::from_str::<AdmissionSettings>("bogus = 1").is_err());
    }

    #[test]
    fn validate_rejects_bad_values() {
        let d = AdmissionSettings::default;
        let bad = [
            AdmissionSettings {
                tenant_share: 0.0,
                ..d()
            },
            AdmissionSettings {
                tenant_share: f64::NAN,
                ..d()
            },
            AdmissionSettings {
                max_wait_ms: 0,
                ..d()
            },
            AdmissionSettings {
                max_priority: -1,
                ..d()
            },
            AdmissionSettings {
                max_queued: MAX_QUEUED + 1,
                ..d()
            },
            AdmissionSettings {
                priority_header: "x prio".into(),
                ..d()
            },
            AdmissionSettings {
                tenant_header: Some(String::new()),
                ..d()
            },
            AdmissionSettings {
                tenant_requests_per_s: Some(0.0),
                ..d()
            },
            AdmissionSettings {
                tenant_prompt_tokens_per_s: Some(f64::INFINITY),
                ..d()
            },
            AdmissionSettings {
                tenant_burst_ms: 0,
                ..d()
            },
            AdmissionSettings {
                max_tenants: 0,
                ..d()
            },
            AdmissionSettings {
                tenants: vec![tenant("a", "k"), tenant("a", "j")],
                ..d()
            },
            AdmissionSettings {
                tenants: vec![tenant("a", "k"), tenant("b", "k")],
                ..d()
            },
            AdmissionSettings {
                tenants: vec![tenant("other", "k")],
                ..d()
            },
            AdmissionSettings {
                tenants: vec![tenant("a b", "k")],
                ..d()
            },
            AdmissionSettings {
                tenants: vec![TenantSpec {
                    api_key: None,
                    ..tenant("a", "k")
                }],
                ..d()
            },
            AdmissionSettings {
                tenants: vec![TenantSpec {
                    header_value: Some("v".into()),
                    ..tenant("a", "k")
                }],
                ..d()
            },
            AdmissionSettings {
                tenants: vec![TenantSpec {
                    priority: Some(5000),
                    ..tenant("a", "k")
                }],
                ..d()
            },
        ];
        for s in bad {
            assert!(s.validate().is_err(), "{s:?}");
        }
    }

    #[test]
    fn tenants_file_adds_tenants_and_is_validated_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, "[[tenants]]\nname = \"b\"\napi_key = \"kb\"\n").unwrap();
        let s = AdmissionSettings {
            tenants: vec![tenant("a", "ka")],
            tenants_file: Some(path.to_string_lossy().into_owned()),
            ..Default::default()
        };
        let all = s.resolve_tenants().unwrap();
        assert_eq!(
            all.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            vec!["a", "b"]
        );
        std::fs::write(&path, "[[tenants]]\nname = \"a\"\napi_key = \"kb\"\n").unwrap();
        assert!(s.resolve_tenants().unwrap_err().contains("twice"));
        let missing = AdmissionSettings {
            tenants_file: Some("/nonexistent/t.toml".into()),
            ..Default::default()
        };
        assert!(missing.resolve_tenants().is_err());
    }
}
