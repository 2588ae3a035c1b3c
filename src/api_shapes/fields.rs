//! What both agent APIs' requests share: the request routing needs
//! ([`AgentRequest`]), which API it is ([`Api`]), the refusal ([`BadRequest`]), the
//! bounds every body is checked against, and the field readers both converters use
//! (strict: a field of the wrong type is refused, never coerced).

use serde_json::Value;

/// Most messages, content blocks or tools one request may carry (each list, and all
/// of them together).
pub const MAX_ITEMS: usize = 65_536;

/// Deepest nesting walked (tool schemas, tool inputs).
pub const MAX_DEPTH: usize = 64;

/// Why a request was refused (400, in the API's own error shape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which API a body belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Anthropic Messages, `POST /v1/messages`.
    Messages,
    /// OpenAI Responses, `POST /v1/responses`.
    Responses,
}

impl Api {
    pub fn path(self) -> &'static str {
        match self {
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }
}

/// What routing needs from either API's request.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentRequest {
    pub api: Api,
    /// `model` (required by both APIs).
    pub model: String,
    pub stream: bool,
    /// `max_tokens` (Messages) / `max_output_tokens` (Responses): the OSL hint.
    pub max_tokens: Option<u32>,
    /// Responses: `previous_response_id` (the engine that stored it must serve it).
    pub previous_response_id: Option<String>,
    /// Responses: `store` (default true): the answer's id is worth remembering.
    pub store: bool,
    /// The chat completions body the engine renders for this request (`messages`,
    /// `tools`, `chat_template_kwargs`, `cache_salt`, `kv_transfer_params`, and the
    /// generation-prompt flags).
    pub chat: Value,
}

/// A string field: absent or null → None, a string → Some, anything else refused.
pub(super) fn opt_str<'a>(o: &'a Value, key: &str) -> Result<Option<&'a str>, BadRequest> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(BadRequest(format!("{key} must be a string"))),
    }
}

/// A boolean field, `default` when absent or null.
pub(super) fn opt_bool(o: &Value, key: &str, default: bool) -> Result<bool, BadRequest> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(BadRequest(format!("{key} must be a boolean"))),
    }
}

/// A positive integer field (capped at u32::MAX); None when absent or null.
pub(super) fn opt_positive(o: &Value, key: &str) -> Result<Option<u32>, BadRequest> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n.min(u64::from(u32::MAX)) as u32)),
            _ => Err(BadRequest(format!("{key} must be a positive integer"))),
        },
    }
}

/// The model name: a non-empty string of at most 256 bytes.
pub(super) fn model(o: &Value) -> Result<String, BadRequest> {
    match opt_str(o, "model")? {
        Some(m) if !m.is_empty() && m.len() <= 256 => Ok(m.to_string()),
        Some(m) if !m.is_empty() => Err(BadRequest("model longer than 256 bytes".into())),
        _ => Err(BadRequest("model is required".into())),
    }
}

/// Copies the fields the chat renderer and the router read from the original body.
pub(super) fn carry(
    from: &Value,
    to: &mut serde_json::Map<String, Value>,
) -> Result<(), BadRequest> {
    match from.get("chat_template_kwargs") {
        None | Some(Value::Null) => {}
        Some(v @ Value::Object(_)) => {
            to.insert("chat_template_kwargs".into(), v.clone());
        }
        Some(_) => return Err(BadRequest("chat_template_kwargs must be an object".into())),
    }
    if let Some(s) = opt_str(from, "cache_salt")? {
        to.insert("cache_salt".into(), Value::String(s.to_string()));
    }
    match from.get("kv_transfer_params") {
        None | Some(Value::Null) => {}
        Some(v @ Value::Object(_)) => {
            to.insert("kv_transfer_params".into(), v.clone());
        }
        Some(_) => return Err(BadRequest("kv_transfer_params must be an object".into())),
    }
    Ok(())
}
