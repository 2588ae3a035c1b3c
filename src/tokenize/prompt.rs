//! `/v1/completions` prompts → token ids, in the forms vLLM accepts: a string, a list of
//! strings, a list of token ids, or a list of token-id lists.
//!
//! A list is a batch the engine runs as separate sequences; kvroute sends the whole
//! request to one worker, so it routes on the **first** prompt (the others share the
//! worker and usually the prefix). Sizes are checked before anything is allocated for
//! them: a token-id list longer than the limit is refused from its length, text from its
//! byte length ([`check_text_len`]).

use super::bounds::{check_text_len, check_token_count, PromptError};
use super::model::{encode, Model};
use serde_json::Value;

/// The first prompt's token ids. `m`: the model's tokenizer, if any (None: a text
/// prompt gives Ok(None); token ids are returned unchecked against a vocabulary).
pub(crate) fn completion_tokens(
    m: Option<&Model>,
    body: &Value,
    max: usize,
) -> Result<Option<Vec<u32>>, PromptError> {
    let prompt = body
        .get("prompt")
        .ok_or_else(|| PromptError("prompt is required".into()))?;
    let add_special = match body.get("add_special_tokens") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(PromptError("add_special_tokens must be a boolean".into())),
    };
    match prompt {
        Value::String(s) => text(m, s, add_special, max),
        Value::Array(items) => match items.first() {
            None => Err(PromptError("prompt must not be an empty list".into())),
            Some(Value::String(s)) => {
                if !items.iter().all(Value::is_string) {
                    return Err(PromptError("prompt: a list mixes strings and other values".into()));
                }
                text(m, s, add_special, max)
            }
            Some(Value::Number(_)) => ids(m, items, max).map(Some),
            Some(Value::Array(first)) => {
                if !items.iter().all(Value::is_array) {
                    return Err(PromptError("prompt: a list mixes token lists and other values".into()));
                }
                if first.is_empty() {
                    return Err(PromptError("prompt: an empty token list".into()));
                }
                ids(m, first, max).map(Some)
            }
            Some(_) => Err(PromptError(
                "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists".into(),
            )),
        },
        _ => Err(PromptError(
            "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists".into(),
        )),
    }
}

fn text(
    m: Option<&Model>,
    s: &str,
    add_special: bool,
    max: usize,
) -> Result<Option<Vec<u32>>, PromptError> {
    match m {
        None => Ok(None),
        Some(m) => encode(m, s, add_special, max).map(Some),
    }
}

/// A JSON list of token ids, each a u32 (below the vocabulary size when a tokenizer is
/// known), at most `max` of them.
fn ids(m: Option<&Model>, items: &[Value], max: usize) -> Result<Vec<u32>, PromptError> {
    check_token_count(items.len(), max)?;
    let limit = m.map(|m| m.vocab).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(items.len());
    for v in items {
        let id = v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| PromptError(format!("prompt: {v} is not a token id")))?;
        if m.is_some() && id >= limit {
            return Err(PromptError(format!(
                "prompt: token id {id} is out of vocabulary (size {limit})"
            )));
        }
        out.push(id);
    }
    Ok(out)
}

/// A chat request's prompt token ids; `quick`: rendered within [`super::chat::QUICK_FUEL`] steps,
/// `None` when it needs more.
pub(crate) fn chat_tokens(
    m: &Model,
    body: &Value,
    max: usize,
    quick: bool,
) -> Option<Result<Vec<u32>, PromptError>> {
    let Some(t) = m.chat.as_ref() else {
        return Some(Err(PromptError("the model has no chat template".into())));
    };
    let add_special = match body.get("add_special_tokens") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Some(Err(PromptError(
                "add_special_tokens must be a boolean".into(),
            )))
        }
    };
    let text = if quick {
        t.render_quick(body, max)?
    } else {
        t.render(body, max)
    };
    Some(text.and_then(|text| {
        check_text_len(text.len(), max)?;
        encode(m, &text, add_special, max)
    }))
}
