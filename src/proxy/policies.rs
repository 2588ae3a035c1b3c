//! The proxy's front-door policies, per replica (docs/POLICIES.md): a request's hints
//! (priority, deadline, session) and tenant are read once its body is parsed
//! ([`Policies::front`]: a malformed hint is a 400, a tenant over its rate a 429 that
//! names the limit); a request that finds every eligible worker busy waits in its
//! model's admission queue (`queued`) instead of getting an answer at once.
//!
//! State shared by the cores: one [`SharedQueue`] per model (created on first use,
//! bounded in number, found without a lock), the tenants' buckets behind one lock (touched once per request,
//! O(log n)), the queue of requests waiting for a proxied-request slot
//! (`proxy.max_concurrent`, ordered by their headers' hints: the body is not read
//! yet), and the metrics. Capacity freed by a proxied request that ends
//! ([`Policies::freed`], called when its admission is released) is handed to the best
//! waiter of every non-empty queue; each waiter's core is woken through a
//! `tokio::sync::Notify`, whose wake-up glommio delivers across cores.
//!
//! Guarantees: the number of queues is bounded ([`MAX_QUEUES`]; past it a request of a
//! new model is answered at once as before), each queue by `admission.max_queued`, the
//! tenant table and the tenant labels by their settings; nothing here panics on client
//! input.

use crate::admission::hints::{self, HintConfig, Hints};
use crate::admission::shared::{Grant, Notice, SharedQueue};
use crate::admission::tenant::{Limit, Tenant, Tenants};
use crate::admission::{AdmissionSettings, TenantSpec};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Most model queues per replica.
pub const MAX_QUEUES: usize = 1024;

/// How a queued request's core is woken (grant, displacement).
pub type Wake = Arc<tokio::sync::Notify>;

/// One model's queue.
pub type Queue = SharedQueue<Wake>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLimitLabel {
    pub tenant: String,
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    pub path: &'static str,
}

pub struct PolicyMetrics {
    pub depth: Family<ModelLabel, Gauge>,
    pub queued: Counter,
    pub waited: Histogram,
    pub dropped: Family<ReasonLabel, Counter>,
    pub tenant_requests: Family<TenantLabel, Counter>,
    pub tenant_limited: Family<TenantLimitLabel, Counter>,
    pub prefill_path: Family<PathLabel, Counter>,
}

impl PolicyMetrics {
    fn new() -> PolicyMetrics {
        PolicyMetrics {
            depth: Family::default(),
            queued: Counter::default(),
            // 1 ms .. ~65 s in powers of two.
            waited: Histogram::new((0..17).map(|i| 1e-3 * f64::from(1u32 << i))),
            dropped: Family::default(),
            tenant_requests: Family::default(),
            tenant_limited: Family::default(),
            prefill_path: Family::default(),
        }
    }

    fn register(&self, r: &mut prometheus_client::registry::Registry) {
        crate::families::register_all!(r;
            "proxy_queue_depth", "Requests waiting in the admission queue, by model (this replica)" => self.depth;
            "proxy_queued", "Requests that found every eligible worker busy and entered the admission queue" => self.queued;
            "proxy_queue_wait_seconds", "Time queued requests waited before their turn came" => self.waited;
            "proxy_queue_dropped", "Requests that left the admission queue without being served, by reason (full, tenant_share, timeout, client_gone)" => self.dropped;
            "proxy_tenant_requests", "Proxied requests by tenant (named tenants, then the first max_tenant_labels others, the rest as other)" => self.tenant_requests;
            "proxy_tenant_limited", "Requests refused with 429 because their tenant went over a rate limit, by tenant and limit" => self.tenant_limited;
            "proxy_prefill_path", "Disaggregated-fleet requests by where their prefill ran (remote: a prefill worker; local: on the decode worker)" => self.prefill_path;
        );
    }

