//! The HTTP side of one simulated vLLM worker: hyper 1 (HTTP/1.1, keep-alive) on
//! tokio. Routes `POST /v1/completions`, `POST /v1/chat/completions` (streamed as SSE
//! `data: …` chunks ending in `data: [DONE]`, or whole), `GET /v1/models`,
//! `GET /health` and `GET /stats`.
//!
//! Guarantees: the body is read through a size limit (413 beyond, nothing larger is
//! buffered); at most `max_active` requests run (429 beyond); a request's slot and
//! cache pins are released however it ends (finished, client gone, injected failure),
//! by a drop guard; a client that disconnects stops its generation at the next token.

use super::events::{Events, Job};
use crate::clock::sleep_until;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The response body: whole, or a stream of chunks fed by the generating task.
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
}

fn json_response(status: StatusCode, v: &Value) -> Response<SimBody> {
    let mut r = Response::new(SimBody::Full(Full::new(Bytes::from(v.to_string()))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, msg: &str) -> Response<SimBody> {
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
        _ => {
            return Ok(error(
                StatusCode::NOT_FOUND,
                &format!("no route for {path}"),
            ))
        }
    };
    let body = match Limited::new(req.into_body(), ctx.max_body).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return Ok(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large",
            ));
        }
        Err(e) => return Err(e),
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
    if !r.model.is_empty() && r.model != ctx.model {
        return Ok(error(
            StatusCode::NOT_FOUND,
            &format!("The model `{}` does not exist.", r.model),
        ));
    }
    let n = ctx.counter.fetch_add(1, Ordering::Relaxed);
    if ctx.fail_rate > 0.0 && unit(n ^ ctx.port as u64) < ctx.fail_rate {
        lock(&ctx.worker).injected_failure();
        return Ok(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected failure (--fail-rate)",
        ));
    }
    generate(ctx, r, n).await
}

/// A stable draw in [0, 1) for request number `n`.
fn unit(n: u64) -> f64 {
    (kvroute::hash::mix_external_id(n) >> 11) as f64 / (1u64 << 53) as f64
}

fn models(ctx: &WorkerCtx) -> Value {
    json!({"object": "list", "data": [{
        "id": ctx.model, "object": "model", "created": 0, "owned_by": "kvroute-sim",
        "root": ctx.model, "parent": null, "max_model_len": 131072,
    }]})
}

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
struct Slot {
    ctx: Arc<WorkerCtx>,
    adm: Admission,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.ctx.worker).finish(&self.adm);
    }
}

async fn generate(
    ctx: Arc<WorkerCtx>,
    r: OpenAiRequest,
    n: u64,
) -> Result<Response<SimBody>, BoxError> {
    let now_us = ctx.epoch.elapsed().as_micros() as u64;
    // A decode leg's prompt blocks arrive from the prefill worker: all of them unless
    // `remote_block_ids` says how many.
    let transferred = match (r.kv.do_remote_prefill, r.kv.remote_blocks) {
        (false, _) => 0,
        (true, 0) => usize::MAX,
        (true, k) => k,
    };
    let prefill_leg = r.kv.do_remote_decode;
    let adm = lock(&ctx.worker).admit(&r.tokens, transferred, now_us);
    let Some(adm) = adm else {
        return Ok(error(
            StatusCode::TOO_MANY_REQUESTS,
            "worker at its concurrency limit",
        ));
    };
    ctx.events.send(Job {
        events: adm.events.clone(),
        hashes: adm.hashes.clone(),
        tokens: r.tokens.clone(),
    });
    let first_at = Instant::now() + Duration::from_micros(adm.first_token_in_us);
    let slot = Slot {
        ctx: ctx.clone(),
        adm,
    };
    let meta = ResponseMeta {
        id: format!(
            "{}-{}-{n}",
            if r.api == Api::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            ctx.id
        ),
        model: if r.model.is_empty() {
            ctx.model.clone()
        } else {
            r.model.clone()
        },
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let max_tokens = if prefill_leg { 1 } else { r.max_tokens };
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
        let finish = "length";
        let v = oa::full_response(r.api, &meta, &text, r.tokens.len(), max_tokens, finish, kvp);
        drop(slot);
        return Ok(json_response(StatusCode::OK, &v));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, BoxError>>(16);
    let die = ctx.die_after_chunks;
    tokio::spawn(async move {
        let _slot = slot;
        let mut t = first_at;
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
            let last = i + 1 == max_tokens;
            let c = oa::chunk(
                r.api,
                &meta,
                &oa::output_word(i),
                i == 0,
                last.then_some("length"),
            );
            if tx.send(Ok(Bytes::from(oa::sse(&c)))).await.is_err() {
                return; // client gone: stop generating
            }
            lock(&_slot.ctx.worker).produced(1);
        }
        let mut tail = String::new();
        if r.include_usage {
            tail.push_str(&oa::sse(&oa::usage_chunk(
                r.api,
                &meta,
                r.tokens.len(),
                max_tokens,
            )));
        }
        tail.push_str(oa::SSE_DONE);
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
