//! The HTTP side of one simulated vLLM worker: hyper 1 (HTTP/1.1, keep-alive) on
//! tokio. Routes `POST /v1/completions`, `POST /v1/chat/completions` (streamed as SSE
//! `data: …` chunks ending in `data: [DONE]`, or whole), `GET /v1/models`,
//! `GET /health` and `GET /stats`; the other vLLM endpoints (`/v1/messages`,
//! `/v1/responses`, `/v1/embeddings`, `/tokenize`, `/detokenize`) are `agent`'s. Every
//! generation goes through [`generate`], framed per API (`sim::agent_api::Framing`).
//!
//! Guarantees: the body is read through a size limit (413 beyond, nothing larger is
//! buffered); at most `max_active` requests run (429 beyond); a request's slot and
//! cache pins are released however it ends (finished, client gone, injected failure),
//! by a drop guard; a client that disconnects stops its generation at the next token.

use super::events::{Events, Job};
use crate::clock::sleep_until;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Method, Request, Response, StatusCode};
use kvroute::sim::agent_api::Framing;
use kvroute::sim::live::{Admission, LiveWorker};
use kvroute::sim::openai::{self as oa, Api, OpenAiRequest, ResponseMeta};
use kvroute::types::Role;
use serde_json::{json, Value};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything one worker's handlers share.
pub struct WorkerCtx {
    pub id: String,
    pub model: String,
    pub role: Role,
    pub url: String,
    pub port: u16,
    pub max_body: usize,
    pub max_tokens_cap: u32,
    /// Fraction of generation requests answered 500 on purpose.
    pub fail_rate: f64,
    /// Abort each stream after this many chunks (0 = never).
    pub die_after_chunks: u32,
    /// `--api-key`: `/v1/*` requests must carry `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    pub worker: Arc<Mutex<LiveWorker>>,
    /// `--tokenizer`: prompts are tokenized with it (else `t{N}` words are ids).
    pub tokenizers: Option<Arc<kvroute::tokenize::Tokenizers>>,
    pub events: Events,
    pub epoch: Instant,
    pub counter: AtomicU64,
    /// `/v1/responses` answers stored for `previous_response_id` (bounded, TTL).
    pub responses: Mutex<super::agent::Store>,
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The response body: whole, or a stream of chunks fed by the generating task. A whole
/// body gives hyper its length, so it goes out with `content-length` as an engine's
/// JSON answer does (vLLM's and SGLang's servers send one), not chunked.
pub enum SimBody {
    Full(Full<Bytes>),
    Chan(mpsc::Receiver<Result<Bytes, BoxError>>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            SimBody::Full(f) => Pin::new(f).poll_frame(cx).map_err(|e| match e {}),
            SimBody::Chan(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Full(f) => f.is_end_stream(),
            SimBody::Chan(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(f) => f.size_hint(),
            SimBody::Chan(_) => SizeHint::default(),
        }
    }
}

pub fn json_response(status: StatusCode, v: &Value) -> Response<SimBody> {
    let mut r = Response::new(SimBody::Full(Full::new(Bytes::from(v.to_string()))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

pub fn error(status: StatusCode, msg: &str) -> Response<SimBody> {
    let kind = match status.as_u16() {
        429 => "RateLimitError",
        400 | 413 => "BadRequestError",
        404 => "NotFoundError",
        _ => "InternalServerError",
    };
    json_response(status, &oa::error_body(msg, kind, status.as_u16()))
}

/// Whether `req` may use `path`: with an API key, `/v1` routes need it as a Bearer
/// token (vLLM leaves `/health` and its other routes open).
fn authorized(ctx: &WorkerCtx, path: &str, req: &Request<Incoming>) -> bool {
    let Some(key) = &ctx.api_key else {
        return true;
    };
    if !path.starts_with("/v1") || req.method() == Method::OPTIONS {
        return true;
    }
    kvroute::credentials::bearer(req.headers()).is_some_and(|t| t == key)
}

/// Handles one request.
pub async fn handle(
    ctx: Arc<WorkerCtx>,
    req: Request<Incoming>,
) -> Result<Response<SimBody>, BoxError> {
    let path = req.uri().path().to_string();
    if !authorized(&ctx, &path, &req) {
        // vLLM's answer (`--api-key`): every `/v1` route, with this exact body.
        return Ok(json_response(
            StatusCode::UNAUTHORIZED,
            &json!({"error": "Unauthorized"}),
        ));
    }
    let api = match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => {
            return Ok(Response::new(SimBody::Full(Full::new(Bytes::new()))))
        }
        (&Method::GET, "/v1/models") => return Ok(json_response(StatusCode::OK, &models(&ctx))),
        (&Method::GET, "/stats") | (&Method::GET, "/metrics") => {
            return Ok(json_response(StatusCode::OK, &stats(&ctx)))
        }
        (&Method::POST, "/v1/completions") => Api::Completions,
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, p) if super::agent::serves(p) => {
            let body = match read_body(&ctx, req).await? {
                Ok(b) => b,
                Err(r) => return Ok(r),
            };
            return super::agent::handle(ctx, &path, body).await;
        }
        _ => {
            return Ok(error(
                StatusCode::NOT_FOUND,
                &format!("no route for {path}"),
            ))
        }
    };
    let body = match read_body(&ctx, req).await? {
        Ok(b) => b,
        Err(r) => return Ok(r),
    };
    let mut r = match oa::parse_request(api, &body, ctx.max_tokens_cap) {
        Ok(r) => r,
        Err(e) => return Ok(error(StatusCode::BAD_REQUEST, &e)),
    };
    if let Some(t) = &ctx.tokenizers {
        // Tokenize as the router does (chat template, BOS), so block hashes agree.
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let ep = match api {
            Api::Completions => kvroute::tokenize::Endpoint::Completions,
            Api::Chat => kvroute::tokenize::Endpoint::Chat,
        };
        match t.prompt_tokens(ep, &ctx.model, &v) {
            Ok(Some(toks)) => r.tokens = toks,
            Ok(None) => {}
            Err(e) => return Ok(error(StatusCode::BAD_REQUEST, &e.0)),
        }
    }
    if let Some(resp) = check_model(&ctx, &r.model) {
        return Ok(resp);
    }
    let framing = Framing::OpenAi(api);
    let n = ctx.counter.fetch_add(1, Ordering::Relaxed);
    if let Some(resp) = inject_failure(&ctx, n, framing) {
        return Ok(resp);
    }
    generate(ctx, r, n, Gen::plain(framing)).await
}

/// The body, read through the size limit (413 beyond).
pub async fn read_body(
    ctx: &WorkerCtx,
    req: Request<Incoming>,
) -> Result<Result<Bytes, Response<SimBody>>, BoxError> {
    match Limited::new(req.into_body(), ctx.max_body).collect().await {
        Ok(b) => Ok(Ok(b.to_bytes())),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Ok(Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
            )))
        }
        Err(e) => Err(e),
    }
}

