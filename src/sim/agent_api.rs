//! The answers of a simulated vLLM worker (`kvroute-sim fleet`) on the endpoints agents
//! and tools use besides chat completions, sans I/O: Anthropic Messages and OpenAI
//! Responses (whole, or as their named SSE events), embeddings, and `/tokenize` /
//! `/detokenize` — each in the shape vLLM 0.33 answers with.
//!
//! A generation is framed by [`Framing`]: the events before the first token, one per
//! token, and the events after the last (or one JSON answer), so the worker's
//! generating loop is the same for every API. The request side (the chat each body
//! renders as) is `crate::api_shapes`.
//!
//! Guarantees: every body is valid JSON built with `serde_json`; nothing here panics.

use super::openai::{self as oa, Api, ResponseMeta};
use serde_json::{json, Value};

/// How one generation is framed on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `/v1/completions` or `/v1/chat/completions` (`data:` chunks, `[DONE]`).
    OpenAi(Api),
    /// `/v1/messages`.
    Messages,
    /// `/v1/responses`.
    Responses,
}

/// One named SSE event.
pub fn named(event: &str, v: &Value) -> String {
    format!("event: {event}\ndata: {v}\n\n")
}

fn msg_item_id(m: &ResponseMeta) -> String {
    format!("msg_{}", m.id)
}

/// The Responses `output` message item carrying `text`.
fn output_item(m: &ResponseMeta, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
    } else {
        json!([])
    };
    json!({"id": msg_item_id(m), "type": "message", "role": "assistant",
        "status": status, "content": content})
}

/// A Responses `response` object.
pub fn response_object(
    m: &ResponseMeta,
    status: &str,
    text: Option<&str>,
    usage: Option<(usize, u32)>,
    previous: Option<&str>,
) -> Value {
    let output = match text {
        Some(t) => json!([output_item(m, t, "completed")]),
        None => json!([]),
    };
    let usage = usage.map(|(p, c)| {
        json!({"input_tokens": p, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p as u64 + u64::from(c)})
    });
    json!({
        "id": m.id, "object": "response", "created_at": m.created, "model": m.model,
        "status": status, "output": output, "usage": usage, "error": null,
        "incomplete_details": null, "instructions": null, "metadata": null,
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "temperature": 1.0, "top_p": 1.0, "previous_response_id": previous,
        "text": {"format": {"type": "text"}}, "truncation": "disabled",
    })
}

/// An Anthropic `message` object (content empty until the end of a stream).
pub fn message_object(
    m: &ResponseMeta,
    text: Option<&str>,
    usage: (usize, u32),
    stop: bool,
) -> Value {
    let content = match text {
        Some(t) => json!([{"type": "text", "text": t}]),
        None => json!([]),
    };
    json!({
        "id": m.id, "type": "message", "role": "assistant", "content": content,
        "model": m.model, "stop_reason": if stop { json!("max_tokens") } else { Value::Null },
        "stop_sequence": null,
        "usage": {"input_tokens": usage.0, "output_tokens": usage.1},
    })
}

