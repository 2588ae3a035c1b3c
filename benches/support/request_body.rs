//! The completions body the request benchmarks measure (`benches/request.rs`, and
//! `examples/request_steps.rs` under callgrind): `n` tokens as ids or as `t{N}` text,
//! with the members a streamed `kvroute-sim replay` request carries.

use bytes::Bytes;
use serde_json::json;

/// A completions body of `n` tokens: ids, or `t{N}` text.
pub fn body(n: usize, ids: bool) -> Bytes {
    let toks: Vec<u32> = (0..n as u64)
        .map(|i| (kvroute::hash::mix_external_id(i / 512 * 7 + i) % 32_000) as u32)
        .collect();
    let prompt = if ids {
        json!(toks)
    } else {
        json!(toks
            .iter()
            .map(|t| format!("t{t}"))
            .collect::<Vec<_>>()
            .join(" "))
    };
    let v = json!({"model": "sim-model", "prompt": prompt, "max_tokens": 16,
                   "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    Bytes::from(v.to_string())
}
