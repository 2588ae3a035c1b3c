//! One proxied completion, on the core that accepted it: admission, body limit,
//! parsing, prompt tokens, routing (`service::routing::router::route`), the prefill leg of a
//! disaggregated decision, the upstream request, and re-routing after failures before
//! the first response byte (`retry`), with each worker's breaker (`breaker`) kept per
//! core.
//!
//! A client body loses the members engines trust as engine-to-engine data (`strip`)
//! before anything is forwarded; `kv_transfer_params` is then set only from the
//! prefill worker's answer (`pd`).
//!
//! Every routing attempt is its own kvroute request (`request::router_id`, `.rN` for
//! re-routes) whose load is released (`finish`) as soon as the attempt fails, so a
//! failed worker never keeps load; the final response says how many re-routes it took
//! (`x-kvroute-retries`) and `kvroute_proxy_retries_total` counts them.
//!
//! Overload is answered, never dropped: `max_concurrent` reached, or every worker tried
//! answering 429 (at its limit), gives the client a 429 in OpenAI's error shape with a
//! `retry-after` header (`overloaded`); a worker's 429 is re-routed like a 5xx but is
//! not held against its breaker. With the admission queue on, a request every worker
//! tried refused waits in its model's queue instead (`admit`), and retries afresh when
//! granted.

use super::body;
use super::breaker::Allow;
use super::front::Front;
use super::health::{self, breaker_failure, breaker_success, spawn_probe};
use super::pool::{self, Conn};
use super::request::{self, ClientRequest, Endpoint};
use super::retry::{self, Failure, Policy};
use super::spans::ReqTrace;
use super::state::{FieldLabel, KindLabel, ProxyShared};
use super::url::UpstreamUrl;
use super::watch::{unless_gone, ClientWatch};
use crate::engine::request::LifeOp;
use crate::engine::RouteRequest;
use bytes::Bytes;
use futures_lite::FutureExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

mod admit;
mod ends;

use super::respond::{error, overloaded, Resp};
use admit::Turn;

thread_local! {
    static COUNTER: Cell<u64> = const { Cell::new(0) };
}

fn refused(core: &Front, kind: &'static str) {
    core.state
        .metrics
        .refused
        .get_or_create(&KindLabel { kind })
        .inc();
}

fn next_counter() -> u64 {
    COUNTER.with(|c| {
        let v = c.get().wrapping_add(1);
        c.set(v);
        v
    })
}

/// Handles a `POST` on `endpoint` (completions, chat, `agents`); `watch`: the
/// client's connection, whose closing aborts the request at once. Its spans
/// (`spans`) end with the answer: here when the proxy answers itself, with the body
/// when a worker's answer streams back.
pub async fn completions(
    core: Front,
    endpoint: Endpoint,
    req: Request<Incoming>,
    watch: Rc<ClientWatch>,
) -> Resp {
    let tracing = core.state.tracing.get();
    let trace = ReqTrace::start(tracing, endpoint, req.headers());
    let trace = Rc::new(RefCell::new(trace));
    let resp = pipeline(core, endpoint, req, watch, trace.clone()).await;
    let status = resp.status().as_u16();
    trace
        .borrow_mut()
        .end(status, 0, super::spans::outcome_of(status));
    resp
}

