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
//! - `fields`: the request routing needs, the refusal, the bounds and the field
//!   readers both converters share;
//! - `errors`: Anthropic's error shape, and the engine's "response not found";
//! - `response_map`: which worker holds a stored response (bounded, with a TTL).
//!
//! Guarantees: a body is walked once for its size (every string's bytes against the
//! prompt's text budget, every list's length against [`MAX_ITEMS`]) before anything
//! is built from it, and parsing never panics on any JSON value.

pub mod anthropic;
pub mod errors;
pub mod fields;
pub mod response_map;
pub mod responses;
pub mod stream;

pub use fields::{AgentRequest, Api, BadRequest, MAX_DEPTH, MAX_ITEMS};
use serde_json::Value;

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

#[cfg(test)]
mod tests;
