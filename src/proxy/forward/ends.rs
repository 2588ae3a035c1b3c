//! How a proxied request ends toward its client: the worker's answer, streamed back
//! with kvroute's headers (`respond`), or an OpenAI-shaped error when it ends without
//! one: every retry failed or every worker was busy (`gave_up`), no worker to try
//! (`no_worker`), routing refused (`route_failed`), or the client left while the
//! request waited (`client_left`, which also finishes the routed attempt).

use super::super::agents::AnswerTracker;
use super::super::body::{self, ProxyBody, Streamed};
use super::super::retry::Failure;
use super::super::state::{Admitted, RequestLabels};
use super::super::watch::Gone;
use super::{error, overloaded, refused, worker_model, Answer, Job, Resp};
use crate::engine::request::LifeOp;
use crate::service::routing::errors::{classify, ApiError};
use hyper::{Response, StatusCode};
use std::time::{Duration, Instant};

impl Job {
    /// The client went away while the request waited on `worker`: the wait was
    /// dropped (closing the connection to the worker, so the engine aborts), and the
    /// routed attempt `rid`, if one is open, finishes (its load released).
    pub(super) fn client_left(&self, rid: Option<&str>, worker: &str) -> Resp {
        if let Some(rid) = rid {
            body::life(&self.core, LifeOp::Finish, rid);
        }
        let m = &self.core.state.metrics;
        m.e2e.observe(self.started.elapsed().as_secs_f64());
        let labels = RequestLabels {
            model: worker_model(&self.core, worker),
            worker: worker.to_string(),
            outcome: "client_disconnect",
        };
        m.requests.get_or_create(&labels).inc();
        // Nobody reads it: the client's connection is closed.
        error(
            StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            "invalid_request_error",
            "client_closed_request",
            "the client closed the connection",
        )
    }

    pub(super) fn respond(
        &self,
        a: Answer,
        rid: &str,
        worker: &str,
        retries: u32,
        fallback: bool,
        (admitted, gone): (Admitted, Gone),
    ) -> Resp {
        let sh = &self.core;
        let ps = &sh.handle.settings().proxy;
        let (parts, upstream) = a.resp.into_parts();
        let sse = parts
            .headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let model = worker_model(&self.core, worker);
        let streamed = Streamed {
            core: self.core.clone(),
            upstream,
            conn: Some(a.conn),
            id: rid.to_string(),
            tracker: AnswerTracker::new(self.endpoint, sse),
            sse,
            started: self.started,
            last_output: None,
            idle: Duration::from_millis(ps.request_timeout_ms),
            last_frame: Instant::now(),
            timer: None,
            labels: RequestLabels {
                model,
                worker: worker.to_string(),
                outcome: "ok",
            },
            tail: None,
            done: false,
            pool_max_idle: ps.pool_max_idle,
            admitted: Some(admitted),
            gone: Some(gone),
            trace: {
                let mut t = std::mem::take(&mut *self.trace.borrow_mut());
                t.answered(parts.status.as_u16());
                t
            },
        };
        let mut resp = Response::new(ProxyBody::Stream(Box::new(streamed)));
        *resp.status_mut() = parts.status;
        let h = resp.headers_mut();
        for (k, v) in parts.headers.iter() {
            if is_hop_by_hop(k.as_str()) {
                continue;
            }
            h.append(k.clone(), v.clone());
        }
        let mut set = |k: &'static str, v: &str| {
            if let Ok(v) = hyper::header::HeaderValue::from_str(v) {
                h.insert(k, v);
            }
        };
        set("x-request-id", &self.client_id);
        set("x-kvroute-worker", worker);
        set("x-kvroute-request-id", rid);
        if retries > 0 {
            set("x-kvroute-retries", &retries.to_string());
        }
        if fallback {
            set("x-kvroute-prefill-fallback", "1");
        }
        resp
    }

    pub(super) fn count_failed(&self) {
        let labels = RequestLabels {
            model: String::new(),
            worker: String::new(),
            outcome: "failed",
        };
        self.core
            .state
            .metrics
            .requests
            .get_or_create(&labels)
            .inc();
    }

    pub(super) fn gave_up(&self, last: Option<&(String, Failure)>) -> Resp {
        if let Some((w, Failure::Busy(secs))) = last {
            refused(&self.core, "workers_busy");
            return overloaded(
                "workers_busy",
                &format!("every worker tried is at its limit (last: {w}); retry later"),
                *secs,
            );
        }
        self.count_failed();
        let msg = match last {
            Some((w, f)) => format!(
                "upstream failed ({}) on worker {w}; no retry left",
                f.label()
            ),
            None => "upstream failed".into(),
        };
        error(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_failed",
            &msg,
        )
    }

    pub(super) fn no_worker(&self, last: Option<&(String, Failure)>) -> Resp {
        if last.is_some() {
            return self.gave_up(last);
        }
        refused(&self.core, "no_worker");
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "no_upstream_worker",
            "no worker with an upstream url is available (registered with `url`, circuit breaker closed)",
        )
    }

    pub(super) fn route_failed(&self, e: &ApiError, last: Option<&(String, Failure)>) -> Resp {
        if last.is_some() {
            return self.gave_up(last);
        }
        let (status, code) = classify(e);
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        refused(&self.core, "no_worker");
        let kind = if status == StatusCode::TOO_MANY_REQUESTS {
            "rate_limit_exceeded"
        } else if status.is_client_error() {
            "invalid_request_error"
        } else {
            "service_unavailable"
        };
        if status == StatusCode::TOO_MANY_REQUESTS {
            return overloaded(code, &e.to_string(), 1);
        }
        error(status, kind, code, &e.to_string())
    }
}

fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-connection"
    )
}
