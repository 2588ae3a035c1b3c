//! The client's request body, reduced to what routing needs, and the ids.
//!
//! The body is forwarded as the client sent it (its bytes, not a re-serialisation),
//! unless it carries members that `strip` removes; this module only reads `model`, `stream`,
//! `max_tokens` / `max_completion_tokens` / `max_output_tokens` (Responses)
//! (the OSL hint) out of it. It must be a JSON object; `model` and `stream` must have
//! their OpenAI types when present. Request ids: the client's `x-request-id` is
//! propagated to the worker as given (generated when absent); kvroute's own id for the
//! routing request adds this process's nonce (drawn at start), the core and a per-core
//! counter to it, so clients reusing an id never collide in the router, nor do two
//! replicas given the same id (they share the routed requests through the cluster).

use serde_json::Value;

/// Which endpoint a request came in on (forwarded to the same path on the worker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
    /// Anthropic Messages (`proxy::agents`).
    Messages,
    /// OpenAI Responses (`proxy::agents`).
    Responses,
    /// Passed through, routed by load within the model (`proxy::agents`).
    Embeddings,
    Tokenize,
    Detokenize,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Messages => "/v1/messages",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Tokenize => "/tokenize",
            Endpoint::Detokenize => "/detokenize",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClientRequest {
    pub body: Value,
    /// `model`, empty when absent.
    pub model: String,
    pub stream: bool,
    pub max_tokens: Option<u32>,
}

/// Why a body was refused (400).
#[derive(Debug, PartialEq, Eq)]
pub struct BadBody(pub String);

pub fn parse(bytes: &[u8]) -> Result<ClientRequest, BadBody> {
    let body: Value =
        serde_json::from_slice(bytes).map_err(|e| BadBody(format!("invalid JSON body: {e}")))?;
    let Some(obj) = body.as_object() else {
        return Err(BadBody("the body must be a JSON object".into()));
    };
    let model = match obj.get("model") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(BadBody("model must be a string".into())),
    };
    if model.len() > 256 {
        return Err(BadBody("model longer than 256 bytes".into()));
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(BadBody("stream must be a boolean".into())),
    };
    let max_tokens = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
        .iter()
        .filter_map(|k| obj.get(*k))
        .find_map(Value::as_u64)
        .map(|n| n.min(u64::from(u32::MAX)) as u32);
    Ok(ClientRequest {
        body,
        model,
        stream,
        max_tokens,
    })
}

/// The `x-request-id` to send upstream: the client's when it is printable ASCII of at
/// most 128 bytes, else a generated one.
pub fn client_request_id(given: Option<&[u8]>, generate: impl FnOnce() -> String) -> String {
    match given {
        Some(b)
            if !b.is_empty() && b.len() <= 128 && b.iter().all(|c| (0x21..0x7f).contains(c)) =>
        {
            String::from_utf8_lossy(b).into_owned()
        }
        _ => generate(),
    }
}

/// Hex digits of the per-process nonce in [`router_id`] (48 random bits).
pub const NONCE_HEX: usize = 12;

/// A fresh per-process nonce for [`router_id`].
pub fn new_nonce() -> String {
    format!("{:0w$x}", rand::random::<u64>() >> 16, w = NONCE_HEX)
}

/// kvroute's id for one routing attempt: the client id's id-safe prefix, this
/// process's `nonce` ([`new_nonce`]), the core and a per-core counter, and the attempt
/// (`crate::ids` rule; at most 128 bytes).
pub fn router_id(client_id: &str, nonce: &str, core: usize, counter: u64, attempt: u32) -> String {
    let safe: String = client_id
        .bytes()
        .filter(|&b| crate::ids::is_id_byte(b))
        .take(72)
        .map(char::from)
        .collect();
    let p = crate::ids::PROXY_ID_PREFIX;
    let mut id = if safe.is_empty() {
        format!("{p}{nonce}.{core}.{counter}")
    } else {
        format!("{p}{safe}.{nonce}.{core}.{counter}")
    };
    if attempt > 0 {
        id.push_str(&format!(".r{attempt}"));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_routing_fields_and_refuses_bad_types() {
        let r = parse(br#"{"model":"m","stream":true,"max_tokens":7,"x":1}"#).unwrap();
        assert_eq!(
            (r.model.as_str(), r.stream, r.max_tokens),
            ("m", true, Some(7))
        );
        let r = parse(br#"{"messages":[],"max_completion_tokens":3}"#).unwrap();
        assert_eq!(
            (r.model.as_str(), r.stream, r.max_tokens),
            ("", false, Some(3))
        );
        assert!(parse(b"{nope").is_err());
        assert!(parse(b"[1]").is_err());
        assert!(parse(br#"{"model":1}"#).is_err());
        assert!(parse(br#"{"stream":"yes"}"#).is_err());
    }

    #[test]
    fn ids_are_unique_per_attempt_and_process_and_id_safe() {
        let a = router_id("abc/def", "n1", 1, 7, 0);
        assert_eq!(a, "px=abcdef.n1.1.7");
        assert_eq!(router_id("", "n1", 0, 1, 2), "px=n1.0.1.r2");
        assert_ne!(a, router_id("abc/def", "n2", 1, 7, 0));
        assert!(crate::ids::is_proxy_id(&a));
        let nonce = new_nonce();
        assert_eq!(nonce.len(), NONCE_HEX);
        assert_ne!(nonce, new_nonce());
        let long = router_id(&"x".repeat(500), &nonce, 9999, u64::MAX, 16);
        assert!(crate::ids::check("id", &long).is_ok(), "{long}");
        assert_eq!(client_request_id(Some(b"r-1"), || "gen".into()), "r-1");
        assert_eq!(client_request_id(Some(b"a b"), || "gen".into()), "gen");
        assert_eq!(client_request_id(None, || "gen".into()), "gen");
    }
}
