//! Fuzz target: the lean tokenization walk (`tokenize::lean`) against HF's pipeline.
//!
//! Arbitrary bytes (lossily UTF-8) are a completions prompt, tokenized by every
//! pipeline of `tokenize::pipelines` twice: by the lean walk (the default) and with
//! it turned off (`with_lean(false)`, HF's pipeline). The first byte chooses whether
//! special tokens are added. Any difference in the ids (also one the walk's own
//! sampled check caught), or a panic, is a bug: the router would hash other blocks
//! than the engine caches.
#![no_main]

use kvroute::tokenize::{pipelines, testing, Endpoint, Tokenizers};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn pairs() -> &'static [(&'static str, Tokenizers, Tokenizers)] {
    static T: OnceLock<Vec<(&'static str, Tokenizers, Tokenizers)>> = OnceLock::new();
    T.get_or_init(|| {
        pipelines::all()
            .into_iter()
            .map(|(name, tok)| {
                let lean = testing::from_tokenizer("m", tok.clone());
                assert!(lean.is_lean("m"), "{name}: the lean walk does not cover it");
                let hf = testing::from_tokenizer("m", tok).with_lean(false);
                assert!(!hf.is_lean("m"));
                (name, lean, hf)
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let body = serde_json::json!({"prompt": text, "add_special_tokens": sel % 2 == 0});
    for (name, lean, hf) in pairs() {
        let a = lean.prompt_tokens(Endpoint::Completions, "m", &body);
        let b = hf.prompt_tokens(Endpoint::Completions, "m", &body);
        assert_eq!(a, b, "{name}: {text:?}");
        // A sampled run-time check that differed would have answered with HF's ids
        // and turned the walk off: that is a difference too.
        assert!(lean.is_lean("m") && lean.lean_mismatches() == 0, "{name}: {text:?}");
    }
});
