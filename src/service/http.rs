//! HTTP/1.1 API (hyper on glommio): the JSON forms of every operation, admin, metrics.
//!
//! Routes (exactly these):
//! `POST /v1/workers`, `DELETE /v1/workers/{id}`, `GET /v1/workers`,
//! `POST /v1/workers/{id}/events`, `POST /v1/route`,
//! `POST /v1/requests/{id}/{first_token|progress|finish|prefill_failed}`,
//! `GET /metrics`, `GET /healthz`, and the status page: `GET /ui` (HTML) and
//! `GET /v1/status` (its JSON, `status`).
//! Every failure is a 4xx/5xx with a JSON body `{"error": "...", "code": "..."}`; bodies
//! are size-limited and parsed strictly (unknown fields rejected).

use super::core::Core;
use super::msg::LifeOp;
use super::router::{self, ApiError};
use super::{control, errors};
use crate::engine::{EventBatch, RouteRequest};
use crate::registry::Upsert;
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

async fn body_json<T: serde::de::DeserializeOwned>(
    core: &Core,
    req: Request<Incoming>,
) -> Result<T, Resp> {
    let limit = core.shared.settings.limits.max_body_bytes;
    let bytes = match Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            core.shared.metrics.protocol_error("http_body");
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!("request body rejected (limit {limit} bytes): {e}"),
            ));
        }
    };
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

/// Handles one HTTP request.
pub async fn handle(
    core: Rc<Core>,
    req: Request<Incoming>,
) -> Result<Resp, std::convert::Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    if core.shared.auth_enabled() && parts.as_slice() != ["healthz"] {
        let presented = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // A browser opening the status page cannot set a header: `/ui` also takes the
        // token as `?token=` (the page then sends it as a Bearer header itself).
        let ui = parts.as_slice() == ["ui"];
        let from_query = ui.then(|| ui_query_token(req.uri().query())).flatten();
        let ok = core.shared.authorized(presented)
            || from_query.is_some_and(|t| core.shared.authorized(&t));
        if !ok {
            core.shared.metrics.protocol_error("unauthorized");
            if ui && req.method() == Method::GET {
                return Ok(html(StatusCode::UNAUTHORIZED, super::status::LOGIN_HTML));
            }
            return Ok(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token",
            ));
        }
    }
    core.shared
        .inflight
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let resp = route_http(&core, req, &method, &path, &parts).await;
    core.shared
        .inflight
        .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    Ok(resp)
}

async fn route_http(
    core: &Rc<Core>,
    req: Request<Incoming>,
    method: &Method,
    path: &str,
    parts: &[&str],
) -> Resp {
    let core = core.clone();
    let method = method.clone();
    let resp = match (&method, parts) {
        (&Method::GET, ["healthz"]) => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        (&Method::GET, ["metrics"]) => {
            let text = super::scrape(&core);
            Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(text)))
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
        }
        (&Method::GET, ["ui"]) => html(StatusCode::OK, super::status::INDEX_HTML),
        (&Method::GET, ["v1", "status"]) => Response::builder()
            .header("content-type", "application/json")
            .header("cache-control", "no-store")
            .body(Full::new(
                super::status::status_body(core.shared.clone()).await,
            ))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        (&Method::GET, ["v1", "workers"]) => json(StatusCode::OK, &control::workers(&core)),
        (&Method::POST, ["v1", "workers"]) => match body_json::<WorkerSpec>(&core, req).await {
            Err(r) => r,
            Ok(spec) => {
                let id = spec.id.clone();
                match control::register(&core, spec, false).await {
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
                "progress" => match body_json::<Progress>(&core, req).await {
                    Ok(p) => Some(LifeOp::Progress(p.output_tokens)),
                    Err(r) => return r,
                },
                _ => None,
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