    pub fn drop_reason(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// What the front door learned about a request.
#[derive(Clone, Debug)]
pub struct Front {
    pub hints: Hints,
    pub tenant: Option<Tenant>,
}

/// Why the front door refused a request.
#[derive(Debug)]
pub enum Refusal {
    /// A malformed hint (400).
    BadHint(String),
    /// The tenant is over a limit (429): the limit, the tenant's label, seconds until
    /// it would pass.
    OverLimit(Limit, String, u32),
}

/// The replica's policies. See the module docs.
pub struct Policies {
    pub settings: AdmissionSettings,
    hint_cfg: HintConfig,
    /// The queues by model: read without a lock (every request's end reads them),
    /// replaced whole under `adding` when a model gets its first queue.
    queues: arc_swap::ArcSwap<hashbrown::HashMap<String, Arc<Queue>>>,
    adding: Mutex<()>,
    /// Requests waiting for a proxied-request slot (`proxy.max_concurrent`).
    slots: Arc<Queue>,
    tenants: Mutex<Tenants>,
    pub metrics: PolicyMetrics,
    started: Instant,
    last_kick_us: AtomicU64,
}

impl Policies {
    pub fn new(
        s: &AdmissionSettings,
        router: &crate::config::RouterConfig,
        named: Vec<TenantSpec>,
        m: &crate::service::metrics::Metrics,
    ) -> Policies {
        let p = Policies {
            settings: s.clone(),
            hint_cfg: s.hint_config(router),
            queues: arc_swap::ArcSwap::from_pointee(hashbrown::HashMap::new()),
            adding: Mutex::new(()),
            slots: Arc::new(Queue::new(s.queue_config())),
            tenants: Mutex::new(Tenants::new(s, named)),
            metrics: PolicyMetrics::new(),
            started: Instant::now(),
            last_kick_us: AtomicU64::new(0),
        };
        m.with_registry(|r| p.metrics.register(r));
        p
    }

    /// µs since start: the queues' clock.
    pub fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Whether a busy fleet queues requests at all.
    pub fn queueing(&self) -> bool {
        self.settings.queue && self.settings.max_queued > 0
    }

    /// The hints and tenant of a request, its tenant charged for it (`prompt_tokens`),
    /// or why it is refused.
    pub fn front(
        &self,
        headers: &hyper::HeaderMap,
        body: &serde_json::Value,
        prompt_tokens: u64,
    ) -> Result<Front, Refusal> {
        let now = self.now_us();
        let tenant = {
            let mut t = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
            let key = crate::credentials::bearer(headers);
            let hv = t
                .header()
                .and_then(|h| headers.get(h))
                .map(|v| v.as_bytes().to_vec());
            match t.identify(key, hv.as_deref()) {
                None => None,
                Some(tn) => {
                    let label = t.labels().get(tn.label as usize).cloned();
                    let label = label.unwrap_or_else(|| "other".into());
                    if let Err(over) = t.check(&tn, prompt_tokens, now) {
                        let labels = TenantLimitLabel {
                            tenant: label.clone(),
                            limit: over.limit.name(),
                        };
                        self.metrics.tenant_limited.get_or_create(&labels).inc();
                        let secs = over.retry_after_us.div_ceil(1_000_000).clamp(1, 3600);
                        return Err(Refusal::OverLimit(over.limit, label, secs as u32));
                    }
                    let labels = TenantLabel { tenant: label };
                    self.metrics.tenant_requests.get_or_create(&labels).inc();
                    Some(tn)
                }
            }
        };
        let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()));
        let h = hints::read(
            &self.hint_cfg,
            pairs,
            body,
            tenant.and_then(|t| t.pinned),
            tenant.map_or(0, |t| t.id),
            now,
        )
        .map_err(|e| Refusal::BadHint(e.0))?;
        Ok(Front { hints: h, tenant })
    }