async fn pipeline(
    core: Front,
    endpoint: Endpoint,
    req: Request<Incoming>,
    watch: Rc<ClientWatch>,
    trace: Rc<RefCell<ReqTrace>>,
) -> Resp {
    let sh = core.clone();
    let ps = &sh.handle.settings().proxy;
    let started = Instant::now();
    let admitted = match ProxyShared::admit(&sh.state, ps.max_concurrent) {
        Some(a) => a,
        // At the cap: wait for a slot in the queue, if it is on (`queued`).
        None => match super::queued::wait_for_slot(&sh, req.headers(), &watch).await {
            super::queued::Slot::Admitted(a) => a,
            super::queued::Slot::Answer(r) => {
                refused(&core, "too_many");
                return r;
            }
            super::queued::Slot::Off => {
                refused(&core, "too_many");
                return overloaded(
                    "too_many_requests",
                    &format!("more than {} proxied requests in flight", ps.max_concurrent),
                    1,
                );
            }
        },
    };
    let limit = ps.max_body_bytes;
    let too_large = |core: &Front| {
        refused(core, "too_large");
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            &format!("request body larger than {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(&core);
    }
    let fwd_headers = super::agents::front::forwarded_headers(endpoint, req.headers());
    let client_id = request::client_request_id(
        req.headers().get("x-request-id").map(|v| v.as_bytes()),
        || format!("kvr-{:016x}", rand::random::<u64>()),
    );
    let (parts, body) = req.into_parts();
    let raw = match Limited::new(body, limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(&core),
        Err(e) => {
            refused(&core, "bad_request");
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "bad_body",
                &format!("reading the request body: {e}"),
            );
        }
    };
    let parsed = request::parse(&raw);
    (sh.state.metrics.read_seconds).observe(started.elapsed().as_secs_f64());
    let mut creq = match parsed {
        Ok(c) => c,
        Err(e) => {
            refused(&core, "bad_request");
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_json",
                &e.0,
            );
        }
    };
    // Engine-to-engine members never come from a client (`strip`): the body then goes
    // out with them cut from its bytes, on every leg.
    let stripped = creq.body.strip();
    let raw = if stripped.is_empty() {
        raw
    } else {
        for field in stripped {
            (sh.state.metrics.stripped)
                .get_or_create(&FieldLabel { field })
                .inc();
        }
        creq.body.bytes().clone()
    };
    trace.borrow().model(&creq.model);
    // A Responses follow-up goes to the worker that stored what it continues.
    let pinned = match super::agents::front::pin(&core, endpoint, &creq.body) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    let t0 = Instant::now();
    let span = trace.borrow().tokenize();
    let (creq, tokens) = super::offload::tokenize(&core, endpoint, creq, raw.len()).await;
    if let Ok(Some(t)) = &tokens {
        span.set("kvroute.prompt_tokens", t.len() as i64);
    }
    drop(span);
    let tokens = match tokens {
        Ok(t) => t,
        Err(e) => {
            refused(&core, "bad_request");
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_prompt",
                &e.0,
            );
        }
    };
    let m = &sh.state.metrics;
    m.tokenize_seconds.observe(t0.elapsed().as_secs_f64());
    if tokens.is_none() && !super::agents::passthrough(endpoint) {
        m.untokenized.inc();
    }
    let prompt_tokens = tokens.as_ref().map_or(raw.len() / 4, Vec::len) as u64;
    // The hints read a few members: a tree of those only, when there are policies.
    let hinted = match sh.state.policies.get() {
        None => serde_json::Value::Null,
        Some(_) => creq.body.subset(&request::HINTS).unwrap_or_default(),
    };
    let front =
        match super::front_door::front_door(&sh.state, &parts.headers, &hinted, prompt_tokens) {
            Ok(f) => f,
            Err(r) => {
                refused(&core, "policy");
                return *r;
            }
        };
    let job = Job {
        core: core.clone(),
        endpoint,
        creq,
        raw,
        client_id,
        counter: next_counter(),
        tokens,
        started,
        watch,
        front,
        pinned,
        fwd_headers,
        trace,
    };
    job.run(admitted).await
}

struct Job {
    core: Front,
    endpoint: Endpoint,
    creq: ClientRequest,
    raw: Bytes,
    client_id: String,
    counter: u64,
    tokens: Option<Vec<u32>>,
    started: Instant,
    watch: Rc<ClientWatch>,
    /// Hints and tenant (`policies`), if the service has policies.
    front: Option<super::policies::Front>,
    /// The only worker this request may go to (`agents::front::pin`).
    pinned: Option<String>,
    /// Client headers sent on to the worker (`agents::front::forwarded_headers`).
    fwd_headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// The request's spans (`spans`); moved into the streamed answer (`respond`).
    trace: Rc<RefCell<ReqTrace>>,
}

/// The upstream answered with a head: its response and connection.
struct Answer {
    resp: Response<Incoming>,
    conn: Conn,
}

