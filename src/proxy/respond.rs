//! The proxy's own answers, in OpenAI's error shape: a refusal ([`error`]) and an
//! overload with `retry-after` ([`overloaded`]), on the proxy's response type
//! ([`Resp`]). Every phase of the pipeline answers through here (the front door, the
//! admission queue, routing, the agent APIs' fronts), so one client sees one shape.

use super::body::ProxyBody;
use super::errors;
use bytes::Bytes;
use hyper::{Response, StatusCode};

/// A response of the proxy (its body streams from upstream or is whole).
pub type Resp = Response<ProxyBody>;

/// An OpenAI-shaped error response.
pub fn error(status: StatusCode, kind: &str, code: &str, msg: &str) -> Resp {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(ProxyBody::full(errors::body(kind, code, msg)))
        .unwrap_or_else(|_| Response::new(ProxyBody::full(Bytes::new())))
}

/// A 429 in OpenAI's shape with `retry-after: secs`: the proxy is overloaded.
pub fn overloaded(code: &str, msg: &str, secs: u32) -> Resp {
    let mut r = error(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_exceeded",
        code,
        msg,
    );
    r.headers_mut().insert(
        hyper::header::RETRY_AFTER,
        hyper::header::HeaderValue::from(secs),
    );
    r
}
