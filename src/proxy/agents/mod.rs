//! The proxy's front for the endpoints besides completions and chat: Anthropic
//! Messages (`POST /v1/messages`), OpenAI Responses (`POST /v1/responses`), and the
//! engine endpoints passed through (`/v1/embeddings`, `/tokenize`, `/detokenize`).
//! They run the chat pipeline (`forward`): admission, body limit, `strip`, tokenize
//! (on the core or its blocking thread, with the template fuel), route, forward the
//! body to the same path on the worker, lifecycle from the answer. What differs is
//! here:
//!
//! - the prompt ([`prompt_tokens`]): a Messages or Responses body is converted to the
//!   chat request the engine renders for it (`api_shapes`) and tokenized as chat; a
//!   body that does not convert is a 400 (bounded before anything is built from it);
//!   a pass-through has no prompt and is routed by load within its model;
//! - the answer ([`AnswerTracker`]): either API's event stream or JSON answer read by
//!   `api_shapes::stream` (first token, progress with usage, finish; the Responses
//!   id), everything else by `track`; an SSE stream cut by the proxy ends with an
//!   error event in the API's shape;
//! - the stored responses ([`Responses`]): which worker answered each Responses id
//!   (bounded, with a TTL), so a `previous_response_id` follow-up is sent to it
//!   (`front`);
//! - in a disaggregated fleet they are routed decode-only ([`candidate`]);
//! - the headers an Anthropic client sends the engine (`anthropic-version`,
//!   `anthropic-beta`) go with the body (`front::forwarded_headers`).
//!
//! `front` (the service's side): the pin to the stored response's worker, and the
//! proxy's own errors in Anthropic's shape on `/v1/messages`.

#[cfg(all(target_os = "linux", feature = "service"))]
pub mod front;

use super::request::Endpoint;
use super::track::{Seen, Tracker};
use crate::api_shapes::response_map::ResponseMap;
use crate::api_shapes::stream::StreamTracker;
use crate::api_shapes::{self, Api};
use crate::tokenize::{self, Tokenizers};
use bytes::Bytes;
use serde_json::Value;
use std::sync::Mutex;

/// Most bytes of a whole JSON answer of Messages / Responses read for its usage and
/// id (a longer one still streams through; its lifecycle then ends without them).
pub const MAX_JSON_ANSWER: usize = 4 << 20;

/// Default `proxy.responses_max_entries`: stored responses remembered (the oldest is
/// forgotten first).
pub const RESPONSES_CAPACITY: usize = 65_536;

/// Default `proxy.responses_ttl_ms`: how long a stored response's worker is
/// remembered (1 h).
pub const RESPONSES_TTL_MS: u64 = 3_600_000;

/// The agent API of an endpoint, if it is one.
pub fn api_of(e: Endpoint) -> Option<Api> {
    match e {
        Endpoint::Messages => Some(Api::Messages),
        Endpoint::Responses => Some(Api::Responses),
        _ => None,
    }
}

/// Whether this module computes the endpoint's prompt (not completions or chat).
pub fn handles(e: Endpoint) -> bool {
    !matches!(e, Endpoint::Completions | Endpoint::Chat)
}

/// A pass-through endpoint: no prompt to route by, routed by load within the model.
pub fn passthrough(e: Endpoint) -> bool {
    handles(e) && api_of(e).is_none()
}

/// Whether a worker of `role` is a candidate for a request on `endpoint`: the
/// endpoints here are routed decode-only in a disaggregated fleet. The proxy's prefill
/// leg is the completions / chat NIXL flow (`pd`): it reads `kv_transfer_params` off
/// the prefill worker's answer, which a Messages or Responses answer does not carry,
/// and the pass-throughs generate nothing to hand over.
pub fn candidate(endpoint: Endpoint, role: crate::types::Role) -> bool {
    !handles(endpoint) || role != crate::types::Role::Prefill
}

