//! The proxy listener (`proxy_addr`): routes, auth, and the hyper connection.
//!
//! Routes (exactly these): `POST /v1/completions`, `POST /v1/chat/completions`, the
//! endpoints of `agents` (`POST /v1/messages`, `/v1/responses`, `/v1/embeddings`,
//! `/tokenize`, `/detokenize`; client keys also accepted as `x-api-key`),
//! `GET /v1/models` (the models of registered workers that have a `url`, OpenAI list
//! shape), `GET /health` (no auth; 503 `draining` once shutdown began, see
//! `service::Running::drain`). When the service has a token or the proxy has
//! client API keys, every other route needs `Authorization: Bearer <token or key>`
//! (compared in constant time); otherwise 401 in OpenAI's error shape. Requests a
//! browser sent first pass the door rules of `service::net::doors` (`Host`, `Origin`, JSON
//! content type; CORS for listed origins).

use super::body::ProxyBody;
use super::forward;
use super::front::Front;
use super::request::Endpoint;
use super::respond::{error, Resp};
use super::watch::ClientWatch;
use crate::service::net::conn_slot::Slot;
use crate::service::net::doors::{self, Door, Pass};
use crate::service::net::hyper_io;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::rc::Rc;
use subtle::ConstantTimeEq;

fn authorized(core: &Front, req: &Request<Incoming>) -> bool {
    let keys = core.state.keys.get().map(Vec::as_slice).unwrap_or(&[]);
    let creds = &core.handle.credentials();
    if !creds.enabled() && keys.is_empty() {
        return true;
    }
    // Anthropic clients send their key as `x-api-key`.
    let presented = crate::credentials::bearer(req.headers())
        .or_else(|| req.headers().get("x-api-key")?.to_str().ok())
        .unwrap_or("");
    if presented.is_empty() {
        return false;
    }
    let mut ok = creds.enabled() && creds.is_admin(presented);
    for k in keys {
        ok |= bool::from(k.as_bytes().ct_eq(presented.as_bytes()));
    }
    ok
}

fn json(status: StatusCode, v: &serde_json::Value) -> Resp {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(ProxyBody::full(Bytes::from(
            serde_json::to_vec(v).unwrap_or_default(),
        )))
        .unwrap_or_else(|_| Response::new(ProxyBody::full(Bytes::new())))
}

/// `GET /v1/models`: one entry per model of the workers that have a `url`.
fn models(core: &Front) -> Resp {
    let reg = core.handle.registry();
    let mut names: Vec<&str> = reg
        .iter()
        .filter(|e| e.spec.url.is_some())
        .map(|e| e.spec.model.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let data: Vec<serde_json::Value> = names
        .into_iter()
        .map(|m| serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "kvroute"}))
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    )
}

/// Handles one request: the door rules for browsers ([`doors`]), then [`answer`].
pub async fn handle(core: Front, req: Request<Incoming>, watch: Rc<ClientWatch>) -> Resp {
    let pass = doors::check(
        core.handle.settings(),
        Door::Proxy,
        req.method(),
        req.headers(),
    );
    match pass {
        Err(r) => {
            let kind = super::state::KindLabel { kind: r.code() };
            core.state.metrics.refused.get_or_create(&kind).inc();
            error(r.status(), "invalid_request_error", r.code(), r.message())
        }
        Ok(Pass::Preflight(origin)) => {
            let mut resp = Response::new(ProxyBody::full(Bytes::new()));
            *resp.status_mut() = StatusCode::NO_CONTENT;
            doors::fill_preflight(resp.headers_mut(), origin, req.headers());
            resp
        }
        Ok(Pass::Cors(origin)) => {
            let mut resp = answer(core, req, watch).await;
            doors::allow_origin(resp.headers_mut(), origin);
            resp
        }
        Ok(Pass::Plain) => answer(core, req, watch).await,
    }
}

