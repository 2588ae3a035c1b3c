//! What the proxy shares between cores: its metrics (registered into the service's
//! `/metrics` registry), the count of proxied requests in flight (the
//! `max_concurrent` admission), the accepted client API keys, the `Authorization`
//! sent to the workers, and the process's nonce in the ids of routed requests.

use hyper::header::HeaderValue;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The routed worker's model (never the client's string: bounded cardinality).
    pub model: String,
    pub worker: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FieldLabel {
    pub field: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    pub worker: String,
}

pub struct ProxyMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub refused: Family<KindLabel, Counter>,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub upstream_errors: Family<KindLabel, Counter>,
    pub retries: Counter,
    /// Cores on which the worker's breaker is open or half-open.
    pub breaker_open: Family<WorkerLabel, Gauge>,
    pub tokenize_seconds: Histogram,
    /// The phases of a proxied request's time to first token that are not the
    /// worker's or the other metrics' (`tokenize_seconds`, the decision latency):
    /// admission to body read and parsed, and request sent to the worker's response
    /// head (per attempt, pool checkout included).
    pub read_seconds: Histogram,
    pub upstream_head_seconds: Histogram,
    pub untokenized: Counter,
    /// Prompts tokenized on the core's blocking thread (`tokenize_inline_max_bytes`).
    pub tokenized_off_core: Counter,
    /// Short bodies whose chat render outgrew the core's budget and was finished on
    /// the blocking thread.
    pub renders_off_core: Counter,
    pub prefill_fallbacks: Counter,
    pub active: Gauge,
    /// Client body members removed before forwarding (`proxy::strip`), by name.
    pub stripped: Family<FieldLabel, Counter>,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 100 µs .. ~105 s in powers of two.
    (0..21).map(|i| 1e-4 * f64::from(1u32 << i))
}

/// `n` buckets from 1 µs in powers of two (16: to ~33 ms; 27: to ~67 s).
fn micro_buckets(n: u32) -> impl Iterator<Item = f64> {
    (0..n).map(|i| 1e-6 * f64::from(1u32 << i))
}

impl ProxyMetrics {
    fn new() -> ProxyMetrics {
        ProxyMetrics {
            requests: Family::default(),
            refused: Family::default(),
            ttft: Histogram::new(seconds_buckets()),
            itl: Histogram::new(seconds_buckets()),
            e2e: Histogram::new(seconds_buckets()),
            upstream_errors: Family::default(),
            retries: Counter::default(),
            breaker_open: Family::default(),
            tokenize_seconds: Histogram::new(micro_buckets(16)),
            read_seconds: Histogram::new(micro_buckets(27)),
            upstream_head_seconds: Histogram::new(micro_buckets(27)),
            untokenized: Counter::default(),
            tokenized_off_core: Counter::default(),
            renders_off_core: Counter::default(),
            prefill_fallbacks: Counter::default(),
            active: Gauge::default(),
            stripped: Family::default(),
        }
    }

