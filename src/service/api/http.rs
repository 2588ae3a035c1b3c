//! HTTP/1.1 API (hyper on glommio): the JSON forms of every operation, admin, metrics.
//!
//! Routes (exactly these):
//! `POST /v1/workers`, `DELETE /v1/workers/{id}`, `GET /v1/workers`,
//! `POST /v1/workers/{id}/events`, `POST /v1/route`,
//! `POST /v1/requests/{id}/{first_token|progress|finish|prefill_failed}`,
//! `GET /metrics`, `GET /healthz`, and the status page: `GET /ui` (HTML) and
//! `GET /v1/status` (its JSON, `status`).
//! Every failure is a 4xx/5xx with a JSON body `{"error": "...", "code": "..."}`; bodies
//! are size-limited and parsed strictly (unknown fields rejected). Before anything
//! else a request passes the door rules of [`doors`] (`Host`, `Origin`, JSON content
//! type; CORS for listed origins); then which token may call which route is decided by
//! `check_auth` with the rules of `credentials`.

use crate::engine::{EventBatch, RouteRequest};
use crate::registry::{Origin, Upsert};
use crate::service::net::doors::{self, Door, Pass};
use crate::service::routing::control;
use crate::service::routing::errors;
use crate::service::routing::router::{self, ApiError};
use crate::service::runtime::core::Core;
use crate::service::runtime::msg::LifeOp;
use crate::types::WorkerSpec;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use std::rc::Rc;

type Resp = Response<Full<Bytes>>;

fn json<T: Serialize>(status: StatusCode, v: &T) -> Resp {
    let body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn error(status: StatusCode, code: &str, msg: impl std::fmt::Display) -> Resp {
    json(
        status,
        &serde_json::json!({ "error": msg.to_string(), "code": code }),
    )
}

fn api_error(e: &ApiError) -> Resp {
    let (status, code) = errors::classify(e);
    error(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        code,
        e,
    )
}

/// Reads the whole body (size-limited), so a keep-alive connection can carry the next
/// request: hyper closes a connection whose request body was left unread when the
/// response is written, and a client sending its next request on it gets an EOF.
async fn body_bytes(core: &Core, req: Request<Incoming>) -> Result<Bytes, Resp> {
    let limit = core.shared.settings.limits.max_body_bytes;
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            core.shared.metrics.protocol_error("http_body");
            Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body rejected (limit {limit} bytes): {e}"),
            ))
        }
        // Cut while it arrived (too slow, stalled, displaced; counted where it was
        // cut) or broken: the connection is closing, this answer is a courtesy.
        Err(e) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            "body_incomplete",
            format!("request body not received in full: {e}"),
        )),
    }
}

async fn body_json<T: serde::de::DeserializeOwned>(
    core: &Core,
    req: Request<Incoming>,
) -> Result<T, Resp> {
    let bytes = body_bytes(core, req).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        core.shared.metrics.protocol_error("http_json");
        error(
            StatusCode::BAD_REQUEST,
            "bad_json",
            format!("invalid JSON body: {e}"),
        )
    })
}

