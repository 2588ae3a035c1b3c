//! The OpenAI request and response shapes of the simulated vLLM workers
//! (`kvroute-sim fleet`), sans I/O: parsing a `/v1/completions` or
//! `/v1/chat/completions` body, the prompt's token ids, and the JSON / SSE bodies vLLM
//! answers with (`text_completion`, `chat.completion`, `chat.completion.chunk`, `usage`,
//! `kv_transfer_params`).
//!
//! Guarantees: parsing never panics on any JSON value (bad fields are errors or
//! defaults, never crashes); the token ids of a prompt are deterministic, so the same
//! text always hits the same cached blocks; every response body is valid JSON.
//!
//! Tokenization is deliberately one function, [`prompt_tokens`]: a word `t{N}` is token
//! id N (the convention of the replay text and of `kvroute-sim tokenizer`), token-id
//! prompts are taken as is, any other word maps to a stable id from its hash, and a
//! chat request is the concatenation of its messages' contents.

use serde_json::{json, Value};

/// Token ids of other words are drawn below this (a typical vocabulary size).
pub const VOCAB: u32 = 32_000;

/// Which endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

/// The NIXL connector's `kv_transfer_params`, as far as the simulation needs them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvTransfer {
    /// Prefill leg: compute the prompt, keep the blocks for a remote decode.
    pub do_remote_decode: bool,
    /// Decode leg: the prompt's blocks come from a remote prefill.
    pub do_remote_prefill: bool,
    /// Blocks the prefill worker says it holds (`remote_block_ids`).
    pub remote_blocks: usize,
}

/// What a simulated worker needs from a request body.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenAiRequest {
    pub api: Api,
    pub model: String,
    pub tokens: Vec<u32>,
    /// Tokens to generate (`max_tokens` / `max_completion_tokens`, default 16).
    pub max_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub kv: KvTransfer,
}

/// Default `max_tokens` when a request gives none (vLLM's completions default is 16).
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Parses a request body. `max_tokens_cap` bounds what one request may ask for.
pub fn parse_request(api: Api, body: &[u8], max_tokens_cap: u32) -> Result<OpenAiRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    if !v.is_object() {
        return Err("the body must be a JSON object".into());
    }
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match api {
        Api::Completions if v.get("prompt").is_none() => {
            return Err("`prompt` is required".into());
        }
        Api::Chat if !v.get("messages").is_some_and(Value::is_array) => {
            return Err("`messages` must be an array".into());
        }
        _ => {}
    }
    let max = v
        .get("max_tokens")
        .or_else(|| v.get("max_completion_tokens"))
        .filter(|m| !m.is_null());
    let max_tokens = match max {
        None => DEFAULT_MAX_TOKENS,
        Some(m) => match m.as_u64() {
            Some(n) if n >= 1 => n.min(max_tokens_cap as u64) as u32,
            _ => return Err("`max_tokens` must be an integer >= 1".into()),
        },
    };
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let kvp = v.get("kv_transfer_params");
    let flag = |k: &str| {
        kvp.and_then(|p| p.get(k))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let kv = KvTransfer {
        do_remote_decode: flag("do_remote_decode"),
        do_remote_prefill: flag("do_remote_prefill"),
        remote_blocks: kvp
            .and_then(|p| p.get("remote_block_ids"))
            .and_then(Value::as_array)
            .map_or(0, Vec::len),
    };
    Ok(OpenAiRequest {
        api,
        model,
        tokens: prompt_tokens(&v),
        max_tokens,
        stream,
        include_usage,
        kv,
    })
}

/// The prompt's token ids: `prompt` (a string, token ids, or a list of either, joined)
/// or the concatenated text of `messages[].content` (a string or text parts).
pub fn prompt_tokens(body: &Value) -> Vec<u32> {
    let mut out = Vec::new();
    if let Some(p) = body.get("prompt") {
        prompt_value(p, &mut out, 0);
    } else if let Some(msgs) = body.get("messages").and_then(Value::as_array) {
        for m in msgs {
            match m.get("content") {
                Some(Value::String(s)) => text_tokens(s, &mut out),
                Some(Value::Array(parts)) => {
                    for p in parts {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            text_tokens(t, &mut out);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn prompt_value(p: &Value, out: &mut Vec<u32>, depth: u8) {
    match p {
        Value::String(s) => text_tokens(s, out),
        Value::Number(n) => out.push(n.as_u64().map_or(0, |n| n.min(u32::MAX as u64) as u32)),
        Value::Array(a) if depth < 2 => {
            for x in a {
                prompt_value(x, out, depth + 1);
            }
        }
        _ => {}
    }
}

/// Token ids of text: `t{N}` is N, any other word a stable id below [`VOCAB`].
pub fn text_tokens(s: &str, out: &mut Vec<u32>) {
    for w in s.split_whitespace() {
        let id = w
            .strip_prefix('t')
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u32>().ok());
        out.push(id.unwrap_or_else(|| {
            (crate::hash::local_block_hash(&word_key(w)) % VOCAB as u64) as u32
        }));
    }
}

fn word_key(w: &str) -> Vec<u32> {
    w.bytes().map(u32::from).collect()
}

/// The text of generated token `i` of a response (deterministic).
pub fn output_word(i: u32) -> String {
    format!(" t{}", (i.wrapping_mul(7919).wrapping_add(11)) % VOCAB)
}

fn object(api: Api, chunk: bool) -> &'static str {
    match (api, chunk) {
        (Api::Completions, _) => "text_completion",
        (Api::Chat, false) => "chat.completion",
        (Api::Chat, true) => "chat.completion.chunk",
    }
}

/// `usage` of a response.
pub fn usage(prompt: usize, completion: u32) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt as u64 + completion as u64,
    })
}

/// Identity of one response: its id, model and creation time.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub id: String,
    pub model: String,
    pub created: u64,
}