impl Job {
    async fn run(mut self, admitted: super::state::Admitted) -> Resp {
        let sh = self.core.clone();
        let ps = &sh.handle.settings().proxy;
        let policy = Policy {
            retries: ps.retries,
            backoff_ms: ps.retry_backoff_ms,
        };
        let mut excluded: Vec<String> = Vec::new();
        let mut attempt = 0u32;
        let mut last: Option<(String, Failure)> = None;
        // Every wait on a worker below ends as soon as the client goes away (`watch`).
        let mut gone = self.watch.gone();
        // A grant from the admission queue, until a worker takes the request (`queued`).
        let mut turn = None;
        // The attempt every worker tried answered 429 on (`bounced`), the attempt the
        // retries restart from after a grant (`since`), no retry left (`spent`).
        let (mut bounced, mut since, mut spent) = (None, 0u32, false);
        loop {
            let allow = (!spent).then(|| self.allow_list(&excluded)).flatten();
            let Some(allow) = allow else {
                let at = bounced
                    .take()
                    .filter(|_| last.as_ref().is_some_and(|l| retry::is_busy(l.1)));
                match self.wait_refused(at, turn.take(), &mut gone).await {
                    None if spent => return self.gave_up(last.as_ref()),
                    None => return self.no_worker(last.as_ref()),
                    Some(Turn::Go(g)) => {
                        (turn, last, spent, since) = (Some(g), None, false, attempt);
                        excluded.clear();
                        continue;
                    }
                    Some(Turn::Answer(r)) => return r,
                    Some(Turn::Left) => return self.client_left(None, ""),
                }
            };
            let rid = request::router_id(
                &self.client_id,
                &sh.state.nonce,
                self.core.handle.core_id(),
                self.counter,
                attempt,
            );
            let mut rr = self.route_request(&rid, allow);
            let seen = self.queue_epoch(&rr);
            let span = self.trace.borrow().route();
            let routed = match self.queued_before(&rr, &turn) {
                true => Err(None),
                false => self.core.handle.route(&rr).await.map_err(Some),
            };
            self.tokens = rr.tokens.take();
            let mut d = match routed {
                Ok(d) => d,
                Err(e) if self.waits(e.as_ref(), &rr) => {
                    drop(span);
                    match self.wait_turn(&rr, seen, turn.take(), &mut gone).await {
                        Turn::Go(g) => turn = Some(g),
                        Turn::Answer(r) => return r,
                        Turn::Left => return self.client_left(None, ""),
                    }
                    continue;
                }
                Err(Some(e)) => return self.route_failed(&e, last.as_ref()),
                Err(None) => return self.gave_up(last.as_ref()),
            };
            let blocks = self.tokens.as_ref().map_or(0, |t| t.len() as u64)
                / u64::from(sh.handle.settings().router.block_size.max(1));
            let waited = turn.as_ref().map_or(0, admit::Held::waited_us);
            let mode = sh.handle.settings().router.mode.name();
            ReqTrace::decision(&span, &d, blocks, mode, waited);
            drop(span);
            let mut body = self.raw.clone();
            let mut fallback = false;
            if let Some(p) = d.prefill_worker.clone() {
                let Some(leg) = unless_gone(&mut gone, self.prefill_leg(&p)).await else {
                    return self.client_left(Some(&rid), &p);
                };
                match leg {
                    Ok(params) => {
                        breaker_success(&self.core, &p);
                        body = Bytes::from(super::pd::decode_body(&self.creq.body, params));
                    }
                    Err(f) => {
                        self.upstream_failed(&p, f);
                        sh.state
                            .metrics
                            .upstream_errors
                            .get_or_create(&KindLabel { kind: "prefill" })
                            .inc();
                        sh.state.metrics.prefill_fallbacks.inc();
                        fallback = true;
                        match self
                            .core
                            .handle
                            .lifecycle(LifeOp::PrefillFailed, &rid)
                            .await
                        {
                            Ok(Some(d2)) => d = d2,
                            Ok(None) => {}
                            Err(e) => return self.route_failed(&e, Some(&(p, f))),
                        }
                    }
                }
            }
            let w = d.decode_worker.clone();
            self.trace.borrow_mut().upstream(&w, attempt);
            let sent = unless_gone(&mut gone, self.send(&w, body, self.creq.stream)).await;
            let Some(sent) = sent else {
                return self.client_left(Some(&rid), &w);
            };
            match sent {
                Ok(a) => {
                    // A grant is used up once a worker takes the request (until then a
                    // 429 puts the request back in its place).
                    if let Some(h) = turn.take() {
                        h.served();
                    }
                    breaker_success(&self.core, &w);
                    let mut r = self.respond(a, &rid, &w, attempt, fallback, (admitted, gone));
                    self.prefill_path(&mut r, &d);
                    return r;
                }
                Err(f) => {
                    self.upstream_failed(&w, f);
                    self.trace.borrow_mut().attempt_failed(f.label());
                    body::life(&self.core, LifeOp::Finish, &rid);
                    excluded.push(w.clone());
                    last = Some((w, f));
                    // The epoch after the refusal (see `admit::wait_refused`).
                    bounced = retry::is_busy(f).then(|| (rr.model.clone(), self.queue_epoch(&rr)));
                    attempt += 1;
                    match policy.backoff(attempt - since) {
                        // A worker at its own limit, with the queue on: the next try
                        // goes to another worker or back to the request's place in
                        // the queue, at once. Backing off outside the queue would let
                        // a worse waiter take the capacity the queue grants meanwhile.
                        Some(_) if self.queue_waits(f, &rr) => {
                            sh.state.metrics.retries.inc();
                        }
                        Some(wait) => {
                            sh.state.metrics.retries.inc();
                            let slept = glommio::timer::sleep(wait);
                            if unless_gone(&mut gone, slept).await.is_none() {
                                let w = last.as_ref().map_or("", |(w, _)| w.as_str());
                                return self.client_left(None, w);
                            }
                        }
                        None => spent = true,
                    }
                }
            }
        }
    }

