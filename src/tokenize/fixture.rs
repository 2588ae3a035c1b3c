//! A small, real HuggingFace tokenizer for tests, demos and workload generators
//! (`kvroute-sim tokenizer --out DIR`), since no model hub is reachable.
//!
//! `tokenizer.json` is built and serialised with the `tokenizers` crate: a WordLevel
//! model behind a whitespace-split pre-tokenizer, in which the word `t{N}` is token id N
//! for N < `vocab`, so a generator writes text whose ids it knows ("t5 t17" → [5, 17]).
//! After them come `<unk>`, `<s>` (BOS), `</s>` (EOS), the ChatML markers
//! `<|im_start|>` / `<|im_end|>` (special tokens, matched inside words too) and the role
//! words `system`, `user`, `assistant`, `tool`. A TemplateProcessing post-processor
//! prepends `<s>` when special tokens are added (completions).
//!
//! `tokenizer_config.json` names the special tokens (bos as a string, eos in the
//! AddedToken `{content: ..}` form, as real configs mix them) and a ChatML-like chat
//! template using `bos_token`, `messages`, `add_generation_prompt` and
//! `raise_exception` (content parts reach it joined into one string, as vLLM passes
//! them to a template that does not iterate over content).

use std::path::Path;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

/// Default vocabulary size of the test tokenizer (`t0` .. `t{N-1}`).
pub const DEFAULT_VOCAB: u32 = 32_000;

/// Largest vocabulary the builder accepts.
pub const MAX_VOCAB: u32 = 1 << 24;

/// The special tokens and role words after the `t{N}` words, in id order.
pub const EXTRA_TOKENS: [&str; 9] = [
    "<unk>",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "system",
    "user",
    "assistant",
    "tool",
];

/// The chat template of the test tokenizer (ChatML with a BOS, HF style).
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}\
{{ raise_exception('unknown role ' + message['role']) }}{% endif %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Id of `EXTRA_TOKENS[i]` in a tokenizer of `vocab` words.
pub fn extra_id(vocab: u32, token: &str) -> Option<u32> {
    EXTRA_TOKENS
        .iter()
        .position(|t| *t == token)
        .map(|i| vocab + i as u32)
}

/// Text whose (special-token-free) encoding is exactly `ids` (each < vocab).
pub fn text_of(ids: &[u32]) -> String {
    let mut s = String::with_capacity(ids.len() * 6);
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push('t');
        s.push_str(&id.to_string());
    }
    s
}

/// The test tokenizer itself.
pub fn build_tokenizer(vocab: u32) -> Result<Tokenizer, String> {
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(format!("vocab must be 1..={MAX_VOCAB}"));
    }
    let mut words: ahash::AHashMap<String, u32> =
        (0..vocab).map(|i| (format!("t{i}"), i)).collect();
    for (i, t) in EXTRA_TOKENS.iter().enumerate() {
        words.insert((*t).to_string(), vocab + i as u32);
    }
    let model = WordLevel::builder()
        .vocab(words)
        .unk_token("<unk>".into())
        .build()
        .map_err(|e| format!("wordlevel: {e}"))?;
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(WhitespaceSplit));
    let bos = vocab + 1;
    let post = TemplateProcessing::builder()
        .try_single("<s> $A")
        .and_then(|b| b.try_pair("<s> $A <s> $B"))
        .map_err(|e| format!("post-processor: {e}"))?
        .special_tokens(vec![("<s>".to_string(), bos)])
        .build()
        .map_err(|e| format!("post-processor: {e}"))?;
    tok.with_post_processor(Some(post));
    let specials: Vec<AddedToken> = EXTRA_TOKENS[..5]
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    tok.add_special_tokens(&specials);
    Ok(tok)
}

/// The tokenizer_config.json of the test tokenizer.
pub fn config_json() -> serde_json::Value {
    serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": false,
                      "normalized": false, "rstrip": false, "single_word": false},
        "unk_token": "<unk>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "model_max_length": 1_000_000,
        "chat_template": CHAT_TEMPLATE,
    })
}

/// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created if needed).
pub fn write_dir(dir: &Path, vocab: u32) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tok = build_tokenizer(vocab)?;
    let tj = dir.join("tokenizer.json");
    tok.save(&tj, false)
        .map_err(|e| format!("{}: {e}", tj.display()))?;
    let cfg = dir.join("tokenizer_config.json");
    let text = serde_json::to_string_pretty(&config_json()).map_err(|e| e.to_string())?;
    std::fs::write(&cfg, text).map_err(|e| format!("{}: {e}", cfg.display()))?;
    Ok(())
}
