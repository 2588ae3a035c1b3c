//! The request and response shapes of the APIs agents use besides chat completions:
//! Anthropic Messages (`POST /v1/messages`) and OpenAI Responses (`POST /v1/responses`),
//! pure (no I/O, no clocks), shared by the proxy and the simulated workers.
//!
//! - `anthropic`, `responses`: a request body → the chat completions request the engine
//!   renders for it (vLLM's `AnthropicServingMessages.to_chat_completion_request` and
//!   `construct_input_messages`), so a prompt is tokenized with the model's chat
//!   template exactly as for `/v1/chat/completions` ([`prompt_tokens`]);
//! - `stream`: the lifecycle (first output, output tokens, end, errors) read off either
//!   API's event stream or whole JSON answer;
//! - `errors`: Anthropic's error shape, and the engine's "response not found";
//! - `response_map`: which worker holds a stored response (bounded, with a TTL).
//!
//! Guarantees: a body is walked once for its size (every string's bytes against the
//! prompt's text budget, every list's length against [`MAX_ITEMS`]) before anything
//! is built from it, and parsing never panics on any JSON value.

pub mod anthropic;
pub mod errors;
pub mod response_map;
pub mod responses;
pub mod stream;

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

/// Parses a request body of `api` into its chat form. `max_text_bytes` bounds the
/// bytes of all its strings (the tokenizer's `max_prompt_tokens` × 16, as chat
/// rendering bounds them); `merge_inline_system`: Messages only, the model's template
/// needs system messages first ([`crate::tokenize::Tokenizers::system_first`]).
pub fn parse(
    api: Api,
    bytes: &[u8],
    max_text_bytes: usize,
    merge_inline_system: bool,
) -> Result<AgentRequest, BadRequest> {
    let body: Value =
        serde_json::from_slice(bytes).map_err(|e| BadRequest(format!("invalid JSON body: {e}")))?;
    from_value(api, &body, max_text_bytes, merge_inline_system)
}

/// [`parse`] of a body already read as JSON.
pub fn from_value(
    api: Api,
    body: &Value,
    max_text_bytes: usize,
    merge_inline_system: bool,
) -> Result<AgentRequest, BadRequest> {
    if !body.is_object() {
        return Err(BadRequest("the body must be a JSON object".into()));
    }
    check_size(body, max_text_bytes)?;
    match api {
        Api::Messages => anthropic::to_chat(body, merge_inline_system),
        Api::Responses => responses::to_chat(body),
    }
}

/// Prompt token ids of either API's request, rendered with `model`'s chat template as
/// the engine renders it. Ok(None): no tokenizer for the model (routed by load).
pub fn prompt_tokens(
    tok: &crate::tokenize::Tokenizers,
    api: Api,
    body: &Value,
) -> Result<(AgentRequest, Option<Vec<u32>>), BadRequest> {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let max = tok.max_prompt_tokens();
    let budget = max.saturating_mul(crate::tokenize::BYTES_PER_TOKEN_BOUND);
    let req = from_value(api, body, budget, tok.system_first(model))?;
    let ids = tok
        .prompt_tokens(crate::tokenize::Endpoint::Chat, &req.model, &req.chat)
        .map_err(|e| BadRequest(e.0))?;
    Ok((req, ids))
}

/// Refuses a body whose strings exceed `max_text_bytes`, whose lists exceed
/// [`MAX_ITEMS`], or that nests deeper than [`MAX_DEPTH`], before it is converted.
fn check_size(body: &Value, max_text_bytes: usize) -> Result<(), BadRequest> {
    let mut budget = Budget {
        bytes: max_text_bytes,
        items: MAX_ITEMS,
    };
    budget.spend(body, 0)
}

struct Budget {
    bytes: usize,
    items: usize,
}

impl Budget {
    fn spend(&mut self, v: &Value, depth: usize) -> Result<(), BadRequest> {
        if depth > MAX_DEPTH {
            return Err(BadRequest(format!(
                "the body nests deeper than {MAX_DEPTH} levels"
            )));
        }
        match v {
            Value::String(s) => self.text(s.len()),
            Value::Array(a) => {
                self.count(a.len())?;
                a.iter().try_for_each(|x| self.spend(x, depth + 1))
            }
            Value::Object(o) => o.iter().try_for_each(|(k, x)| {
                self.text(k.len())?;
                self.spend(x, depth + 1)
            }),
            _ => Ok(()),
        }
    }

    fn text(&mut self, n: usize) -> Result<(), BadRequest> {
        self.bytes = self.bytes.checked_sub(n).ok_or_else(|| {
            BadRequest("prompt too long: the request's text exceeds the prompt limit".into())
        })?;
        Ok(())
    }

    fn count(&mut self, n: usize) -> Result<(), BadRequest> {
        self.items = self
            .items
            .checked_sub(n)
            .ok_or_else(|| BadRequest(format!("more than {MAX_ITEMS} list items")))?;
        Ok(())
    }
}

/// A string field: absent or null → None, a string → Some, anything else refused.
fn opt_str<'a>(o: &'a Value, key: &str) -> Result<Option<&'a str>, BadRequest> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(BadRequest(format!("{key} must be a string"))),
    }
}

/// A boolean field, `default` when absent or null.
fn opt_bool(o: &Value, key: &str, default: bool) -> Result<bool, BadRequest> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(BadRequest(format!("{key} must be a boolean"))),
    }
}

/// A positive integer field (capped at u32::MAX); None when absent or null.
fn opt_positive(o: &Value, key: &str) -> Result<Option<u32>, BadRequest> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n.min(u64::from(u32::MAX)) as u32)),
            _ => Err(BadRequest(format!("{key} must be a positive integer"))),
        },
    }
}

/// The model name: a non-empty string of at most 256 bytes.
fn model(o: &Value) -> Result<String, BadRequest> {
    match opt_str(o, "model")? {
        Some(m) if !m.is_empty() && m.len() <= 256 => Ok(m.to_string()),
        Some(m) if !m.is_empty() => Err(BadRequest("model longer than 256 bytes".into())),
        _ => Err(BadRequest("model is required".into())),
    }
}

/// Copies the fields the chat renderer and the router read from the original body.
fn carry(from: &Value, to: &mut serde_json::Map<String, Value>) -> Result<(), BadRequest> {
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

#[cfg(test)]
mod tests;
