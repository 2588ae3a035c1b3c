//! The service's side of the agent endpoints: where a `previous_response_id`
//! follow-up must go, and the proxy's own errors in Anthropic's shape.
//!
//! - [`pin`]: a Responses request continuing a response this proxy saw answered is
//!   routed to that worker only (its engine holds the history). Its worker no longer
//!   registered (or without a URL): the engine's own 404 for an unknown response,
//!   with `x-kvroute-stored-on` naming the worker that is gone, instead of sending
//!   the request to a worker that cannot hold it. An id the proxy never saw (another
//!   replica's, or forgotten after the TTL) is routed as usual: the worker answers.
//! - [`forwarded_headers`]: `anthropic-version` / `anthropic-beta` go to the worker
//!   with a Messages body.
//! - [`anthropic_errors`]: on `/v1/messages` every answer the proxy makes itself (401,
//!   400, 413, 429, 502, 503, ...) is rewritten from OpenAI's error shape into
//!   Anthropic's (`{"type": "error", "error": {"type", "message"}}`), which the
//!   Anthropic SDKs dispatch on; the worker's own answers pass unchanged.

use super::super::body::ProxyBody;
use super::super::front::Front;
use super::super::request::{Body, Endpoint, Member};
use super::super::respond::Resp;
use crate::api_shapes::errors;
use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde_json::Value;

/// The worker a Responses request must go to (`Ok(None)`: route as usual), or the
/// 404 to answer when that worker is gone.
pub fn pin(core: &Front, endpoint: Endpoint, body: &Body) -> Result<Option<String>, Box<Resp>> {
    if endpoint != Endpoint::Responses {
        return Ok(None);
    }
    let Some(id) = body.get_str(Member::PreviousResponseId) else {
        return Ok(None);
    };
    let id = id.as_str();
    let Some(w) = core.state.responses.worker(id, core.handle.now_ms()) else {
        return Ok(None);
    };
    let reg = core.handle.registry();
    if reg.by_id(&w).is_some_and(|e| e.spec.url.is_some()) {
        return Ok(Some(w));
    }
    let refused = super::super::state::KindLabel {
        kind: "stored_response_gone",
    };
    core.state.metrics.refused.get_or_create(&refused).inc();
    let mut r = Response::new(ProxyBody::full(Bytes::from(errors::response_not_found(id))));
    *r.status_mut() = StatusCode::NOT_FOUND;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&w) {
        h.insert("x-kvroute-stored-on", v);
    }
    Err(Box::new(r))
}

/// `resp` in Anthropic's error shape when the proxy made it (no worker answered it).
pub fn anthropic_errors(resp: Resp) -> Resp {
    if resp.status().is_success() || resp.headers().contains_key("x-kvroute-worker") {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let ProxyBody::Full(Some(b)) = body else {
        return Response::from_parts(parts, body);
    };
    let message = serde_json::from_slice::<Value>(&b)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&b).into_owned());
    let out = errors::anthropic_body(parts.status.as_u16(), &message);
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    Response::from_parts(parts, ProxyBody::full(Bytes::from(out)))
}

/// Request headers sent on to the worker with the body: Anthropic's version and beta
/// flags (the engine may read them; vLLM ignores them today).
pub fn forwarded_headers(
    endpoint: Endpoint,
    h: &hyper::HeaderMap,
) -> Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)> {
    if endpoint != Endpoint::Messages {
        return Vec::new();
    }
    ["anthropic-version", "anthropic-beta"]
        .iter()
        .filter_map(|k| {
            Some((
                hyper::header::HeaderName::from_static(k),
                h.get(*k)?.clone(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_headers_go_with_messages_only() {
        let mut h = hyper::HeaderMap::new();
        h.insert("anthropic-version", "2023-06-01".parse().unwrap());
        h.insert("x-other", "1".parse().unwrap());
        let f = forwarded_headers(Endpoint::Messages, &h);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0.as_str(), "anthropic-version");
        assert!(forwarded_headers(Endpoint::Chat, &h).is_empty());
    }
}
