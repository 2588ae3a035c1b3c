//! The tracer and the span API the request pipeline calls (module docs in `mod.rs`).

use super::config::TraceSettings;
use super::export::{ExportStats, QueueProcessor};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The process's tracer: off, or exporting to a collector.
#[derive(Clone, Default)]
pub struct Tracing {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    stats: Arc<ExportStats>,
    propagator: TraceContextPropagator,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("on", &self.inner.is_some())
            .finish()
    }
}

/// Counts of the exporter: spans exported, spans dropped, exports failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceCounts {
    pub exported: u64,
    pub dropped: u64,
    pub failed_exports: u64,
}

/// A header lookup as the propagator's extractor.
struct Lookup<'a, F>(F, std::marker::PhantomData<&'a str>);

impl<'a, F: Fn(&str) -> Option<&'a str>> Extractor for Lookup<'a, F> {
    fn get(&self, key: &str) -> Option<&str> {
        (self.0)(key)
    }
    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

impl Tracing {
    /// No tracing.
    pub fn off() -> Tracing {
        Tracing::default()
    }

    /// The tracer of `s`: off without an endpoint; else the exporter thread is started.
    pub fn start(s: &TraceSettings) -> Result<Tracing, String> {
        if !s.enabled() {
            return Ok(Tracing::off());
        }
        s.validate()?;
        let stats = Arc::new(ExportStats::default());
        let processor = QueueProcessor::start(s, stats.clone())?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                s.sample_ratio,
            ))))
            .with_resource(
                Resource::builder_empty()
                    .with_service_name(s.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("kvroute");
        Ok(Tracing {
            inner: Some(Arc::new(Inner {
                provider,
                tracer,
                stats,
                propagator: TraceContextPropagator::new(),
            })),
        })
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Registers the exporter's counters (nothing when off).
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        if let Some(i) = &self.inner {
            i.stats.register(r);
        }
    }

    /// What the exporter did so far.
    pub fn counts(&self) -> TraceCounts {
        self.inner
            .as_ref()
            .map_or(TraceCounts::default(), |i| TraceCounts {
                exported: i.stats.exported.get(),
                dropped: i.stats.dropped.get(),
                failed_exports: i.stats.failed_exports.get(),
            })
    }

    /// Starts the span of one request named `name` (e.g. `POST /v1/messages`),
    /// continuing the trace of the client's `traceparent` / `tracestate` (`header`
    /// looks a request header up by lower-case name).
    pub fn request<'h>(&self, name: &str, header: impl Fn(&str) -> Option<&'h str>) -> RequestSpan {
        let Some(i) = &self.inner else {
            return RequestSpan { inner: None };
        };
        let parent = i
            .propagator
            .extract(&Lookup(header, std::marker::PhantomData));
        let span = i
            .tracer
            .span_builder(name.to_string())
            .with_kind(SpanKind::Server)
            .start_with_context(&i.tracer, &parent);
        RequestSpan {
            inner: Some((i.clone(), parent.with_span(span))),
        }
    }

    /// Exports everything finished so far (waits up to the export timeout).
    pub fn flush(&self) -> Result<(), String> {
        match &self.inner {
            Some(i) => i.provider.force_flush().map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// Exports what is queued and stops the exporter thread (within `timeout`).
    pub fn shutdown(&self, timeout: Duration) -> Result<(), String> {
        match &self.inner {
            Some(i) => i
                .provider
                .shutdown_with_timeout(timeout)
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// The span of one proxied request (ends when dropped, or at [`RequestSpan::end`]).
pub struct RequestSpan {
    inner: Option<(Arc<Inner>, Context)>,
}

/// A routing decision's attributes on the `route` span.
#[derive(Clone, Debug, Default)]
pub struct RouteAttrs<'a> {
    /// The chosen worker (the decode worker of a disaggregated request).
    pub worker: &'a str,
    /// The prefill worker, when there is one.
    pub prefill_worker: Option<&'a str>,
    /// Cached blocks of the prompt on the chosen worker.
    pub overlap_blocks: u64,
    /// Prompt blocks.
    pub prompt_blocks: u64,
    pub cost: f64,
    /// The routing mode (`kv`, `round-robin`, ...).
    pub mode: &'a str,
    /// Time the request waited for admission before routing (µs).
    pub queue_wait_us: u64,
}

impl RequestSpan {
    /// A span that records nothing (tracing off).
    pub fn none() -> RequestSpan {
        RequestSpan { inner: None }
    }

    /// Whether this request is traced (and sampled).
    pub fn recording(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|(_, cx)| cx.span().span_context().is_sampled())
    }

    /// The trace id (32 hex digits), when traced.
    pub fn trace_id(&self) -> Option<String> {
        self.inner
            .as_ref()
            .map(|(_, cx)| cx.span().span_context().trace_id().to_string())
    }

    pub fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some((_, cx)) = &self.inner {
            cx.span().set_attribute(KeyValue::new(key, value));
        }
    }

    fn child(&self, name: &'static str, kind: SpanKind) -> Stage {
        Stage {
            inner: self.inner.as_ref().map(|(i, cx)| {
                let s = i
                    .tracer
                    .span_builder(name)
                    .with_kind(kind)
                    .start_with_context(&i.tracer, cx);
                (i.clone(), cx.with_span(s))
            }),
        }
    }

    /// The `tokenize` child span (ends when dropped).
    pub fn tokenize(&self) -> Stage {
        self.child("tokenize", SpanKind::Internal)
    }

    /// The `route` child span; [`Stage::decision`] records what was chosen.
    pub fn route(&self) -> Stage {
        self.child("route", SpanKind::Internal)
    }

    /// The `upstream` child span of one attempt on `worker`; its
    /// [`Stage::propagation`] is what the worker receives.
    pub fn upstream(&self, worker: &str, attempt: u32) -> Stage {
        let s = self.child("upstream", SpanKind::Client);
        s.set("kvroute.worker", worker.to_string());
        s.set("kvroute.attempt", i64::from(attempt));
        s
    }

    /// Ends the request with its HTTP status and outcome (`ok`, `error`, `aborted`...).
    pub fn end(self, status: u16, outcome: &str) {
        if let Some((_, cx)) = &self.inner {
            let span = cx.span();
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            span.set_attribute(KeyValue::new("kvroute.outcome", outcome.to_string()));
            if status >= 500 {
                span.set_status(Status::error(outcome.to_string()));
            }
            span.end();
        }
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        if let Some((_, cx)) = &self.inner {
            cx.span().end();
        }
    }
}

/// A child span of a request (ends when dropped, or at [`Stage::end`]).
pub struct Stage {
    inner: Option<(Arc<Inner>, Context)>,
}

impl Stage {
    pub fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some((_, cx)) = &self.inner {
            cx.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// The routing decision (on the `route` span).
    pub fn decision(&self, r: &RouteAttrs<'_>) {
        if self.inner.is_none() {
            return;
        }
        self.set("kvroute.worker", r.worker.to_string());
        if let Some(p) = r.prefill_worker {
            self.set("kvroute.prefill_worker", p.to_string());
        }
        self.set("kvroute.overlap_blocks", r.overlap_blocks as i64);
        self.set("kvroute.prompt_blocks", r.prompt_blocks as i64);
        self.set("kvroute.cost", r.cost);
        self.set("kvroute.mode", r.mode.to_string());
        self.set("kvroute.queue_wait_us", r.queue_wait_us as i64);
    }

    /// The first output token arrived `ttft_us` after the request (on `upstream`).
    pub fn first_token(&self, ttft_us: u64) {
        self.set("kvroute.ttft_us", ttft_us as i64);
    }

    /// The attempt ended: output tokens and outcome (`ok`, `error`, `aborted`...).
    pub fn finish(self, tokens: u32, outcome: &str) {
        if let Some((_, cx)) = &self.inner {
            let span = cx.span();
            span.set_attribute(KeyValue::new(
                "gen_ai.usage.output_tokens",
                i64::from(tokens),
            ));
            span.set_attribute(KeyValue::new("kvroute.outcome", outcome.to_string()));
            if outcome != "ok" {
                span.set_status(Status::error(outcome.to_string()));
            }
        }
    }

    /// The `traceparent` (and `tracestate`) naming this span, for the request sent to
    /// the worker (empty when not traced).
    pub fn propagation(&self) -> Vec<(String, String)> {
        let Some((i, cx)) = &self.inner else {
            return Vec::new();
        };
        let mut h: HashMap<String, String> = HashMap::new();
        i.propagator.inject_context(cx, &mut h);
        let mut v: Vec<(String, String)> = h.into_iter().collect();
        v.sort();
        v
    }

    pub fn end(self) {}
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Some((_, cx)) = &self.inner {
            cx.span().end();
        }
    }
}
