//! Fuzz target: arbitrary bytes as the body of an OpenAI request, tokenized for routing.
//!
//! The first byte picks the endpoint (even: chat, odd: completions) and the prompt
//! limit; the rest is parsed as JSON and handed to `Tokenizers::prompt_tokens` with the
//! test tokenizer (`kvroute::tokenize::testing`), for the model and for an unknown one.
//! Any panic is a bug (bad bodies must become `PromptError`s, answered with 400), and a
//! returned prompt never exceeds the limit.
#![no_main]

use kvroute::tokenize::{testing, Endpoint, Tokenizers};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn tokenizers() -> &'static [Tokenizers; 2] {
    static T: OnceLock<[Tokenizers; 2]> = OnceLock::new();
    T.get_or_init(|| {
        let small = testing::in_memory("m", 64).expect("test tokenizer");
        let big = testing::in_memory("m", 64).expect("test tokenizer");
        [small.with_max_prompt_tokens(16), big]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let endpoint = if sel % 2 == 0 {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let t = &tokenizers()[usize::from(sel / 2 % 2)];
    for model in ["m", "other"] {
        if let Ok(Some(ids)) = t.prompt_tokens(endpoint, model, &body) {
            assert!(ids.len() <= t.max_prompt_tokens(), "{} tokens", ids.len());
        }
    }
});
