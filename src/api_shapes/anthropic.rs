//! Anthropic Messages requests → the chat completions request vLLM renders for them
//! (`AnthropicServingMessages.to_chat_completion_request`, vLLM 0.33):
//!
//! - `system` (a string, or text blocks concatenated without separator) is the first
//!   message; text blocks starting with `x-anthropic-billing-header` are dropped (Claude
//!   Code's per-request header would defeat prefix caching). A `system` message inside
//!   `messages` stays in place, or — when the model's template needs system first — is
//!   merged into the leading one.
//! - Content blocks: `text` (non-empty) → text parts, one text part alone becoming a
//!   string; `image` → an `image_url` part (a `data:` URI for base64 sources);
//!   `thinking` → the message's `reasoning`; `tool_use` → an OpenAI tool call (its
//!   `input` as JSON arguments); `tool_result` in a user turn → a `tool` message (text
//!   parts joined by "\n") placed before the user's own message, images following in a
//!   user message of their own; `redacted_thinking`, `tool_reference`,
//!   `tool_addition` and `tool_removal` add nothing to the text.
//! - A user turn left without content is dropped; an assistant turn is kept.
//! - `tools` → OpenAI function tools as vLLM dumps them for the template (`name`,
//!   `description` (null when absent), `parameters` (the `input_schema`, `type:
//!   object` added when missing), then `strict` / `defer_loading` when given).
//!
//! Not reproduced (they change no routed text, or not deterministically): `thinking`
//! and `output_config.effort` (a reasoning effort for templates that read one), and a
//! `tool_use` without `id` (vLLM names it after the clock).

use super::fields::{carry, model, opt_bool, opt_positive, opt_str, AgentRequest, Api, BadRequest};
use serde_json::{json, Map, Value};

const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The block types vLLM accepts.
const BLOCK_TYPES: [&str; 9] = [
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
];

pub(super) fn to_chat(body: &Value, merge_inline_system: bool) -> Result<AgentRequest, BadRequest> {
    let model = model(body)?;
    let max_tokens = opt_positive(body, "max_tokens")?
        .ok_or_else(|| BadRequest("max_tokens is required (a positive integer)".into()))?;
    let stream = opt_bool(body, "stream", false)?;
    let messages = match body.get("messages") {
        Some(Value::Array(m)) => m,
        _ => return Err(BadRequest("messages must be a list".into())),
    };
    for m in messages {
        check_message(m)?;
    }
    let mut out: Vec<Value> = Vec::new();
    let mut system = String::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => system.push_str(s),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                check_block(b)?;
                if let Some(t) = system_text_block(b) {
                    system.push_str(t);
                }
            }
        }
        Some(_) => {
            return Err(BadRequest(
                "system must be a string or a list of blocks".into(),
            ))
        }
    }
    if merge_inline_system {
        for m in messages.iter().filter(|m| role(m) == "system") {
            if let Some(t) = system_text(m) {
                system.push_str(&t);
            }
        }
    }
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for m in messages {
        convert_message(m, merge_inline_system, &mut out)?;
    }
    let mut chat = Map::new();
    chat.insert("model".into(), Value::String(model.clone()));
    chat.insert("messages".into(), Value::Array(out));
    chat.insert("max_tokens".into(), json!(max_tokens));
    if let Some(tools) = tools(body)? {
        chat.insert("tools".into(), Value::Array(tools));
    }
    carry(body, &mut chat)?;
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
    }
    Ok(AgentRequest {
        api: Api::Messages,
        model,
        stream,
        max_tokens: Some(max_tokens),
        previous_response_id: None,
        store: false,
        chat: Value::Object(chat),
    })
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or("")
}