/// [`handle`], the proxy's own errors on `/v1/messages` in Anthropic's shape.
async fn handle_any(core: Front, req: Request<Incoming>, watch: Rc<ClientWatch>) -> Resp {
    if req.uri().path() == "/v1/messages" {
        return super::agents::front::anthropic_errors(handle(core, req, watch).await);
    }
    handle(core, req, watch).await
}

/// One request on the proxy port; `watch` tells when its client goes away.
async fn answer(core: Front, req: Request<Incoming>, watch: Rc<ClientWatch>) -> Resp {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if method == Method::GET && path == "/health" {
        if core.handle.draining() {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"status": "draining"}),
            );
        }
        return json(StatusCode::OK, &serde_json::json!({"status": "ok"}));
    }
    if !authorized(&core, &req) {
        core.state
            .metrics
            .refused
            .get_or_create(&super::state::KindLabel {
                kind: "unauthorized",
            })
            .inc();
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "missing or wrong API key (Authorization: Bearer ...)",
        );
    }
    match (&method, path.as_str()) {
        (&Method::POST, "/v1/completions") => {
            forward::completions(core, Endpoint::Completions, req, watch).await
        }
        (&Method::POST, "/v1/chat/completions") => {
            forward::completions(core, Endpoint::Chat, req, watch).await
        }
        (&Method::GET, "/v1/models") => models(&core),
        (&Method::POST, p) if agent_endpoint(p).is_some() => {
            let e = agent_endpoint(p).unwrap_or(Endpoint::Chat);
            forward::completions(core, e, req, watch).await
        }
        (_, p) if agent_endpoint(p).is_some() => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            &format!("{method} not allowed on {path}"),
        ),
        (_, "/v1/completions" | "/v1/chat/completions" | "/v1/models" | "/health") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            &format!("{method} not allowed on {path}"),
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            &format!("no route {path}"),
        ),
    }
}

/// The endpoints of `agents`: forwarded to the same path on the worker.
fn agent_endpoint(path: &str) -> Option<Endpoint> {
    Some(match path {
        "/v1/messages" => Endpoint::Messages,
        "/v1/responses" => Endpoint::Responses,
        "/v1/embeddings" => Endpoint::Embeddings,
        "/tokenize" => Endpoint::Tokenize,
        "/detokenize" => Endpoint::Detokenize,
        _ => return None,
    })
}

/// How long after its last response a proxy client's keep-alive connection is still
/// in use, so never displaced for a new connection (`service::net::slots`). A client under
/// load sends its next request within this; displacing it at once (as the JSON API
/// may) closed keep-alive connections with a request already on the wire, which the
/// client saw as a connection error instead of an answer.
pub const KEEPALIVE_IN_USE_MS: u64 = 2_000;

/// One client connection on the proxy port: hyper over `service::net::hyper_io` (the
/// listener's header, idle and write deadlines and its connection slot), like the
/// JSON API's, except that a keep-alive connection is not displaced while in use
/// ([`KEEPALIVE_IN_USE_MS`]), and that its requests watch for the client going away
/// (`watch`).
pub async fn serve(core: Front, stream: glommio::net::TcpStream, slot: Rc<Slot>) {
    let conn = core.handle.http_conn(slot);
    conn.set_min_idle_ms(KEEPALIVE_IN_USE_MS);
    // The watch borrows the descriptor; `svc`, which holds it, lives no longer than
    // the connection that owns the stream.
    let watch = ClientWatch::new(std::os::fd::AsRawFd::as_raw_fd(&stream));
    let io = hyper_io::HyperIo::new(stream, conn.clone());
    let svc = hyper::service::service_fn(move |req| {
        let (core, conn, watch) = (core.clone(), conn.clone(), watch.clone());
        async move {
            conn.request_started();
            let mut resp = handle_any(core.clone(), req, watch).await;
            // Draining: no further request on this connection (hyper closes it once
            // the response is written), so clients reconnect to another replica.
            if core.handle.draining() {
                resp.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, std::convert::Infallible>(resp.map(|b| hyper_io::TrackedBody::new(b, conn)))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .half_close(true)
        .max_buf_size(64 << 10)
        .serve_connection(io, svc)
        .await;
}
