//! Token ids of a request's prompt: the one call site of tokenization.
//!
//! With the service's tokenizers (`crate::tokenize`: per-model `tokenizer.json` and
//! chat templates, `--tokenizer MODEL=DIR`) the prompt is rendered and tokenized as the
//! engine does it. Without them (a build or caller with none) this handles completions
//! whose `prompt` is already token ids — a list of integers, or a list of such lists (a
//! batch, routed by its first prompt). `Ok(None)` in either case means no tokenizer for
//! the model: the request is routed by load only (counted in
//! `kvroute_proxy_untokenized_total`), never refused.

use super::request::{Body, Endpoint, Member};
use crate::tokenize::given::{self, Given};

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

/// The members a chat template reads (`tokenize::chat`).
pub(crate) const CHAT: [Member; 7] = [
    Member::Messages,
    Member::Tools,
    Member::Documents,
    Member::ChatTemplateKwargs,
    Member::AddGenerationPrompt,
    Member::ContinueFinalMessage,
    Member::AddSpecialTokens,
];

/// Through the model's tokenizer when `tok` has one (else as [`token_ids`]).
pub fn prompt_tokens(
    tok: Option<&crate::tokenize::Tokenizers>,
    endpoint: Endpoint,
    model: &str,
    body: &Body,
) -> Result<Option<Vec<u32>>, PromptError> {
    tokens_of(tok, endpoint, model, body, false)
        .unwrap_or_else(|| Err(PromptError("chat template: out of fuel".into())))
}

/// The request's `cache_salt` (vLLM and SGLang's tenant isolation field), routed in
/// that salt's hash space (`engines::chain_start`); the body is forwarded unchanged, so
/// the engine sees the same salt. Anything but a non-empty string of at most 64 KiB is
/// no salt here (the engine answers for a malformed one).
pub fn cache_salt(body: &Body) -> Option<String> {
    let s = body.get_str(Member::CacheSalt)?;
    (!s.is_empty() && s.len() <= u16::MAX as usize).then_some(s)
}

/// [`prompt_tokens`] with a quick chat render (`Tokenizers::prompt_tokens_quick`):
/// `None` when the render needs more steps than a core should spend (finish it with
/// [`prompt_tokens`] off the core).
pub fn prompt_tokens_quick(
    tok: Option<&crate::tokenize::Tokenizers>,
    endpoint: Endpoint,
    model: &str,
    body: &Body,
) -> Option<Result<Option<Vec<u32>>, PromptError>> {
    tokens_of(tok, endpoint, model, body, true)
}

fn tokens_of(
    tok: Option<&crate::tokenize::Tokenizers>,
    endpoint: Endpoint,
    model: &str,
    body: &Body,
    quick: bool,
) -> Option<Result<Option<Vec<u32>>, PromptError>> {
    if super::agents::handles(endpoint) {
        // Converted to a chat request as a whole (`api_shapes`): a tree of the body.
        let v = body.to_value();
        let r = super::agents::prompt_tokens(tok, endpoint, &v, quick, MAX_PROMPT_TOKENS)
            .map(|r| r.map_err(PromptError));
        return if quick {
            r
        } else {
            Some(r.unwrap_or(Ok(None)))
        };
    }
    let Some(t) = tok else {
        return Some(token_ids(endpoint, model, body));
    };
    let err = |e: crate::tokenize::PromptError| PromptError(e.0);
    if endpoint == Endpoint::Completions {
        // Read in place: no JSON tree of the prompt (`tokenize::given`).
        let r = given::read(
            body.get(Member::Prompt),
            body.get(Member::AddSpecialTokens),
            t.max_prompt_tokens(),
        )
        .and_then(|(g, special)| t.completion_tokens(model, g, special));
        return Some(r.map_err(err));
    }
    // A template reads JSON values: a tree of its members only.
    let sub = match body.subset(&CHAT) {
        Ok(v) => v,
        Err(m) => return Some(Err(PromptError(m))),
    };
    let e = crate::tokenize::Endpoint::Chat;
    if quick {
        t.prompt_tokens_quick(e, model, &sub)
            .map(|r| r.map_err(err))
    } else {
        Some(t.prompt_tokens(e, model, &sub).map_err(err))
    }
}

/// Token-id prompts of completions only (no tokenizer needed): a list of ids, or a
/// list of such lists (the first), read in place.
pub fn token_ids(
    endpoint: Endpoint,
    _model: &str,
    body: &Body,
) -> Result<Option<Vec<u32>>, PromptError> {
    if endpoint != Endpoint::Completions {
        return Ok(None);
    }
    let Some(raw) = body.get(Member::Prompt).filter(|t| t.starts_with('[')) else {
        return Ok(None);
    };
    // The common shape in one pass; every other one (and every error) as a tree.
    if let Ok((Given::Ids(ids), _)) = given::read(Some(raw), None, MAX_PROMPT_TOKENS) {
        return Ok(Some(ids));
    }
    let items: Vec<serde_json::Value> =
        serde_json::from_str(raw).map_err(|e| PromptError(format!("prompt: {e}")))?;
    tree_ids(&items)
}

/// [`token_ids`] of a prompt list as a tree.
fn tree_ids(items: &[serde_json::Value]) -> Result<Option<Vec<u32>>, PromptError> {
    use serde_json::Value;
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

    fn b(v: serde_json::Value) -> Body {
        Body::parse(bytes::Bytes::from(v.to_string())).unwrap()
    }

    #[test]
    fn token_prompts_are_read_and_text_needs_a_tokenizer() {
        let c = Endpoint::Completions;
        let prompt_tokens = |e, m, v| token_ids(e, m, &b(v));
        assert_eq!(
            prompt_tokens(c, "m", json!({"prompt": [1, 2, 3]})).unwrap(),
            Some(vec![1, 2, 3])
        );
        assert_eq!(
            prompt_tokens(c, "m", json!({"prompt": [[4, 5], [6]]})).unwrap(),
            Some(vec![4, 5])
        );
        assert_eq!(
            prompt_tokens(c, "m", json!({"prompt": "hi"})).unwrap(),
            None
        );
        assert_eq!(
            prompt_tokens(c, "m", json!({"prompt": ["hi"]})).unwrap(),
            None
        );
        assert_eq!(
            prompt_tokens(Endpoint::Chat, "m", json!({"messages": []})).unwrap(),
            None
        );
        assert!(prompt_tokens(c, "m", json!({"prompt": [1, -2]})).is_err());
        assert!(prompt_tokens(c, "m", json!({"prompt": []})).is_err());
        assert!(prompt_tokens(c, "m", json!({"prompt": [1.5]})).is_err());
    }

    #[test]
    fn cache_salt_is_a_non_empty_string_or_nothing() {
        assert_eq!(
            cache_salt(&b(json!({"cache_salt": "t1"}))).as_deref(),
            Some("t1")
        );
        assert_eq!(cache_salt(&b(json!({"cache_salt": ""}))), None);
        assert_eq!(cache_salt(&b(json!({"cache_salt": 7}))), None);
        assert_eq!(cache_salt(&b(json!({"prompt": [1]}))), None);
    }
}