    /// The queue of `model`, made on first use; `None` past [`MAX_QUEUES`] models.
    pub fn queue(&self, model: &str) -> Option<Arc<Queue>> {
        if let Some(q) = self.queues.load().get(model) {
            return Some(q.clone());
        }
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let mut qs = hashbrown::HashMap::clone(&self.queues.load());
        if let Some(q) = qs.get(model) {
            return Some(q.clone());
        }
        if qs.len() >= MAX_QUEUES {
            // Forget idle queues (nobody else holds them) before giving up.
            qs.retain(|_, q| !q.is_empty() || Arc::strong_count(q) > 2);
            if qs.len() >= MAX_QUEUES {
                return None;
            }
        }
        let q = Arc::new(Queue::new(self.settings.queue_config()));
        qs.insert(model.to_string(), q.clone());
        self.queues.store(Arc::new(qs));
        Some(q)
    }

    /// The queue of requests waiting for a proxied-request slot.
    pub fn slots(&self) -> &Arc<Queue> {
        &self.slots
    }

    /// What the headers alone say (the body is not read yet): the hints and tenant a
    /// request waits for a slot with. Nothing is charged; `None` for a malformed hint
    /// (the front door refuses it once the body is read).
    pub fn front_of_headers(&self, headers: &hyper::HeaderMap) -> Option<Front> {
        let tenant = {
            let mut t = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
            let key = crate::credentials::bearer(headers);
            let hv = t
                .header()
                .and_then(|h| headers.get(h))
                .map(|v| v.as_bytes().to_vec());
            t.identify(key, hv.as_deref())
        };
        let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes()));
        let hints = hints::read(
            &self.hint_cfg,
            pairs,
            &serde_json::Value::Null,
            tenant.and_then(|t| t.pinned),
            tenant.map_or(0, |t| t.id),
            self.now_us(),
        )
        .ok()?;
        Some(Front { hints, tenant })
    }

    /// The queue of `model` if it has one with someone waiting.
    pub fn waiting(&self, model: &str) -> Option<Arc<Queue>> {
        self.queues
            .load()
            .get(model)
            .filter(|q| !q.is_empty())
            .cloned()
    }

    /// The capacity epoch of `model`'s queue (0 when it has none yet).
    pub fn epoch(&self, model: &str) -> u64 {
        self.queues.load().get(model).map_or(0, |q| q.epoch())
    }

    /// A proxied request ended (its capacity is free): every queue's epoch moves and
    /// its best waiter is granted a try.
    pub fn freed(&self) {
        let now = self.now_us();
        self.deliver(self.slots.freed(now));
        let qs = self.queues.load();
        for q in qs.values() {
            // A lock only for a queue with someone waiting.
            self.deliver(q.freed(now));
        }
    }

    /// At most every `every_us`, nudges `q`'s best waiter to try in its place
    /// (`SharedQueue::nudge`): the safety net for capacity that frees without a
    /// proxied request ending here (a worker's own load falling, another replica's
    /// request ending).
    pub fn tick(&self, q: &Queue, every_us: u64) {
        let now = self.now_us();
        let last = self.last_kick_us.load(Ordering::Relaxed);
        if now.saturating_sub(last) < every_us {
            return;
        }
        if self
            .last_kick_us
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            if let Some(w) = q.nudge(now, every_us, 16) {
                w.notify_one();
            }
        }
    }

    /// Tells a waiter's core of a decision about it (granted, refused).
    pub fn deliver(&self, n: Option<Notice<Wake>>) {
        if let Some(n) = n {
            n.item.item.notify_one();
        }
    }

    /// A granted waiter's turn, measured for the metrics.
    pub fn admitted(&self, g: &Grant<Wake>) {
        let waited = self.now_us().saturating_sub(g.ticket.arrival_us);
        self.metrics.waited.observe(waited as f64 / 1e6);
    }

    /// Sets `model`'s depth gauge to its queue's length.
    pub fn show_depth(&self, model: &str, q: &Queue) {
        let l = ModelLabel {
            model: model.to_string(),
        };
        self.metrics.depth.get_or_create(&l).set(q.len() as i64);
    }
}
