//! The OpenTelemetry spans of one proxied request (`crate::trace`), as the pipeline
//! drives them: the request span (continuing the client's `traceparent`), its
//! `tokenize` and `route` children (the decision: worker, overlap, cost, mode), one
//! `upstream` child per attempt (worker, attempt, TTFT, output tokens, outcome), and
//! the `traceparent` / `tracestate` sent to the worker, naming the attempt's span, so
//! the engine's own spans join the trace.
//!
//! Guarantees: with tracing off (or the request not sampled) every call is a no-op
//! and the client's own `traceparent` / `tracestate` go to the worker unchanged; the
//! request span ends exactly once, with the response's status, when the answer's
//! body ends (streamed) or when the proxy answers itself; nothing here blocks.

use super::request::Endpoint;
use crate::engine::RouteDecision;
use crate::trace::{RequestSpan, RouteAttrs, Stage, Tracing};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use std::time::Instant;

/// The headers of W3C trace context.
const CONTEXT: [&str; 2] = ["traceparent", "tracestate"];

/// The spans of one request.
pub struct ReqTrace {
    req: RequestSpan,
    upstream: Option<Stage>,
    /// The client's trace context, sent on when this request is not traced.
    client: Vec<(HeaderName, HeaderValue)>,
    started: Instant,
    /// The answer's HTTP status, once the worker answered.
    status: u16,
    ended: bool,
}

impl Default for ReqTrace {
    fn default() -> ReqTrace {
        ReqTrace {
            req: RequestSpan::none(),
            upstream: None,
            client: Vec::new(),
            started: Instant::now(),
            status: 0,
            ended: true,
        }
    }
}

/// The outcome of an answer the proxy made itself, by its status.
pub fn outcome_of(status: u16) -> &'static str {
    match status {
        200..=299 => "ok",
        499 => "client_disconnect",
        400..=498 => "refused",
        _ => "error",
    }
}

impl ReqTrace {
    /// The request span of a request on `endpoint` with `headers` (`tracing`: the
    /// process's tracer, if any).
    pub fn start(tracing: Option<&Tracing>, endpoint: Endpoint, headers: &HeaderMap) -> ReqTrace {
        let client = CONTEXT
            .iter()
            .filter_map(|k| Some((HeaderName::from_static(k), headers.get(*k)?.clone())))
            .collect();
        let req = match tracing {
            Some(t) if t.enabled() => {
                let name = format!("POST {}", endpoint.path());
                let r = t.request(&name, |k| headers.get(k)?.to_str().ok());
                r.set("http.request.method", "POST");
                r.set("url.path", endpoint.path());
                r
            }
            _ => RequestSpan::none(),
        };
        ReqTrace {
            req,
            upstream: None,
            client,
            started: Instant::now(),
            status: 0,
            ended: false,
        }
    }

    /// The requested model (`gen_ai.request.model`).
    pub fn model(&self, model: &str) {
        if self.req.recording() {
            self.req.set("gen_ai.request.model", model.to_string());
        }
    }

    /// The `tokenize` span (ends when dropped).
    pub fn tokenize(&self) -> Stage {
        self.req.tokenize()
    }

    /// The `route` span (ends when dropped).
    pub fn route(&self) -> Stage {
        self.req.route()
    }

    /// Records decision `d` on the `route` span; `queue_wait_us`: how long the request
    /// waited in the admission queue before this attempt (0: it did not).
    pub fn decision(
        stage: &Stage,
        d: &RouteDecision,
        prompt_blocks: u64,
        mode: &str,
        queue_wait_us: u64,
    ) {
        stage.decision(&RouteAttrs {
            worker: &d.decode_worker,
            prefill_worker: d.prefill_worker.as_deref(),
            overlap_blocks: u64::from(d.overlap.own()),
            prompt_blocks,
            cost: d.cost,
            mode,
            queue_wait_us,
        });
    }

    /// Starts the `upstream` span of attempt `attempt` on `worker` (the previous
    /// attempt's, if any, ended).
    pub fn upstream(&mut self, worker: &str, attempt: u32) {
        self.upstream = Some(self.req.upstream(worker, attempt));
    }

    /// The current attempt failed before an answer (`outcome`: the failure).
    pub fn attempt_failed(&mut self, outcome: &str) {
        if let Some(s) = self.upstream.take() {
            s.finish(0, outcome);
        }
    }

    /// The trace context headers to send the worker: this request's `upstream` span
    /// when traced, else the client's own.
    pub fn propagation(&self) -> Vec<(HeaderName, HeaderValue)> {
        let ours = self
            .upstream
            .as_ref()
            .map(Stage::propagation)
            .unwrap_or_default();
        if ours.is_empty() {
            return self.client.clone();
        }
        ours.into_iter()
            .filter_map(|(k, v)| {
                Some((
                    HeaderName::try_from(k).ok()?,
                    HeaderValue::try_from(v).ok()?,
                ))
            })
            .collect()
    }

    /// The worker answered with `status` (its body streams on).
    pub fn answered(&mut self, status: u16) {
        self.status = status;
    }

    /// The answer's body ended (`outcome`) after `tokens` output tokens.
    pub fn finish(&mut self, tokens: u32, outcome: &str) {
        self.end(self.status, tokens, outcome);
    }

    /// The first output token arrived (TTFT on the `upstream` span).
    pub fn first_token(&self) {
        if let Some(s) = &self.upstream {
            s.first_token(self.started.elapsed().as_micros() as u64);
        }
    }

    /// The request ended: the attempt with `tokens` output tokens and `outcome`, the
    /// request with HTTP `status`. Later calls do nothing.
    pub fn end(&mut self, status: u16, tokens: u32, outcome: &str) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        if let Some(s) = self.upstream.take() {
            s.finish(tokens, outcome);
        }
        std::mem::replace(&mut self.req, RequestSpan::none()).end(status, outcome);
    }
}