/// The prompt token ids of a Messages / Responses body, rendered with the model's chat
/// template as the engine renders it (`Ok(None)`: no tokenizer for the model, or a
/// pass-through endpoint). `quick`: the render within `QUICK_FUEL` steps, `None` when
/// it needs more. Without tokenizers the body is still converted (a bad one is a 400),
/// its text bounded as `untokenized_max` tokens' worth. `Err`: why the prompt cannot
/// be tokenized as given (400 to the client).
pub fn prompt_tokens(
    tok: Option<&Tokenizers>,
    endpoint: Endpoint,
    body: &Value,
    quick: bool,
    untokenized_max: usize,
) -> Option<Result<Option<Vec<u32>>, String>> {
    let Some(api) = api_of(endpoint) else {
        return Some(Ok(None));
    };
    let bad = |e: api_shapes::BadRequest| e.0;
    let Some(t) = tok else {
        let max = untokenized_max.saturating_mul(tokenize::BYTES_PER_TOKEN_BOUND);
        return Some(
            api_shapes::from_value(api, body, max, false)
                .map(|_| None)
                .map_err(bad),
        );
    };
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let budget = t
        .max_prompt_tokens()
        .saturating_mul(tokenize::BYTES_PER_TOKEN_BOUND);
    let req = match api_shapes::from_value(api, body, budget, t.system_first(model)) {
        Ok(r) => r,
        Err(e) => return Some(Err(bad(e))),
    };
    let chat = tokenize::Endpoint::Chat;
    let r = if quick {
        t.prompt_tokens_quick(chat, &req.model, &req.chat)?
    } else {
        t.prompt_tokens(chat, &req.model, &req.chat)
    };
    Some(r.map_err(|e| e.0))
}

/// The lifecycle reader of one answer: `track` for completions, chat and the
/// pass-throughs, `api_shapes::stream` for Messages and Responses.
#[derive(Debug)]
pub enum AnswerTracker {
    Chat(Tracker),
    Agent(Box<StreamTracker>),
}

impl AnswerTracker {
    pub fn new(endpoint: Endpoint, sse: bool) -> AnswerTracker {
        match api_of(endpoint) {
            Some(api) => {
                AnswerTracker::Agent(Box::new(StreamTracker::new(api, sse, MAX_JSON_ANSWER)))
            }
            None => AnswerTracker::Chat(Tracker::new(sse)),
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) -> Seen {
        match self {
            AnswerTracker::Chat(t) => t.feed(chunk),
            AnswerTracker::Agent(t) => t.feed(chunk),
        }
    }

    pub fn finish(&mut self) -> Seen {
        match self {
            AnswerTracker::Chat(t) => t.finish(),
            AnswerTracker::Agent(t) => t.finish(),
        }
    }

    /// Output tokens so far.
    pub fn tokens(&self) -> u32 {
        match self {
            AnswerTracker::Chat(t) => t.tokens(),
            AnswerTracker::Agent(t) => t.tokens(),
        }
    }

    /// A Responses answer's id, once seen.
    pub fn response_id(&self) -> Option<&str> {
        match self {
            AnswerTracker::Agent(t) => t.response_id(),
            AnswerTracker::Chat(_) => None,
        }
    }

    /// The SSE event that ends a stream the proxy cut (`code`: why), in the API's
    /// shape: Anthropic's `event: error` for Messages, OpenAI's otherwise.
    pub fn error_event(&self, code: &str, message: &str) -> Bytes {
        match self {
            AnswerTracker::Agent(t) if t.api() == Api::Messages => {
                let msg = format!("{code}: {message}");
                Bytes::from(api_shapes::errors::anthropic_sse(502, &msg))
            }
            _ => super::errors::sse_event(code, message),
        }
    }
}

/// Which worker answered each stored Responses id, shared by the cores (a short lock:
/// one map operation).
#[derive(Debug)]
pub struct Responses(Mutex<ResponseMap<String>>);

impl Default for Responses {
    fn default() -> Responses {
        Responses(Mutex::new(ResponseMap::new(
            RESPONSES_CAPACITY,
            RESPONSES_TTL_MS,
        )))
    }
}

impl Responses {
    /// Sizes the map (`proxy.responses_max_entries`, `proxy.responses_ttl_ms`) at start.
    pub fn configure(&self, capacity: usize, ttl_ms: u64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *m = ResponseMap::new(capacity, ttl_ms);
    }

    /// `worker` answered response `id` at `now_ms`.
    pub fn remember(&self, id: &str, worker: &str, now_ms: u64) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(id, worker.to_string(), now_ms);
        }
    }

    /// The worker that answered `id`, if remembered within the TTL.
    pub fn worker(&self, id: &str, now_ms: u64) -> Option<String> {
        self.0.lock().ok()?.get(id, now_ms).cloned()
    }
}

#[cfg(test)]
mod tests;
