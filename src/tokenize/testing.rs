//! Test tokenizers as [`Tokenizers`](super::Tokenizers) sets, for tests, fuzz targets,
//! benchmarks and examples: the small real HuggingFace tokenizer of [`super::fixture`]
//! (its items are re-exported here) in memory, or any tokenizer alone.

pub use super::fixture::*;
use tokenizers::Tokenizer;

/// `tok` as the only tokenizer, for model `model` (no chat template): for fuzz targets
/// and tests of other pipelines (`tokenize::pipelines`).
pub fn from_tokenizer(model: &str, tok: Tokenizer) -> super::Tokenizers {
    let mut t = super::Tokenizers::empty();
    t.models.insert(
        model.to_string(),
        std::sync::Arc::new(super::Model::new(tok, None)),
    );
    t
}

/// The test tokenizer loaded in memory as model `model` (what [`write_dir`] writes,
/// without the files): for fuzz targets and benchmarks.
pub fn in_memory(model: &str, vocab: u32) -> Result<super::Tokenizers, String> {
    let tok = build_tokenizer(vocab)?;
    let chat = super::chat::ChatTemplates::from_config(&config_json(), None)?;
    let mut t = super::Tokenizers::empty();
    t.models.insert(
        model.to_string(),
        std::sync::Arc::new(super::Model::new(tok, chat)),
    );
    Ok(t)
}