fn check_message(m: &Value) -> Result<(), BadRequest> {
    if !m.is_object() {
        return Err(BadRequest("each message must be an object".into()));
    }
    if !matches!(role(m), "user" | "assistant" | "system") {
        return Err(BadRequest(
            "each message's role must be user, assistant or system".into(),
        ));
    }
    match m.get("content") {
        Some(Value::String(_)) => Ok(()),
        Some(Value::Array(blocks)) => blocks.iter().try_for_each(check_block),
        _ => Err(BadRequest(
            "each message's content must be a string or a list of blocks".into(),
        )),
    }
}

fn check_block(b: &Value) -> Result<(), BadRequest> {
    let kind = b
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| BadRequest("each content block needs a string type".into()))?;
    if !BLOCK_TYPES.contains(&kind) {
        return Err(BadRequest(format!("unknown content block type {kind:?}")));
    }
    for key in ["text", "id", "tool_use_id", "name", "thinking"] {
        opt_str(b, key)?;
    }
    match b.get("input") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => return Err(BadRequest("a tool_use input must be an object".into())),
    }
    match b.get("source") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => return Err(BadRequest("an image source must be an object".into())),
    }
    match b.get("content") {
        None | Some(Value::Null) | Some(Value::String(_)) | Some(Value::Array(_)) => Ok(()),
        Some(_) => Err(BadRequest(
            "a tool_result content must be a string or a list".into(),
        )),
    }
}

/// A system text block's text, unless empty or the billing header.
fn system_text_block(b: &Value) -> Option<&str> {
    if b.get("type").and_then(Value::as_str) != Some("text") {
        return None;
    }
    let t = b.get("text").and_then(Value::as_str)?;
    (!t.is_empty() && !t.starts_with(BILLING_HEADER)).then_some(t)
}

/// The text of a `system` message in `messages` (None: nothing to emit).
fn system_text(m: &Value) -> Option<String> {
    match m.get("content") {
        Some(Value::String(s)) if s.starts_with(BILLING_HEADER) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(blocks)) => {
            let parts: Vec<&str> = blocks.iter().filter_map(system_text_block).collect();
            (!parts.is_empty()).then(|| parts.concat())
        }
        _ => None,
    }
}

fn convert_message(m: &Value, merge: bool, out: &mut Vec<Value>) -> Result<(), BadRequest> {
    let role = role(m);
    if role == "system" {
        if !merge {
            if let Some(t) = system_text(m).filter(|t| !t.is_empty()) {
                out.push(json!({"role": "system", "content": t}));
            }
        }
        return Ok(());
    }
    let mut msg = Map::new();
    msg.insert("role".into(), Value::String(role.to_string()));
    match m.get("content") {
        Some(Value::String(s)) => {
            msg.insert("content".into(), Value::String(s.clone()));
        }
        Some(Value::Array(blocks)) => {
            let mut parts: Vec<Value> = Vec::new();
            let mut calls: Vec<Value> = Vec::new();
            let mut reasoning = String::new();
            let mut any_reasoning = false;
            for b in blocks {
                match b.get("type").and_then(Value::as_str).unwrap_or("") {
                    "text" => {
                        if let Some(t) = b.get("text").and_then(Value::as_str) {
                            if !t.is_empty() {
                                parts.push(json!({"type": "text", "text": t}));
                            }
                        }
                    }
                    "image" => {
                        if let Some(src) = b.get("source").filter(|s| s.is_object()) {
                            parts.push(image_part(src));
                        }
                    }
                    "thinking" => {
                        if let Some(t) = b.get("thinking").and_then(Value::as_str) {
                            reasoning.push_str(t);
                            any_reasoning = true;
                        }
                    }
                    "tool_use" => calls.push(tool_call(b)),
                    "tool_result" if role == "user" => user_tool_result(b, out),
                    "tool_result" => {
                        let text = match b.get("content") {
                            Some(Value::String(s)) if !s.is_empty() => s.clone(),
                            Some(Value::Array(a)) if !a.is_empty() => {
                                Value::Array(a.clone()).to_string()
                            }
                            _ => String::new(),
                        };
                        parts.push(json!({"type": "text", "text": format!("Tool result: {text}")}));
                    }
                    _ => {}
                }
            }
            if any_reasoning {
                msg.insert("reasoning".into(), Value::String(reasoning));
            }
            if !calls.is_empty() {
                msg.insert("tool_calls".into(), Value::Array(calls));
            }
            if parts.len() == 1 && parts[0]["type"] == "text" {
                let t = parts[0]["text"].clone();
                msg.insert("content".into(), t);
            } else if !parts.is_empty() {
                msg.insert("content".into(), Value::Array(parts));
            }
        }
        _ => {
            return Err(BadRequest(
                "message content must be a string or a list".into(),
            ))
        }
    }
    if role != "user" || msg.contains_key("content") {
        out.push(Value::Object(msg));
    }
    Ok(())
}