/// One streamed chunk carrying `text` (chat: as `delta.content`; the first chat chunk
/// also carries `role`), with `finish_reason` on the last one.
pub fn chunk(api: Api, m: &ResponseMeta, text: &str, first: bool, finish: Option<&str>) -> Value {
    let choice = match api {
        Api::Completions => json!({
            "index": 0, "text": text, "logprobs": null, "finish_reason": finish,
            "stop_reason": null,
        }),
        Api::Chat => {
            let delta = if first {
                json!({"role": "assistant", "content": text})
            } else {
                json!({"content": text})
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        }
    };
    json!({
        "id": m.id, "object": object(api, true), "created": m.created, "model": m.model,
        "choices": [choice],
    })
}

/// The final usage-only chunk of a stream with `stream_options.include_usage`.
pub fn usage_chunk(api: Api, m: &ResponseMeta, prompt: usize, completion: u32) -> Value {
    json!({
        "id": m.id, "object": object(api, true), "created": m.created, "model": m.model,
        "choices": [], "usage": usage(prompt, completion),
    })
}

/// A whole (non-streamed) response. `kv_transfer_params` is added when given (the
/// prefill leg of the NIXL flow).
pub fn full_response(
    api: Api,
    m: &ResponseMeta,
    text: &str,
    prompt: usize,
    completion: u32,
    finish: &str,
    kv_transfer_params: Option<Value>,
) -> Value {
    let choice = match api {
        Api::Completions => json!({
            "index": 0, "text": text, "logprobs": null, "finish_reason": finish,
            "stop_reason": null, "prompt_logprobs": null,
        }),
        Api::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": null, "finish_reason": finish, "stop_reason": null,
        }),
    };
    let mut v = json!({
        "id": m.id, "object": object(api, false), "created": m.created, "model": m.model,
        "choices": [choice], "usage": usage(prompt, completion),
    });
    if let (Some(p), Some(o)) = (kv_transfer_params, v.as_object_mut()) {
        o.insert("kv_transfer_params".into(), p);
    }
    v
}

/// `kv_transfer_params` a prefill worker answers with (vLLM's NixlConnector shape).
pub fn prefill_transfer_params(block_ids: &[u64], engine_id: &str, host: &str, port: u16) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": block_ids,
        "remote_engine_id": engine_id,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    })
}

/// An OpenAI-style error body.
pub fn error_body(message: &str, kind: &str, code: u16) -> Value {
    json!({"object": "error", "message": message, "type": kind, "param": null, "code": code})
}

/// One SSE event line for `v`.
pub fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The SSE terminator.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_words_are_token_ids_and_other_words_are_stable() {
        let mut a = Vec::new();
        text_tokens("t5 t0 t123 hello t12x", &mut a);
        assert_eq!(&a[..3], &[5, 0, 123]);
        let mut b = Vec::new();
        text_tokens("hello t12x", &mut b);
        assert_eq!(&a[3..], &b[..]);
        assert!(b.iter().all(|&t| t < VOCAB));
    }

    #[test]
    fn prompt_forms_and_chat_contents() {
        let v = json!({"prompt": [1, 2, 3]});
        assert_eq!(prompt_tokens(&v), vec![1, 2, 3]);
        let v = json!({"prompt": ["t1 t2", "t3"]});
        assert_eq!(prompt_tokens(&v), vec![1, 2, 3]);
        let v = json!({"messages": [{"role": "system", "content": "t1"},
            {"role": "user", "content": [{"type": "text", "text": "t2 t3"}]}]});
        assert_eq!(prompt_tokens(&v), vec![1, 2, 3]);
    }

    #[test]
    fn parse_honours_fields_and_rejects_bad_input() {
        let b = br#"{"model":"m","prompt":"t1","max_tokens":5,"stream":true,
            "stream_options":{"include_usage":true},
            "kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2]}}"#;
        let r = parse_request(Api::Completions, b, 100).unwrap();
        assert_eq!((r.max_tokens, r.stream, r.include_usage), (5, true, true));
        assert!(r.kv.do_remote_prefill && !r.kv.do_remote_decode);
        assert_eq!(r.kv.remote_blocks, 2);
        let r = parse_request(
            Api::Completions,
            br#"{"prompt":"t1","max_tokens":1e9}"#,
            100,
        );
        assert!(r.is_err());
        let r = parse_request(
            Api::Completions,
            br#"{"prompt":"t1","max_tokens":900}"#,
            100,
        );
        assert_eq!(r.unwrap().max_tokens, 100);
        assert!(parse_request(Api::Chat, br#"{"prompt":"x"}"#, 10).is_err());
        assert!(parse_request(Api::Chat, b"[1]", 10).is_err());
        assert!(parse_request(Api::Chat, b"\xff", 10).is_err());
        let deep = format!("{{\"prompt\":{}1{}}}", "[".repeat(50), "]".repeat(50));
        assert!(parse_request(Api::Completions, deep.as_bytes(), 10).is_ok());
    }

    #[test]
    fn shapes_are_vllm_like() {
        let m = ResponseMeta {
            id: "cmpl-1".into(),
            model: "m".into(),
            created: 1,
        };
        let c = chunk(Api::Chat, &m, " t1", true, None);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["choices"][0]["delta"]["role"], "assistant");
        let f = full_response(
            Api::Completions,
            &m,
            "x",
            3,
            1,
            "length",
            Some(json!({"a": 1})),
        );
        assert_eq!(f["usage"]["total_tokens"], 4);
        assert_eq!(f["kv_transfer_params"]["a"], 1);
        assert!(sse(&c).starts_with("data: {") && sse(&c).ends_with("\n\n"));
    }
}
