//! Tenants: who a request belongs to, its pinned priority, and its rate limits
//! (requests/s and prompt tokens/s, token buckets of [`super::rate`]), with metric
//! labels of bounded cardinality (docs/POLICIES.md "Tenants").
//!
//! - **Identity**: the value of `tenant_header` when one is configured, else the
//!   request's API key; a request with neither has no tenant (and no limit). An API
//!   key of a named tenant comes first (it is authenticated, a header is the
//!   client's word), so a pinned priority per API key holds with a tenant header too.
//! - **Named tenants** (`[[admission.tenants]]`) are recognised by API key or header
//!   value; each may pin a priority and set its own limits. Their buckets are always
//!   kept.
//! - **Other tenants** get the default limits (`tenant_requests_per_s`,
//!   `tenant_prompt_tokens_per_s`). Their buckets live in a table of at most
//!   `max_tenants` entries: a full bucket is the state of a tenant never seen, so the
//!   table forgets the tenant whose buckets are fullest first; when every tracked
//!   tenant is mid-burst, a newcomer shares one overflow bucket pair with the other
//!   newcomers (they are limited together, never unlimited).
//! - **Refusal** names the limit ([`OverLimit`]) and when it would pass.
//! - **Labels**: a named tenant's name; another tenant's header value (sanitised) or
//!   `key-` and 8 hex digits of the SHA-256 of its API key (no key material in the
//!   metrics), for the first `max_tenant_labels` seen, then `other`.
//!
//! Pure and single-threaded (the service keeps one per replica behind a lock; every
//! call is O(log n)). Limits are per replica: with N replicas behind a balancer a
//! tenant gets up to N times its rate (docs/POLICIES.md "What is per replica").

use super::config::{label_ok, AdmissionSettings, TenantSpec};
use super::rate::{Bucket, Rate};
use hashbrown::HashMap;
use std::collections::BTreeSet;

/// Label index of `other` in [`Tenants::labels`].
pub const OTHER: u16 = 0;

/// Which limit a request went over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    Requests,
    PromptTokens,
}

impl Limit {
    /// The setting's name, as the 429 and the metrics name it.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Requests => "requests_per_s",
            Limit::PromptTokens => "prompt_tokens_per_s",
        }
    }
}

/// A refusal: the limit, and how long until the request would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverLimit {
    pub limit: Limit,
    pub retry_after_us: u64,
}

/// A request's tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// A hash of its identity (the queue's tenant key, the sessions' scope).
    pub id: u64,
    /// Index in the named tenants, if it is one.
    pub named: Option<usize>,
    /// The priority its requests get, whatever they ask.
    pub pinned: Option<i32>,
    /// Its metric label ([`Tenants::labels`]).
    pub label: u16,
}

/// The limits of one tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Limits {
    requests: Option<Rate>,
    tokens: Option<Rate>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Buckets {
    requests: Bucket,
    tokens: Bucket,
}

impl Buckets {
    /// When both buckets are full again.
    fn full_at(&self) -> u64 {
        self.requests.tat_us().max(self.tokens.tat_us())
    }
}

/// All tenants of a replica. See the module docs.
#[derive(Clone, Debug)]
pub struct Tenants {
    enabled: bool,
    header: Option<String>,
    named: Vec<(TenantSpec, Limits)>,
    by_key: HashMap<String, usize>,
    by_value: HashMap<String, usize>,
    named_buckets: Vec<Buckets>,
    defaults: Limits,
    others: HashMap<u64, Buckets>,
    /// `(full_at, id)` of every entry of `others`: the fullest first.
    by_full: BTreeSet<(u64, u64)>,
    overflow: Buckets,
    max_others: usize,
    labels: Vec<String>,
    /// Label of each labelled other tenant, by id.
    other_labels: HashMap<u64, u16>,
    max_other_labels: usize,
}

const KEY_SEED: u64 = 0x7E4A_4E7E_0000_0001;
const VALUE_SEED: u64 = 0x7E4A_4E7E_0000_0002;

impl Tenants {
    /// From the settings and the resolved named tenants
    /// ([`AdmissionSettings::resolve_tenants`]).
    pub fn new(s: &AdmissionSettings, named: Vec<TenantSpec>) -> Tenants {
        let rate = |r: Option<f64>| r.map(|r| Rate::new(r, s.tenant_burst_ms));
        let defaults = Limits {
            requests: rate(s.tenant_requests_per_s),
            tokens: rate(s.tenant_prompt_tokens_per_s),
        };
        let mut t = Tenants {
            enabled: s.tenants_enabled() || !named.is_empty(),
            header: s.tenant_header.as_ref().map(|h| h.to_ascii_lowercase()),
            named: Vec::new(),
            by_key: HashMap::new(),
            by_value: HashMap::new(),
            named_buckets: vec![Buckets::default(); named.len()],
            defaults,
            others: HashMap::new(),
            by_full: BTreeSet::new(),
            overflow: Buckets::default(),
            max_others: s.max_tenants.max(1),
            labels: vec!["other".to_string()],
            other_labels: HashMap::new(),
            max_other_labels: s.max_tenant_labels,
        };
        for (i, spec) in named.into_iter().enumerate() {
            if let Some(k) = &spec.api_key {
                t.by_key.insert(k.clone(), i);
            }
            if let Some(v) = &spec.header_value {
                t.by_value.insert(v.clone(), i);
            }
            let limits = Limits {
                requests: rate(spec.requests_per_s).or(defaults.requests),
                tokens: rate(spec.prompt_tokens_per_s).or(defaults.tokens),
            };
            t.labels.push(spec.name.clone());
            t.named.push((spec, limits));
        }
        t
    }