    /// The route request for this attempt. It borrows the prompt's tokens (no copy of
    /// a long prompt per attempt): the caller puts them back in `tokens` once routed.
    fn route_request(&mut self, rid: &str, allow: Vec<String>) -> RouteRequest {
        let mut r = super::route_request::route_request(
            self.core.handle.tokenizers().map(|t| &**t),
            &self.creq,
            self.tokens.take(),
            self.raw.len(),
            rid,
            allow,
        );
        if let Some(f) = &self.front {
            // Dynamo's `nvext.agent_hints.osl` is the expected length; `max_tokens` a cap.
            r.expected_output_tokens = f.hints.osl.or(r.expected_output_tokens);
            r.session = f.hints.session;
        }
        r
    }

    /// Workers with a URL, not failed for this request, whose breaker is closed here
    /// (starting the probe of one whose open interval is over). `None`: none.
    fn allow_list(&self, excluded: &[String]) -> Option<Vec<String>> {
        let sh = &self.core;
        let reg = sh.handle.registry();
        let now = sh.handle.now_ms();
        let ps = &sh.handle.settings().proxy;
        let mut out = Vec::new();
        for e in reg.iter() {
            let Some(url) = &e.spec.url else { continue };
            if excluded.contains(&e.spec.id)
                || self.pinned.as_ref().is_some_and(|p| *p != e.spec.id)
                || !super::agents::candidate(self.endpoint, e.spec.role)
            {
                continue;
            }
            let allow = health::allow(&e.spec.id, now);
            match allow {
                Allow::Yes => out.push(e.spec.id.clone()),
                Allow::No => {}
                Allow::Probe => spawn_probe(&self.core, &e.spec.id, url, ps.connect_timeout_ms),
            }
        }
        (!out.is_empty()).then_some(out)
    }

    fn upstream_failed(&self, worker: &str, f: Failure) {
        let sh = &self.core;
        sh.state
            .metrics
            .upstream_errors
            .get_or_create(&KindLabel { kind: f.label() })
            .inc();
        // At its limit is not unhealthy: opening its breaker (and dropping its pooled
        // connections) under load would turn a 429 into 502/503 for everyone.
        if retry::is_busy(f) {
            return;
        }
        breaker_failure(&self.core, worker);
        if let Some(u) = worker_url(&self.core, worker) {
            pool::forget(&u.authority);
        }
    }