/// 404 for a model this worker does not serve (an empty name means its own).
pub fn check_model(ctx: &WorkerCtx, model: &str) -> Option<Response<SimBody>> {
    (!model.is_empty() && model != ctx.model).then(|| {
        error(
            StatusCode::NOT_FOUND,
            &format!("The model `{model}` does not exist."),
        )
    })
}

/// An error in the shape of `framing`'s API (Anthropic's for Messages).
pub fn error_for(framing: Framing, status: StatusCode, msg: &str) -> Response<SimBody> {
    match framing {
        Framing::Messages => {
            let body = kvroute::api_shapes::errors::anthropic_body(status.as_u16(), msg);
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            json_response(status, &v)
        }
        _ => error(status, msg),
    }
}

/// `--fail-rate`: answers request `n` with a 500 when its draw says so.
pub fn inject_failure(ctx: &WorkerCtx, n: u64, framing: Framing) -> Option<Response<SimBody>> {
    (ctx.fail_rate > 0.0 && unit(n ^ ctx.port as u64) < ctx.fail_rate).then(|| {
        lock(&ctx.worker).injected_failure();
        error_for(
            framing,
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected failure (--fail-rate)",
        )
    })
}

/// A stable draw in [0, 1) for request number `n`.
fn unit(n: u64) -> f64 {
    (kvroute::hash::mix_external_id(n) >> 11) as f64 / (1u64 << 53) as f64
}

fn models(ctx: &WorkerCtx) -> Value {
    json!({"object": "list", "data": [{
        "id": ctx.model, "object": "model", "created": 0, "owned_by": "kvroute-sim",
        "root": ctx.model, "parent": null, "max_model_len": MAX_MODEL_LEN,
    }]})
}

/// The context length the simulated model announces.
pub const MAX_MODEL_LEN: u64 = 131_072;

fn stats(ctx: &WorkerCtx) -> Value {
    let w = lock(&ctx.worker);
    let mut v = serde_json::to_value(w.stats()).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("id".into(), json!(ctx.id));
        o.insert("url".into(), json!(ctx.url));
        o.insert("role".into(), json!(ctx.role.name()));
        o.insert("cache_blocks".into(), json!(w.cache().len()));
        o.insert("cache_capacity_blocks".into(), json!(w.cache().capacity()));
        o.insert(
            "events_dropped".into(),
            json!(ctx.events.dropped.load(Ordering::Relaxed)),
        );
    }
    v
}

/// Releases the request's slot and pins however the request ends.
pub struct Slot {
    ctx: Arc<WorkerCtx>,
    adm: Admission,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.ctx.worker).finish(&self.adm);
    }
}