    /// Whether requests have tenants at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The (lower-case) header that names the tenant, if configured.
    pub fn header(&self) -> Option<&str> {
        self.header.as_deref()
    }

    /// Metric labels: `other` first, then the named tenants, then others as seen.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Other tenants whose buckets are tracked now.
    pub fn tracked(&self) -> usize {
        self.others.len()
    }

    /// The tenant of a request with this API key and this `tenant_header` value: a
    /// named tenant's API key first (it is authenticated; the header is the client's
    /// word), then the header when configured and present, then the key.
    pub fn identify(&mut self, api_key: Option<&str>, header: Option<&[u8]>) -> Option<Tenant> {
        if !self.enabled {
            return None;
        }
        let key = api_key.filter(|k| !k.is_empty());
        let key_id = |k: &str| xxhash_rust::xxh3::xxh3_64_with_seed(k.as_bytes(), KEY_SEED);
        if let Some((k, i)) = key.and_then(|k| Some((k, *self.by_key.get(k)?))) {
            return Some(self.tenant(key_id(k), Some(i), String::new));
        }
        if let Some(v) = header.filter(|v| self.header.is_some() && !v.is_empty()) {
            let named = std::str::from_utf8(v)
                .ok()
                .and_then(|s| self.by_value.get(s).copied());
            let id = xxhash_rust::xxh3::xxh3_64_with_seed(v, VALUE_SEED);
            return Some(self.tenant(id, named, || sanitise(v)));
        }
        let k = key?;
        Some(self.tenant(key_id(k), None, || key_label(k.as_bytes())))
    }

    fn tenant(&mut self, id: u64, named: Option<usize>, label: impl FnOnce() -> String) -> Tenant {
        if let Some(i) = named {
            return Tenant {
                id,
                named,
                pinned: self.named.get(i).and_then(|(s, _)| s.priority),
                label: (i + 1).min(u16::MAX as usize) as u16,
            };
        }
        let label = match self.other_labels.get(&id) {
            Some(&l) => l,
            None if self.other_labels.len() < self.max_other_labels
                && self.labels.len() < u16::MAX as usize =>
            {
                // A label already in use (a named tenant's) is not given twice.
                let name = label();
                if self.labels.contains(&name) {
                    OTHER
                } else {
                    let l = self.labels.len() as u16;
                    self.labels.push(name);
                    self.other_labels.insert(id, l);
                    l
                }
            }
            None => OTHER,
        };
        Tenant {
            id,
            named: None,
            pinned: None,
            label,
        }
    }

    /// Charges one request of `prompt_tokens` to `t` at `now_us`, or refuses it
    /// naming the limit (nothing is charged then).
    pub fn check(&mut self, t: &Tenant, prompt_tokens: u64, now_us: u64) -> Result<(), OverLimit> {
        let (limits, current) = match t.named {
            Some(i) => match (self.named.get(i), self.named_buckets.get(i)) {
                (Some((_, l)), Some(b)) => (*l, *b),
                _ => return Ok(()),
            },
            None => (
                self.defaults,
                self.others.get(&t.id).copied().unwrap_or_default(),
            ),
        };
        if limits.requests.is_none() && limits.tokens.is_none() {
            return Ok(());
        }
        let mut slot = match t.named {
            Some(_) => Slot::Named,
            None if self.others.contains_key(&t.id) => Slot::Other,
            None => self.make_room(now_us),
        };
        let current = if slot == Slot::Overflow {
            self.overflow
        } else {
            current
        };
        let next = take(&limits, &current, prompt_tokens, now_us)?;
        match (&mut slot, t.named) {
            (Slot::Named, Some(i)) => {
                if let Some(b) = self.named_buckets.get_mut(i) {
                    *b = next;
                }
            }
            (Slot::Overflow, _) => self.overflow = next,
            _ => {
                if let Some(old) = self.others.insert(t.id, next) {
                    self.by_full.remove(&(old.full_at(), t.id));
                }
                self.by_full.insert((next.full_at(), t.id));
            }
        }
        Ok(())
    }

    /// Room for one more other tenant: forgets full buckets, else the overflow slot.
    fn make_room(&mut self, now_us: u64) -> Slot {
        if self.others.len() < self.max_others {
            return Slot::Other;
        }
        match self.by_full.first().copied() {
            Some((full_at, id)) if full_at <= now_us => {
                self.by_full.remove(&(full_at, id));
                self.others.remove(&id);
                Slot::Other
            }
            _ => Slot::Overflow,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Named,
    Other,
    Overflow,
}

/// Both buckets charged, or the first limit that refuses.
fn take(l: &Limits, b: &Buckets, tokens: u64, now_us: u64) -> Result<Buckets, OverLimit> {
    let requests = match &l.requests {
        Some(r) => b.requests.try_take(r, 1, now_us).map_err(|w| OverLimit {
            limit: Limit::Requests,
            retry_after_us: w,
        })?,
        None => b.requests,
    };
    let tokens = match &l.tokens {
        Some(r) => b
            .tokens
            .try_take(r, tokens, now_us)
            .map_err(|w| OverLimit {
                limit: Limit::PromptTokens,
                retry_after_us: w,
            })?,
        None => b.tokens,
    };
    Ok(Buckets { requests, tokens })
}

/// A header value as a label: at most 64 bytes of `[A-Za-z0-9_.-]`, others as `_`.
fn sanitise(v: &[u8]) -> String {
    let s: String = v
        .iter()
        .take(64)
        .map(|&b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
                b as char
            } else {
                '_'
            }
        })
        .collect();
    debug_assert!(label_ok(&s) || s.is_empty());
    s
}

/// `key-` and the first 8 hex digits of the key's SHA-256.
fn key_label(k: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(k);
    let hex: String = d.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("key-{hex}")
}

#[cfg(test)]
mod tests;
