//! One model's tokenizer ([`Model`]: HF's, with the ids-only and lean shortcuts
//! where they are exact, and its chat templates) and [`encode`], the one place text
//! becomes token ids within the prompt bounds.

use super::bounds::{check_text_len, check_token_count, PromptError};
use super::{chat, ids, lean};

/// One model's tokenizer and chat templates.
pub(crate) struct Model {
    pub(crate) tok: tokenizers::Tokenizer,
    /// Size of the vocabulary with added tokens: token-id prompts must stay below it.
    pub(crate) vocab: u32,
    pub(crate) chat: Option<chat::ChatTemplates>,
    /// The ids-only path ([`ids::Fast`]) when it is exact for this tokenizer.
    pub(crate) fast: Option<ids::Fast>,
    /// The lean walk of the pipeline ([`lean::Lean`]) when it is exact for it (it
    /// takes the special tokens around a sequence from `fast`).
    pub(crate) lean: Option<lean::Lean>,
}

impl Model {
    /// A model of `tok` with its chat templates; the shortcuts it is exact for.
    pub(crate) fn new(tok: tokenizers::Tokenizer, chat: Option<chat::ChatTemplates>) -> Model {
        let vocab = u32::try_from(tok.get_vocab_size(true)).unwrap_or(u32::MAX);
        let fast = ids::Fast::new(&tok);
        let lean = fast.as_ref().and_then(|_| lean::Lean::new(&tok));
        Model {
            tok,
            vocab,
            chat,
            fast,
            lean,
        }
    }

    /// Whether prompts are tokenized by the lean walk ([`lean::Lean`]).
    pub(crate) fn is_lean(&self) -> bool {
        self.lean.as_ref().is_some_and(lean::Lean::on)
    }
}

/// Encodes `text` with the model's tokenizer, refusing results above `max` tokens.
pub(crate) fn encode(
    m: &Model,
    text: &str,
    add_special: bool,
    max: usize,
) -> Result<Vec<u32>, PromptError> {
    check_text_len(text.len(), max)?;
    let ids = match (&m.lean, &m.fast) {
        (Some(l), Some(f)) if l.on() => lean_ids(m, l, f, text, add_special),
        (_, Some(f)) => f.ids(&m.tok, text, add_special).map_err(|e| e.to_string()),
        (_, None) => m
            .tok
            .encode_fast(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string()),
    }
    .map_err(|e| PromptError(format!("tokenizer: {e}")))?;
    check_token_count(ids.len(), max)?;
    Ok(ids)
}

/// The lean walk's ids between `fast`'s special tokens; a sampled text is compared
/// with `fast`'s ids (a difference turns the lean path off and answers with those).
fn lean_ids(
    m: &Model,
    l: &lean::Lean,
    f: &ids::Fast,
    text: &str,
    add_special: bool,
) -> Result<Vec<u32>, String> {
    let ids = f.wrap(text.len(), add_special, |ids| l.ids(&m.tok, text, ids))?;
    if l.sample() {
        let want = f
            .ids(&m.tok, text, add_special)
            .map_err(|e| e.to_string())?;
        if want != ids {
            l.differed();
            return Ok(want);
        }
    }
    Ok(ids)
}