impl Framing {
    /// The id prefix of an answer (`chatcmpl`, `cmpl`, `msg`, `resp`).
    pub fn id_prefix(self) -> &'static str {
        match self {
            Framing::OpenAi(Api::Chat) => "chatcmpl",
            Framing::OpenAi(Api::Completions) => "cmpl",
            Framing::Messages => "msg",
            Framing::Responses => "resp",
        }
    }

    /// The events before the first token (`prompt`: prompt tokens).
    pub fn head(self, m: &ResponseMeta, prompt: usize, previous: Option<&str>) -> String {
        match self {
            Framing::OpenAi(_) => String::new(),
            Framing::Messages => [
                named(
                    "message_start",
                    &json!({"type": "message_start",
                    "message": message_object(m, None, (prompt, 0), false)}),
                ),
                named(
                    "content_block_start",
                    &json!({"type": "content_block_start",
                    "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
            ]
            .concat(),
            Framing::Responses => {
                let r = response_object(m, "in_progress", None, None, previous);
                [
                    named("response.created", &json!({"type": "response.created", "sequence_number": 0, "response": r})),
                    named("response.in_progress", &json!({"type": "response.in_progress", "sequence_number": 1, "response": r})),
                    named("response.output_item.added", &json!({"type": "response.output_item.added",
                        "sequence_number": 2, "output_index": 0, "item": output_item(m, "", "in_progress")})),
                    named("response.content_part.added", &json!({"type": "response.content_part.added",
                        "sequence_number": 3, "item_id": msg_item_id(m), "output_index": 0, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}})),
                ]
                .concat()
            }
        }
    }

    /// The event of token `i` (`text`); `last`: the final one.
    pub fn token(self, m: &ResponseMeta, i: u32, text: &str, last: bool) -> String {
        match self {
            Framing::OpenAi(api) => {
                oa::sse(&oa::chunk(api, m, text, i == 0, last.then_some("length")))
            }
            Framing::Messages => named(
                "content_block_delta",
                &json!({"type": "content_block_delta",
                "index": 0, "delta": {"type": "text_delta", "text": text}}),
            ),
            Framing::Responses => named(
                "response.output_text.delta",
                &json!({
                "type": "response.output_text.delta", "sequence_number": 4 + u64::from(i),
                "item_id": msg_item_id(m), "output_index": 0, "content_index": 0,
                "delta": text, "logprobs": []}),
            ),
        }
    }

    /// The events after the last token: `text` is the whole output, `usage` the
    /// (prompt, completion) tokens, `include_usage` the OpenAI stream option.
    pub fn tail(
        self,
        m: &ResponseMeta,
        text: &str,
        usage: (usize, u32),
        include_usage: bool,
        previous: Option<&str>,
    ) -> String {
        match self {
            Framing::OpenAi(api) => {
                let mut t = String::new();
                if include_usage {
                    t.push_str(&oa::sse(&oa::usage_chunk(api, m, usage.0, usage.1)));
                }
                t.push_str(oa::SSE_DONE);
                t
            }
            Framing::Messages => [
                named(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                ),
                named(
                    "message_delta",
                    &json!({"type": "message_delta",
                    "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                    "usage": {"input_tokens": usage.0, "output_tokens": usage.1}}),
                ),
                named("message_stop", &json!({"type": "message_stop"})),
            ]
            .concat(),
            Framing::Responses => {
                let n = 4 + u64::from(usage.1);
                let id = msg_item_id(m);
                [
                    named("response.output_text.done", &json!({"type": "response.output_text.done",
                        "sequence_number": n, "item_id": id, "output_index": 0, "content_index": 0,
                        "text": text, "logprobs": []})),
                    named("response.content_part.done", &json!({"type": "response.content_part.done",
                        "sequence_number": n + 1, "item_id": id, "output_index": 0, "content_index": 0,
                        "part": {"type": "output_text", "text": text, "annotations": []}})),
                    named("response.output_item.done", &json!({"type": "response.output_item.done",
                        "sequence_number": n + 2, "output_index": 0, "item": output_item(m, text, "completed")})),
                    named("response.completed", &json!({"type": "response.completed", "sequence_number": n + 3,
                        "response": response_object(m, "completed", Some(text), Some(usage), previous)})),
                ]
                .concat()
            }
        }
    }

    /// A whole answer.
    pub fn full(
        self,
        m: &ResponseMeta,
        text: &str,
        usage: (usize, u32),
        kv_transfer_params: Option<Value>,
        previous: Option<&str>,
    ) -> Value {
        match self {
            Framing::OpenAi(api) => {
                oa::full_response(api, m, text, usage.0, usage.1, "length", kv_transfer_params)
            }
            Framing::Messages => message_object(m, Some(text), usage, true),
            Framing::Responses => {
                response_object(m, "completed", Some(text), Some(usage), previous)
            }
        }
    }
}

/// The `/v1/embeddings` inputs: a string, a list of strings, a token-id list, or a
/// list of token-id lists (at most `max_inputs`).
pub fn embedding_inputs(body: &Value, max_inputs: usize) -> Result<Vec<Value>, String> {
    let input = body.get("input").ok_or("input is required")?;
    let list: Vec<Value> = match input {
        Value::String(_) => vec![input.clone()],
        Value::Array(a) if a.is_empty() => return Err("input must not be empty".into()),
        Value::Array(a) if a.iter().all(Value::is_number) => vec![input.clone()],
        Value::Array(a) if a.iter().all(|x| x.is_string() || x.is_array()) => a.clone(),
        _ => return Err("input must be a string, a list of strings or token ids".into()),
    };
    if list.len() > max_inputs {
        return Err(format!("at most {max_inputs} inputs"));
    }
    Ok(list)
}

/// A deterministic unit vector of `dims` floats for a prompt's token ids.
pub fn embedding(tokens: &[u32], dims: usize) -> Vec<f32> {
    let seed = crate::hash::local_block_hash(tokens);
    let mut v: Vec<f32> = (0..dims as u64)
        .map(|i| {
            let x = crate::hash::mix_external_id(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// The `/v1/embeddings` answer; `data` holds each input's embedding (already encoded:
/// a list of floats, or a base64 string).
pub fn embeddings_body(m: &ResponseMeta, data: Vec<Value>, prompt_tokens: usize) -> Value {
    let data: Vec<Value> = data
        .into_iter()
        .enumerate()
        .map(|(i, e)| json!({"index": i, "object": "embedding", "embedding": e}))
        .collect();
    json!({"id": m.id, "object": "list", "created": m.created, "model": m.model, "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
            "completion_tokens": 0, "prompt_tokens_details": null}})
}

/// The `/tokenize` answer.
pub fn tokenize_body(tokens: &[u32], max_model_len: u64) -> Value {
    json!({"count": tokens.len(), "max_model_len": max_model_len, "tokens": tokens, "token_strs": null})
}

/// The `/detokenize` request's token ids (each a u32, at most `max`).
pub fn detokenize_ids(body: &Value, max: usize) -> Result<Vec<u32>, String> {
    let Some(Value::Array(ids)) = body.get("tokens") else {
        return Err("tokens must be a list of token ids".into());
    };
    if ids.len() > max {
        return Err(format!("at most {max} tokens"));
    }
    ids.iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| format!("{v} is not a token id"))
        })
        .collect()
}

/// Text of token ids without a tokenizer: the `t{N}` words the simulation reads.
pub fn t_words(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| format!("t{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "x-1".into(),
            model: "m".into(),
            created: 1,
        }
    }

    /// Every SSE frame is `event: T` + `data: {"type": T, ..}`.
    fn frames_named_by_type(s: &str) -> Vec<String> {
        s.split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (ev, data) = f.split_once('\n').unwrap();
                let ev = ev.strip_prefix("event: ").unwrap();
                let v: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(v["type"], ev);
                ev.to_string()
            })
            .collect()
    }

    #[test]
    fn message_and_response_streams_are_named_events_in_order() {
        for (f, first, last) in [
            (Framing::Messages, "message_start", "message_stop"),
            (Framing::Responses, "response.created", "response.completed"),
        ] {
            let m = meta();
            let all = [
                f.head(&m, 3, None),
                f.token(&m, 0, " a", false),
                f.token(&m, 1, " b", true),
                f.tail(&m, " a b", (3, 2), false, None),
            ]
            .concat();
            let names = frames_named_by_type(&all);
            assert_eq!(
                (names[0].as_str(), names.last().unwrap().as_str()),
                (first, last)
            );
            let mut t = crate::api_shapes::stream::StreamTracker::new(
                if f == Framing::Messages {
                    crate::api_shapes::Api::Messages
                } else {
                    crate::api_shapes::Api::Responses
                },
                true,
                0,
            );
            let s = t.feed(all.as_bytes());
            assert!(s.first_output && s.done && t.tokens() == 2, "{f:?}");
        }
        let r = Framing::Responses.full(&meta(), "hi", (1, 1), None, Some("resp_0"));
        assert_eq!(r["output"][0]["content"][0]["text"], "hi");
        assert_eq!(r["previous_response_id"], "resp_0");
    }

    #[test]
    fn embeddings_and_token_shapes() {
        let e = embedding(&[1, 2, 3], 8);
        let n: f32 = e.iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-4 && e == embedding(&[1, 2, 3], 8));
        assert!(embedding_inputs(&json!({"input": []}), 4).is_err());
        assert_eq!(
            embedding_inputs(&json!({"input": [1, 2]}), 4)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            embedding_inputs(&json!({"input": ["a", "b"]}), 4)
                .unwrap()
                .len(),
            2
        );
        assert!(embedding_inputs(&json!({"input": ["a", "b"]}), 1).is_err());
        assert_eq!(
            detokenize_ids(&json!({"tokens": [1, 2]}), 4).unwrap(),
            vec![1, 2]
        );
        assert!(detokenize_ids(&json!({"tokens": [-1]}), 4).is_err());
        assert_eq!(t_words(&[1, 22]), "t1 t22");
    }
}