/// An HTML page (the status page, or its token form). The content security policy
/// lets it load nothing from anywhere but its own inline code and this origin's API.
fn html(status: StatusCode, page: &'static str) -> Resp {
    Response::builder()
        .status(status)
        .header("content-type", "text/html; charset=utf-8")
        .header(
            "content-security-policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             connect-src 'self'; form-action 'self'; img-src data:; frame-ancestors 'none'",
        )
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .body(Full::new(Bytes::from_static(page.as_bytes())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// `token` of a `/ui` query string, form-decoded.
fn ui_query_token(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Progress {
    output_tokens: u32,
}

/// Handles one HTTP request: the door rules ([`doors`]), then [`answer`].
pub async fn handle(
    core: Rc<Core>,
    req: Request<Incoming>,
) -> Result<Resp, std::convert::Infallible> {
    let pass = doors::check(
        &core.shared.settings,
        Door::Api,
        req.method(),
        req.headers(),
    );
    Ok(match pass {
        Err(r) => {
            core.shared.metrics.protocol_error(r.code());
            error(r.status(), r.code(), r.message())
        }
        Ok(Pass::Preflight(origin)) => {
            let mut resp = Response::new(Full::new(Bytes::new()));
            *resp.status_mut() = StatusCode::NO_CONTENT;
            doors::fill_preflight(resp.headers_mut(), origin, req.headers());
            resp
        }
        Ok(Pass::Cors(origin)) => {
            let mut resp = answer(core, req).await;
            doors::allow_origin(resp.headers_mut(), origin);
            resp
        }
        Ok(Pass::Plain) => answer(core, req).await,
    })
}

/// Answers a request that passed the doors: authentication, then the route.
async fn answer(core: Rc<Core>, req: Request<Incoming>) -> Resp {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let mut presented = crate::credentials::bearer(req.headers())
        .unwrap_or("")
        .to_string();
    // A browser opening the status page cannot set a header: `/ui` also takes the
    // token as `?token=` (the page then sends it as a Bearer header itself).
    let ui = parts.as_slice() == ["ui"];
    if ui && !core.shared.creds.is_admin(&presented) {
        if let Some(t) = ui_query_token(req.uri().query()) {
            presented = t;
        }
    }
    if let Some(refused) = check_auth(&core, &method, &parts, &presented) {
        if ui && method == Method::GET {
            return html(
                StatusCode::UNAUTHORIZED,
                crate::service::api::status::LOGIN_HTML,
            );
        }
        return refused;
    }
    core.shared
        .inflight
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let resp = route_http(&core, req, &method, &path, &parts, &presented).await;
    core.shared
        .inflight
        .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    resp
}

/// Who may call what (`credentials`): `/healthz` anyone; a worker's own routes
/// (`POST /v1/workers/{id}/events`, `DELETE /v1/workers/{id}`) its own token if it has
/// one, else the shared token; `POST /v1/workers` any valid token here, the worker's
/// own (or the shared one) checked once the body names it; everything else the shared
/// token. `None`: allowed.
fn check_auth(core: &Core, method: &Method, parts: &[&str], presented: &str) -> Option<Resp> {
    let creds = &core.shared.creds;
    if !creds.enabled() {
        return None;
    }
    let ok = match (method, parts) {
        (_, ["healthz"]) => true,
        (_, ["readyz"]) => true,
        (&Method::POST, ["v1", "workers", id, "events"])
        | (&Method::DELETE, ["v1", "workers", id]) => creds.may_act_on(presented, id),
        (&Method::POST, ["v1", "workers"]) => creds.principal(presented).is_some(),
        _ => creds.is_admin(presented),
    };
    (!ok).then(|| unauthorized(core, "missing or wrong bearer token"))
}

fn unauthorized(core: &Core, msg: &str) -> Resp {
    core.shared.metrics.protocol_error("unauthorized");
    error(StatusCode::UNAUTHORIZED, "unauthorized", msg)
}

async fn route_http(
    core: &Rc<Core>,
    req: Request<Incoming>,
    method: &Method,
    path: &str,
    parts: &[&str],
    presented: &str,
) -> Resp {
    let core = core.clone();
    let method = method.clone();
    let resp = match (&method, parts) {
        (&Method::GET, ["healthz"]) => json(
            StatusCode::OK,
            &crate::service::state::persist::healthz(&core.shared),
        ),
        (&Method::GET, ["readyz"]) => {
            let (ready, body) = crate::service::cluster::bridge::readyz(&core.shared);
            let code = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json(code, &body)
        }
        (&Method::GET, ["metrics"]) => {
            control::applied_everywhere(&core).await;
            let text = crate::service::api::scrape::scrape(&core);
            Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(text)))
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
        }
        (&Method::GET, ["ui"]) => html(StatusCode::OK, crate::service::api::status::INDEX_HTML),
        (&Method::GET, ["v1", "status"]) => Response::builder()
            .header("content-type", "application/json")
            .header("cache-control", "no-store")
            .body(Full::new(
                crate::service::api::status::status_body(core.shared.clone()).await,
            ))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        (&Method::GET, ["v1", "workers"]) => {
            // Every update queued before this read is in its figures (the cores'
            // active-block updates to each other travel without a doorbell).
            control::applied_everywhere(&core).await;
            json(StatusCode::OK, &control::workers(&core))
        }
        (&Method::POST, ["v1", "workers"]) => match body_json::<WorkerSpec>(&core, req).await {
            Err(r) => r,
            Ok(spec) if !core.shared.creds.may_act_on(presented, &spec.id) => unauthorized(
                &core,
                &format!("this token may not register worker {:?}", spec.id),
            ),
            Ok(spec) => {
                let id = spec.id.clone();
                match control::register(&core, spec, Origin::Admin).await {
                    Ok((up, _)) => {
                        let (status, what) = match up {
                            Upsert::New(_) => (StatusCode::CREATED, "created"),
                            Upsert::SameEpoch(_) => (StatusCode::OK, "updated"),
                            Upsert::NewEpoch(_) => (StatusCode::OK, "new_epoch"),
                        };
                        json(status, &serde_json::json!({"id": id, "status": what}))
                    }
                    Err(e) => api_error(&e),
                }
            }
        },
        (&Method::DELETE, ["v1", "workers", id]) => match control::deregister(&core, id).await {
            Ok(()) => json(
                StatusCode::OK,
                &serde_json::json!({"id": id, "status": "removed"}),
            ),
            Err(e) => api_error(&e),
        },
        (&Method::POST, ["v1", "workers", id, "events"]) => {
            let id = id.to_string();
            match body_json::<EventBatch>(&core, req).await {
                Err(r) => r,
                Ok(batch) => match control::json_events(&core, &id, batch.events).await {
                    Ok(n) => json(StatusCode::OK, &serde_json::json!({"applied": n})),
                    Err(e) => api_error(&e),
                },
            }
        }
        (&Method::POST, ["v1", "route"]) => match body_json::<RouteRequest>(&core, req).await {
            Err(r) => r,
            Ok(r) => match router::route(&core, &r).await {
                Ok(d) => json(StatusCode::OK, &d),
                Err(e) => api_error(&e),
            },
        },
        (&Method::POST, ["v1", "requests", id, op]) => {
            let id = id.to_string();
            let op = match *op {
                "first_token" => Some(LifeOp::FirstToken),
                "finish" => Some(LifeOp::Finish),
                "prefill_failed" => Some(LifeOp::PrefillFailed),
                "progress" => Some(LifeOp::Progress(0)),
                _ => None,
            };
            let op = match op {
                Some(LifeOp::Progress(_)) => match body_json::<Progress>(&core, req).await {
                    Ok(p) => Some(LifeOp::Progress(p.output_tokens)),
                    Err(r) => return r,
                },
                // The other calls take no body; whatever was sent is read and ignored.
                Some(other) => match body_bytes(&core, req).await {
                    Ok(_) => Some(other),
                    Err(r) => return r,
                },
                None => None,
            };
            match op {
                None => error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("no route {path}"),
                ),
                Some(op) => match router::lifecycle(&core, op, &id).await {
                    Ok(Some(d)) => json(StatusCode::OK, &d),
                    Ok(None) => json(
                        StatusCode::OK,
                        &serde_json::json!({"request_id": id, "status": "ok"}),
                    ),
                    Err(e) => api_error(&e),
                },
            }
        }
        (
            _,
            ["healthz"]
            | ["metrics"]
            | ["ui"]
            | ["v1", "status"]
            | ["v1", "workers", ..]
            | ["v1", "route"]
            | ["v1", "requests", ..],
        ) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} not allowed on {path}"),
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route {path}"),
        ),
    };
    resp
}
