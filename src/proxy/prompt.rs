//! Token ids of a request's prompt: the one call site of tokenization.
//!
//! With the service's tokenizers (`crate::tokenize`: per-model `tokenizer.json` and
//! chat templates, `--tokenizer MODEL=DIR`) the prompt is rendered and tokenized as the
//! engine does it. Without them (a build or caller with none) this handles completions
//! whose `prompt` is already token ids — a list of integers, or a list of such lists (a
//! batch, routed by its first prompt). `Ok(None)` in either case means no tokenizer for
//! the model: the request is routed by load only (counted in
//! `kvroute_proxy_untokenized_total`), never refused.

use super::request::Endpoint;
use serde_json::Value;

/// A prompt that cannot be tokenized as given (400 to the client).
#[derive(Debug, PartialEq, Eq)]
pub struct PromptError(pub String);

impl std::fmt::Display for PromptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Most token ids read from one prompt (the router's hash limit caps them later).
pub const MAX_PROMPT_TOKENS: usize = 1 << 21;

/// Through the model's tokenizer when `tok` has one (else as [`token_ids`]).
pub fn prompt_tokens(
    tok: Option<&crate::tokenize::Tokenizers>,
    endpoint: Endpoint,
    model: &str,
    body: &Value,
) -> Result<Option<Vec<u32>>, PromptError> {
    if super::agents::handles(endpoint) {
        return super::agents::prompt_tokens(tok, endpoint, body, false, MAX_PROMPT_TOKENS)
            .unwrap_or(Ok(None))
            .map_err(PromptError);
    }
    match tok {
        Some(t) => t
            .prompt_tokens(tok_endpoint(endpoint), model, body)
            .map_err(|e| PromptError(e.0)),
        None => token_ids(endpoint, model, body),
    }
}

/// The request's `cache_salt` (vLLM and SGLang's tenant isolation field), routed in
/// that salt's hash space (`engines::chain_start`); the body is forwarded unchanged, so
/// the engine sees the same salt. Anything but a non-empty string of at most 64 KiB is
/// no salt here (the engine answers for a malformed one).
pub fn cache_salt(body: &Value) -> Option<String> {
    match body.get("cache_salt") {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= u16::MAX as usize => Some(s.clone()),
        _ => None,
    }
}

/// [`prompt_tokens`] with a quick chat render (`Tokenizers::prompt_tokens_quick`):
/// `None` when the render needs more steps than a core should spend (finish it with
/// [`prompt_tokens`] off the core).
pub fn prompt_tokens_quick(
    tok: Option<&crate::tokenize::Tokenizers>,
    endpoint: Endpoint,
    model: &str,
    body: &Value,
) -> Option<Result<Option<Vec<u32>>, PromptError>> {
    if super::agents::handles(endpoint) {
        return super::agents::prompt_tokens(tok, endpoint, body, true, MAX_PROMPT_TOKENS)
            .map(|r| r.map_err(PromptError));
    }
    match tok {
        Some(t) => t
            .prompt_tokens_quick(tok_endpoint(endpoint), model, body)
            .map(|r| r.map_err(|e| PromptError(e.0))),
        None => Some(token_ids(endpoint, model, body)),
    }
}

/// The tokenizer's endpoint for completions or chat (the agent APIs render as chat).
fn tok_endpoint(e: Endpoint) -> crate::tokenize::Endpoint {
    match e {
        Endpoint::Completions => crate::tokenize::Endpoint::Completions,
        _ => crate::tokenize::Endpoint::Chat,
    }
}

/// Token-id prompts of completions only (no tokenizer needed).
pub fn token_ids(
    endpoint: Endpoint,
    _model: &str,
    body: &Value,
) -> Result<Option<Vec<u32>>, PromptError> {
    if endpoint != Endpoint::Completions {
        return Ok(None);
    }
    let Some(Value::Array(items)) = body.get("prompt") else {
        return Ok(None);
    };
    let first = match items.first() {
        None => return Err(PromptError("prompt is empty".into())),
        Some(Value::Array(inner)) => inner,
        Some(Value::Number(_)) => items,
        // A list of strings needs a tokenizer.
        Some(_) => return Ok(None),
    };
    if first.len() > MAX_PROMPT_TOKENS {
        return Err(PromptError(format!(
            "prompt longer than {MAX_PROMPT_TOKENS} tokens"
        )));
    }
    first
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| PromptError(format!("prompt token {v} is not a token id")))
        })
        .collect::<Result<Vec<u32>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn token_prompts_are_read_and_text_needs_a_tokenizer() {
        let c = Endpoint::Completions;
        let prompt_tokens = token_ids;
        assert_eq!(
            prompt_tokens(c, "m", &json!({"prompt": [1, 2, 3]})).unwrap(),
            Some(vec![1, 2, 3])
        );
        assert_eq!(
            prompt_tokens(c, "m", &json!({"prompt": [[4, 5], [6]]})).unwrap(),
            Some(vec![4, 5])
        );
        assert_eq!(
            prompt_tokens(c, "m", &json!({"prompt": "hi"})).unwrap(),
            None
        );
        assert_eq!(
            prompt_tokens(c, "m", &json!({"prompt": ["hi"]})).unwrap(),
            None
        );
        assert_eq!(
            prompt_tokens(Endpoint::Chat, "m", &json!({"messages": []})).unwrap(),
            None
        );
        assert!(prompt_tokens(c, "m", &json!({"prompt": [1, -2]})).is_err());
        assert!(prompt_tokens(c, "m", &json!({"prompt": []})).is_err());
        assert!(prompt_tokens(c, "m", &json!({"prompt": [1.5]})).is_err());
    }

    #[test]
    fn cache_salt_is_a_non_empty_string_or_nothing() {
        assert_eq!(
            cache_salt(&json!({"cache_salt": "t1"})).as_deref(),
            Some("t1")
        );
        assert_eq!(cache_salt(&json!({"cache_salt": ""})), None);
        assert_eq!(cache_salt(&json!({"cache_salt": 7})), None);
        assert_eq!(cache_salt(&json!({"prompt": [1]})), None);
    }
}