    async fn send(&self, worker: &str, body: Bytes, stream: bool) -> Result<Answer, Failure> {
        let _ = stream;
        let url = worker_url(&self.core, worker).ok_or(Failure::NoUrl)?;
        let ps = &self.core.handle.settings().proxy;
        let connect = Duration::from_millis(ps.connect_timeout_ms);
        let timeout = Duration::from_millis(ps.request_timeout_ms);
        for _ in 0..2 {
            let asked = Instant::now();
            let (mut conn, pooled) = pool::get(&url, connect).await?;
            let mut head = Request::post(url.path(self.endpoint.path()))
                .header(hyper::header::HOST, url.authority.as_str())
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .header("x-request-id", self.client_id.as_str());
            for (k, v) in &self.fwd_headers {
                head = head.header(k, v);
            }
            for (k, v) in self.trace.borrow().propagation() {
                head = head.header(k, v);
            }
            let req = (self.core.state)
                .authorize(head)
                .body(Full::new(body.clone()))
                .map_err(|_| Failure::NoUrl)?;
            let sent = async { conn.sender.send_request(req).await.map_err(Some) }
                .or(async {
                    glommio::timer::sleep(timeout).await;
                    Err(None)
                })
                .await;
            if sent.is_ok() {
                let m = &self.core.state.metrics;
                m.upstream_head_seconds
                    .observe(asked.elapsed().as_secs_f64());
            }
            match sent {
                Ok(resp) if retry::is_failure_status(resp.status().as_u16()) => {
                    return Err(Failure::Status(resp.status().as_u16()))
                }
                Ok(resp) if resp.status() == StatusCode::TOO_MANY_REQUESTS => {
                    let ra = resp.headers().get(hyper::header::RETRY_AFTER);
                    let f = retry::busy(ra.map(|v| v.as_bytes()));
                    // Read the short refusal whole (bounded) so the connection goes
                    // back to the pool: an overloaded worker should not also get a
                    // new connection for each retry.
                    let drained = async {
                        Limited::new(resp.into_body(), 64 << 10)
                            .collect()
                            .await
                            .is_ok()
                    }
                    .or(async {
                        glommio::timer::sleep(timeout).await;
                        false
                    })
                    .await;
                    if drained {
                        pool::put(conn, ps.pool_max_idle);
                    }
                    return Err(f);
                }
                Ok(resp) => return Ok(Answer { resp, conn }),
                Err(None) => return Err(Failure::Timeout),
                // A pooled connection the worker had closed: once more on a new one.
                Err(Some(_)) if pooled => continue,
                Err(Some(_)) => return Err(Failure::Reset),
            }
        }
        Err(Failure::Reset)
    }

    /// The prefill leg: the NIXL prefill request, its answer read whole (bounded) for
    /// its `kv_transfer_params`.
    async fn prefill_leg(&self, worker: &str) -> Result<serde_json::Value, Failure> {
        let ps = &self.core.handle.settings().proxy;
        let body = Bytes::from(super::pd::prefill_body(&self.creq.body));
        let a = self.send(worker, body, false).await?;
        if !a.resp.status().is_success() {
            return Err(Failure::Status(a.resp.status().as_u16()));
        }
        let timeout = Duration::from_millis(ps.request_timeout_ms);
        let read = async {
            Limited::new(a.resp.into_body(), ps.max_prefill_response_bytes)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .map_err(|_| Failure::Reset)
        }
        .or(async {
            glommio::timer::sleep(timeout).await;
            Err(Failure::Timeout)
        })
        .await?;
        pool::put(a.conn, ps.pool_max_idle);
        super::pd::answer_params(&read).ok_or(Failure::Status(0))
    }
}

fn worker_model(core: &Front, worker: &str) -> String {
    (core.handle.registry())
        .by_id(worker)
        .map(|e| e.spec.model.clone())
        .unwrap_or_default()
}

fn worker_url(core: &Front, worker: &str) -> Option<UpstreamUrl> {
    let reg = core.handle.registry();
    let u = reg.by_id(worker)?.spec.url.as_ref()?;
    UpstreamUrl::parse(u).ok()
}