/// An Anthropic image source as an OpenAI image URL (`data:` URI unless a `url` source).
fn image_url(src: &Value) -> String {
    let s = |k: &str| src.get(k).and_then(Value::as_str);
    if s("type") == Some("url") {
        return s("url").unwrap_or("").to_string();
    }
    format!(
        "data:{};base64,{}",
        s("media_type").unwrap_or("image/jpeg"),
        s("data").unwrap_or("")
    )
}

fn image_part(src: &Value) -> Value {
    json!({"type": "image_url", "image_url": {"url": image_url(src)}})
}

fn tool_call(b: &Value) -> Value {
    let input = b
        .get("input")
        .filter(|v| v.is_object())
        .cloned()
        .unwrap_or(json!({}));
    json!({
        "id": b.get("id").and_then(Value::as_str).unwrap_or("call_0"),
        "type": "function",
        "function": {
            "name": b.get("name").and_then(Value::as_str).unwrap_or(""),
            "arguments": input.to_string(),
        },
    })
}

/// A user turn's `tool_result`: a `tool` message, then a user message of its images.
fn user_tool_result(b: &Value, out: &mut Vec<Value>) {
    let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
    let mut images = Vec::new();
    let text = match b.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let mut texts: Vec<&str> = Vec::new();
            for it in items {
                match it.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        texts.push(it.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("image") => {
                        let url = image_url(it.get("source").unwrap_or(&Value::Null));
                        if !url.is_empty() {
                            images.push(json!({"type": "image_url", "image_url": {"url": url}}));
                        }
                    }
                    _ => {}
                }
            }
            texts.join("\n")
        }
        _ => String::new(),
    };
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if !images.is_empty() {
        out.push(json!({"role": "user", "content": images}));
    }
}

/// `tools` as the template sees them (module docs); None when absent.
fn tools(body: &Value) -> Result<Option<Vec<Value>>, BadRequest> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(l)) => l,
        Some(_) => return Err(BadRequest("tools must be a list".into())),
    };
    let mut out = Vec::with_capacity(list.len());
    for t in list {
        let name = match t.get("name") {
            Some(Value::String(n)) => n,
            _ => return Err(BadRequest("each tool needs a string name".into())),
        };
        let mut schema = match t.get("input_schema") {
            Some(Value::Object(o)) => o.clone(),
            _ => {
                return Err(BadRequest(
                    "each tool's input_schema must be an object".into(),
                ))
            }
        };
        if !schema.contains_key("type") {
            schema.insert("type".into(), json!("object"));
        }
        let mut f = Map::new();
        f.insert("name".into(), Value::String(name.clone()));
        f.insert(
            "description".into(),
            opt_str(t, "description")?.map_or(Value::Null, |d| Value::String(d.into())),
        );
        f.insert("parameters".into(), Value::Object(schema));
        for key in ["strict", "defer_loading"] {
            match t.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::Bool(b)) => {
                    f.insert(key.into(), Value::Bool(*b));
                }
                Some(_) => return Err(BadRequest(format!("tool {key} must be a boolean"))),
            }
        }
        out.push(json!({"type": "function", "function": Value::Object(f)}));
    }
    Ok(Some(out))
}
