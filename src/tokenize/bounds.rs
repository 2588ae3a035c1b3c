//! What bounds a prompt before and after tokenizing: the limits (text length per
//! allowed token, token count) and the error a refused prompt gives. A leaf of
//! `tokenize`: every path to token ids checks these.

/// Default of `max_prompt_tokens` (settings `limits.max_prompt_tokens`).
pub const DEFAULT_MAX_PROMPT_TOKENS: usize = 262_144;

/// Text above this many bytes per allowed prompt token is refused before tokenizing
/// (no real tokenizer averages more than a few bytes per token on text).
pub const BYTES_PER_TOKEN_BOUND: usize = 16;

/// Why a request's prompt could not be tokenized (the proxy answers 400 with it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptError(pub String);

impl std::fmt::Display for PromptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PromptError {}

/// Refuses text whose length alone rules it out (before rendering or tokenizing).
pub(crate) fn check_text_len(bytes: usize, max_tokens: usize) -> Result<(), PromptError> {
    if bytes > max_tokens.saturating_mul(BYTES_PER_TOKEN_BOUND) {
        return Err(PromptError(format!(
            "prompt too long: {bytes} bytes of text (limit {max_tokens} tokens)"
        )));
    }
    Ok(())
}

pub(crate) fn check_token_count(n: usize, max_tokens: usize) -> Result<(), PromptError> {
    if n > max_tokens {
        return Err(PromptError(format!(
            "prompt too long: {n} tokens > limit {max_tokens}"
        )));
    }
    Ok(())
}