/// Admits `tokens` on the worker (429 in `framing`'s shape when it is full) and
/// publishes the cache events; `transferred`: prompt blocks a remote prefill sent.
pub fn admit(
    ctx: &Arc<WorkerCtx>,
    tokens: &[u32],
    transferred: usize,
    framing: Framing,
) -> Result<(Slot, Instant), Box<Response<SimBody>>> {
    let now_us = ctx.epoch.elapsed().as_micros() as u64;
    let Some(adm) = lock(&ctx.worker).admit(tokens, transferred, now_us) else {
        return Err(Box::new(error_for(
            framing,
            StatusCode::TOO_MANY_REQUESTS,
            "worker at its concurrency limit",
        )));
    };
    ctx.events.send(Job {
        events: adm.events.clone(),
        hashes: adm.hashes.clone(),
        tokens: tokens.to_vec(),
    });
    let first_at = Instant::now() + Duration::from_micros(adm.first_token_in_us);
    Ok((
        Slot {
            ctx: ctx.clone(),
            adm,
        },
        first_at,
    ))
}

/// Called with a completed answer's id and whole text.
pub type OnDone = Box<dyn FnOnce(&str, &str) + Send>;

/// What a generation answers with besides its tokens.
pub struct Gen {
    pub framing: Framing,
    /// Responses: the `previous_response_id` the answer names.
    pub previous: Option<String>,
    /// Called with the answer's id and whole text once it completed (the Responses
    /// store).
    pub on_done: Option<OnDone>,
}

impl Gen {
    pub fn plain(framing: Framing) -> Gen {
        Gen {
            framing,
            previous: None,
            on_done: None,
        }
    }
}

pub fn meta(ctx: &WorkerCtx, framing: Framing, model: &str, n: u64) -> ResponseMeta {
    ResponseMeta {
        id: format!("{}-{}-{n}", framing.id_prefix(), ctx.id),
        model: if model.is_empty() {
            ctx.model.clone()
        } else {
            model.to_string()
        },
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

pub async fn generate(
    ctx: Arc<WorkerCtx>,
    r: OpenAiRequest,
    n: u64,
    g: Gen,
) -> Result<Response<SimBody>, BoxError> {
    // A decode leg's prompt blocks arrive from the prefill worker: all of them unless
    // `remote_block_ids` says how many.
    let transferred = match (r.kv.do_remote_prefill, r.kv.remote_blocks) {
        (false, _) => 0,
        (true, 0) => usize::MAX,
        (true, k) => k,
    };
    let prefill_leg = r.kv.do_remote_decode;
    let (slot, first_at) = match admit(&ctx, &r.tokens, transferred, g.framing) {
        Ok(x) => x,
        Err(resp) => return Ok(*resp),
    };
    let meta = meta(&ctx, g.framing, &r.model, n);
    let prev = g.previous.as_deref();
    let max_tokens = if prefill_leg { 1 } else { r.max_tokens };
    let usage = (r.tokens.len(), max_tokens);
    if !r.stream || prefill_leg {
        sleep_until(first_at).await;
        let mut text = oa::output_word(0);
        let mut t = first_at;
        for i in 1..max_tokens {
            t += Duration::from_micros(lock(&ctx.worker).decode_step_us());
            sleep_until(t).await;
            text.push_str(&oa::output_word(i));
        }
        lock(&ctx.worker).produced(max_tokens);
        let kvp = prefill_leg.then(|| {
            let ids: Vec<u64> = slot.adm.hashes.clone();
            oa::prefill_transfer_params(&ids, &ctx.id, "127.0.0.1", ctx.port)
        });
        let v = g.framing.full(&meta, &text, usage, kvp, prev);
        drop(slot);
        if let Some(f) = g.on_done {
            f(&meta.id, &text);
        }
        return Ok(json_response(StatusCode::OK, &v));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, BoxError>>(16);
    let die = ctx.die_after_chunks;
    let head = g.framing.head(&meta, r.tokens.len(), prev);
    tokio::spawn(async move {
        let _slot = slot;
        let prev = g.previous.as_deref();
        if !head.is_empty() && tx.send(Ok(Bytes::from(head))).await.is_err() {
            return;
        }
        let mut t = first_at;
        let mut text = String::new();
        for i in 0..max_tokens {
            if i > 0 {
                t += Duration::from_micros(_slot.ctx.worker_step());
            }
            sleep_until(t).await;
            if die > 0 && i >= die {
                // A crash after the chunks went out: let the server take and flush
                // them first, so a loaded machine does not cut them with the stream.
                while tx.capacity() < tx.max_capacity() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                lock(&_slot.ctx.worker).injected_failure();
                let _ = tx
                    .send(Err("injected failure (--die-after-chunks)".into()))
                    .await;
                return;
            }
            let word = oa::output_word(i);
            let c = g.framing.token(&meta, i, &word, i + 1 == max_tokens);
            text.push_str(&word);
            if tx.send(Ok(Bytes::from(c))).await.is_err() {
                return; // client gone: stop generating
            }
            lock(&_slot.ctx.worker).produced(1);
        }
        let tail = g.framing.tail(&meta, &text, usage, r.include_usage, prev);
        if let Some(f) = g.on_done {
            f(&meta.id, &text);
        }
        let _ = tx.send(Ok(Bytes::from(tail))).await;
    });
    let mut resp = Response::new(SimBody::Chan(rx));
    let h = resp.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    Ok(resp)
}

impl WorkerCtx {
    fn worker_step(&self) -> u64 {
        lock(&self.worker).decode_step_us()
    }
}
