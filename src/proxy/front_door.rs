//! The front door of a proxied request under serving policies: its hints (priority,
//! deadline) and tenant read from the request, and the tenant's rate limits charged,
//! before it is routed or queued. A malformed hint is a 400; a tenant over its limit
//! gets a 429 naming the limit (`x-kvroute-limit`) with `retry-after`. Without
//! policies configured it admits everything and reads nothing.

use super::policies::{Front, Refusal};
use super::respond::{error, overloaded, Resp};
use super::state::ProxyShared;
use crate::admission::tenant::Limit;

/// The front door of one proxied request: its hints and tenant (`None`: no policies
/// configured on this service), or the answer refusing it (400 for a malformed hint,
/// 429 naming the tenant's limit, with `retry-after` and `x-kvroute-limit`).
pub fn front_door(
    sh: &ProxyShared,
    headers: &hyper::HeaderMap,
    body: &serde_json::Value,
    prompt_tokens: u64,
) -> Result<Option<Front>, Box<Resp>> {
    let Some(p) = sh.policies.get() else {
        return Ok(None);
    };
    match p.front(headers, body, prompt_tokens) {
        Ok(f) => Ok(Some(f)),
        Err(Refusal::BadHint(m)) => Err(Box::new(error(
            hyper::StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_hint",
            &m,
        ))),
        Err(Refusal::OverLimit(limit, tenant, secs)) => {
            let code = match limit {
                Limit::Requests => "tenant_requests_per_s",
                Limit::PromptTokens => "tenant_prompt_tokens_per_s",
            };
            let mut r = overloaded(
                code,
                &format!(
                    "tenant {tenant} is over its {} limit; retry in {secs} s",
                    limit.name()
                ),
                secs,
            );
            r.headers_mut().insert(
                "x-kvroute-limit",
                hyper::header::HeaderValue::from_static(limit.name()),
            );
            Err(Box::new(r))
        }
    }
}
