//! Fuzz target: arbitrary bytes as an Anthropic Messages or OpenAI Responses body, and
//! as either API's answer stream.
//!
//! Byte 0 picks the API (bit 0), the prompt limit (bit 1), whether the template needs
//! system messages first (bit 2) and the stream chunk size (the high bits); the rest is
//! parsed as JSON and converted (`api_shapes::from_value`) and tokenized
//! (`api_shapes::prompt_tokens`, test tokenizer), then fed as SSE and as a JSON answer
//! to the lifecycle reader. Any panic is a bug (bad bodies become 400s); a returned
//! prompt never exceeds the limit; a converted body is a chat request (an object with
//! a `messages` list); the reader never counts more tokens than it was fed bytes
//! unless an upstream `usage` says so, and never reports a first token twice.
#![no_main]

use kvroute::api_shapes::{self, stream::StreamTracker, Api};
use kvroute::tokenize::{testing, Tokenizers};
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
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let api = if sel & 1 == 0 { Api::Messages } else { Api::Responses };
    let t = &tokenizers()[usize::from(sel >> 1 & 1)];
    let merge = sel & 4 != 0;
    if let Ok(body) = serde_json::from_slice::<serde_json::Value>(rest) {
        if let Ok(r) = api_shapes::from_value(api, &body, 1 << 12, merge) {
            assert!(r.chat["messages"].is_array());
            assert!(!r.model.is_empty());
        }
        if let Ok((_, Some(ids))) = api_shapes::prompt_tokens(t, api, &body) {
            assert!(ids.len() <= t.max_prompt_tokens(), "{} tokens", ids.len());
        }
    }
    let chunk = usize::from(sel >> 3) + 1;
    let mut sse = StreamTracker::new(api, true, 1 << 16);
    let mut firsts = 0;
    for c in rest.chunks(chunk) {
        firsts += u32::from(sse.feed(c).first_output);
    }
    assert!(firsts <= 1);
    let mut json = StreamTracker::new(api, false, 1 << 16);
    for c in rest.chunks(chunk) {
        json.feed(c);
    }
    let s = json.finish();
    assert!(!(s.first_output && json.tokens() == 0 && !json.output_seen()));
});