    fn register(&self, r: &mut prometheus_client::registry::Registry) {
        crate::families::register_all!(r;
            "proxy_requests", "Proxied requests by routed model, worker and outcome (ok, upstream_error, client_disconnect, failed)" => self.requests;
            "proxy_refused", "Proxy requests refused before routing, by kind (unauthorized, too_large, too_many, bad_request, no_worker, workers_busy: every worker tried answered 429)" => self.refused;
            "proxy_ttft_seconds", "Time to first output token as seen by the proxy" => self.ttft;
            "proxy_itl_seconds", "Time between output-carrying chunks as seen by the proxy" => self.itl;
            "proxy_e2e_seconds", "End-to-end time of proxied requests (accept to last byte)" => self.e2e;
            "proxy_upstream_errors", "Upstream failures by kind (connect, connect_timeout, reset, timeout, status_5xx, busy: a worker's 429, mid_stream, prefill)" => self.upstream_errors;
            "proxy_retries", "Proxied requests re-routed to another worker after a failure" => self.retries;
            "proxy_breaker_open", "Cores on which the worker's circuit breaker is open or half-open" => self.breaker_open;
            "proxy_tokenize_seconds", "Time to read a request's prompt token ids" => self.tokenize_seconds;
            "proxy_read_seconds", "Time from a request's admission to its body read and parsed" => self.read_seconds;
            "proxy_upstream_head_seconds", "Time from a request sent to a worker (pool checkout included) to the worker's response head, per attempt" => self.upstream_head_seconds;
            "proxy_untokenized", "Proxied requests routed by load only (no token ids for their prompt)" => self.untokenized;
            "proxy_tokenized_off_core", "Prompts tokenized on the core's blocking thread (bodies over tokenize_inline_max_bytes)" => self.tokenized_off_core;
            "proxy_renders_off_core", "Chat renders of short bodies that took more steps than the core's budget and were finished on its blocking thread (within chat_template_fuel)" => self.renders_off_core;
            "proxy_prefill_fallbacks", "Disaggregated requests whose prefill leg failed and that were served decode-only" => self.prefill_fallbacks;
            "proxy_active", "Proxied requests in flight" => self.active;
            "proxy_stripped_fields", "Members removed from client bodies because engines trust them as engine-to-engine data (kv_transfer_params, bootstrap_host, ...), by name" => self.stripped;
        );
    }
}

pub struct ProxyShared {
    pub metrics: ProxyMetrics,
    inflight: AtomicUsize,
    /// Client API keys (set once at start).
    pub keys: OnceLock<Vec<String>>,
    /// `Bearer <upstream_api_key>`, marked sensitive (set once at start).
    upstream_auth: OnceLock<HeaderValue>,
    /// Drawn at start: part of every routed request's id (`request::router_id`), so
    /// two replicas never mint the same one.
    pub nonce: String,
    /// The front door's policies: queue, tenants (set once at start).
    pub policies: OnceLock<super::policies::Policies>,
    /// Which worker stored each OpenAI Responses answer (`agents`).
    pub responses: super::agents::Responses,
    /// The OpenTelemetry tracer (set once at start; off without `trace.otlp_endpoint`).
    pub tracing: OnceLock<crate::trace::Tracing>,
}

impl ProxyShared {
    pub fn new(m: &crate::service::metrics::Metrics) -> ProxyShared {
        let p = ProxyShared {
            metrics: ProxyMetrics::new(),
            inflight: AtomicUsize::new(0),
            keys: OnceLock::new(),
            upstream_auth: OnceLock::new(),
            nonce: super::request::new_nonce(),
            policies: OnceLock::new(),
            responses: Default::default(),
            tracing: OnceLock::new(),
        };
        m.with_registry(|r| p.metrics.register(r));
        p
    }

    /// Admits one more proxied request unless `max` are in flight.
    pub fn admit(me: &Arc<ProxyShared>, max: usize) -> Option<Admitted> {
        let mut cur = me.inflight.load(Ordering::Relaxed);
        loop {
            if cur >= max {
                return None;
            }
            match me.inflight.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    me.metrics.active.inc();
                    return Some(Admitted(me.clone()));
                }
                Err(v) => cur = v,
            }
        }
    }

    /// Sets the key sent to the workers (`ProxySettings::resolve_upstream_key`, which
    /// checked that it makes a header value; one that does not is not sent).
    pub fn set_upstream_key(&self, key: Option<&str>) {
        if let Some(Ok(mut v)) = key.map(|k| HeaderValue::from_str(&format!("Bearer {k}"))) {
            v.set_sensitive(true);
            let _ = self.upstream_auth.set(v);
        }
    }

    /// Adds the workers' `Authorization` to a request for a worker, if a key is set.
    pub fn authorize(&self, b: hyper::http::request::Builder) -> hyper::http::request::Builder {
        match self.upstream_auth.get() {
            Some(v) => b.header(hyper::header::AUTHORIZATION, v.clone()),
            None => b,
        }
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Relaxed)
    }
}

/// One admitted request; dropping it releases the admission.
pub struct Admitted(Arc<ProxyShared>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.active.dec();
        if let Some(p) = self.0.policies.get() {
            p.freed();
        }
    }
}
