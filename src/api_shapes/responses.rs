//! OpenAI Responses requests → the chat completions request vLLM renders for them
//! (`construct_input_messages` and `construct_tool_dicts`, vLLM 0.33, without Harmony):
//!
//! - `instructions` (non-empty) is a system message first;
//! - `input` as a string is one user message; as a list of items: a message item with
//!   a `role` is taken as is (its `input_text` / `input_image` parts are rendered like
//!   chat content parts), an assistant message's first text becomes the assistant's
//!   content, `function_call` items become tool calls (merged into the assistant
//!   message before them), `reasoning` items the assistant's `reasoning`,
//!   `function_call_output` items `tool` messages; any other item is refused as vLLM
//!   refuses it ("Unsupported input item type");
//! - a final message or reasoning item whose `status` is `in_progress` / `incomplete`
//!   is continued (`continue_final_message`), as vLLM continues it;
//! - `tools`: function tools, as chat tools (`name`, `description`, `parameters`,
//!   `strict` when given); other tool types add nothing to the text.
//!
//! `previous_response_id` is kept for routing: the history it names lives on the
//! engine that stored it, and is rendered there (a router sees only the new turn).

use super::fields::{carry, model, opt_bool, opt_positive, opt_str, AgentRequest, Api, BadRequest};
use serde_json::{json, Map, Value};

/// Longest `previous_response_id` accepted (bytes).
pub const MAX_RESPONSE_ID: usize = 256;

pub(super) fn to_chat(body: &Value) -> Result<AgentRequest, BadRequest> {
    let model = model(body)?;
    let stream = opt_bool(body, "stream", false)?;
    let store = opt_bool(body, "store", true)?;
    let max_tokens = opt_positive(body, "max_output_tokens")?;
    let prev = opt_str(body, "previous_response_id")?;
    if prev.is_some_and(|p| p.is_empty() || p.len() > MAX_RESPONSE_ID) {
        return Err(BadRequest(format!(
            "previous_response_id must be 1..={MAX_RESPONSE_ID} bytes"
        )));
    }
    if prev.is_some()
        && body
            .get("previous_input_messages")
            .is_some_and(|v| !v.is_null())
    {
        return Err(BadRequest(
            "Only one of `previous_input_messages` and `previous_response_id` can be set.".into(),
        ));
    }
    let mut messages = Vec::new();
    if let Some(i) = opt_str(body, "instructions")?.filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    let mut cont = false;
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for it in items {
                item(it, &mut messages)?;
            }
            cont = items.last().is_some_and(continues);
        }
        _ => {
            return Err(BadRequest(
                "input must be a string or a list of items".into(),
            ))
        }
    }
    let mut chat = Map::new();
    chat.insert("model".into(), Value::String(model.clone()));
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = tools(body)? {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if cont {
        chat.insert("continue_final_message".into(), Value::Bool(true));
        chat.insert("add_generation_prompt".into(), Value::Bool(false));
    }
    carry(body, &mut chat)?;
    if let Some(n) = max_tokens {
        chat.insert("max_tokens".into(), json!(n));
    }
    Ok(AgentRequest {
        api: Api::Responses,
        model,
        stream,
        max_tokens,
        previous_response_id: prev.map(str::to_string),
        store,
        chat: Value::Object(chat),
    })
}

/// vLLM's `should_continue_final_message`.
fn continues(last: &Value) -> bool {
    let kind = last
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    matches!(kind, "message" | "reasoning")
        && matches!(
            last.get("status").and_then(Value::as_str),
            Some("in_progress" | "incomplete")
        )
}

fn is_assistant(m: Option<&mut Value>) -> Option<&mut Map<String, Value>> {
    m.and_then(Value::as_object_mut)
        .filter(|o| o.get("role").and_then(Value::as_str) == Some("assistant"))
}

/// One input item onto `out` (module docs).
fn item(it: &Value, out: &mut Vec<Value>) -> Result<(), BadRequest> {
    let o = it
        .as_object()
        .ok_or_else(|| BadRequest("each input item must be an object".into()))?;
    let kind = o.get("type").and_then(Value::as_str);
    let s = |k: &str| o.get(k).and_then(Value::as_str);
    match kind {
        Some("function_call") | Some("custom_tool_call") => {
            let call_id =
                s("call_id").ok_or_else(|| BadRequest("a function_call needs a call_id".into()))?;
            let mut name = s("name")
                .ok_or_else(|| BadRequest("a function_call needs a name".into()))?
                .to_string();
            if let Some(ns) = s("namespace").filter(|n| !n.is_empty()) {
                name = format!("{ns}.{name}");
            }
            let arguments = match kind {
                Some("function_call") => s("arguments").unwrap_or("").to_string(),
                _ => json!({"input": s("input").unwrap_or("")}).to_string(),
            };
            let call = json!({"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}});
            if let Some(prev) = is_assistant(out.last_mut()) {
                if let Some(Value::Array(calls)) = prev.get_mut("tool_calls") {
                    calls.push(call);
                    return Ok(());
                }
                if !prev.contains_key("tool_calls") {
                    prev.insert("tool_calls".into(), Value::Array(vec![call]));
                    return Ok(());
                }
            }
            out.push(json!({"role": "assistant", "tool_calls": [call]}));
        }
        Some("reasoning") => {
            if o.get("encrypted_content").is_some_and(|v| !v.is_null()) {
                return Err(BadRequest("Encrypted content is not supported.".into()));
            }
            let first = |k: &str| {
                o.get(k)
                    .and_then(Value::as_array)
                    .and_then(|a| a.first())
                    .and_then(|p| p.get("text"))
                    .and_then(Value::as_str)
            };
            let text = first("content").or_else(|| first("summary")).unwrap_or("");
            if let Some(prev) = is_assistant(out.last_mut()) {
                if prev.get("reasoning").is_none_or(Value::is_null) {
                    prev.insert("reasoning".into(), json!(text));
                    return Ok(());
                }
            }
            out.push(json!({"role": "assistant", "reasoning": text}));
        }
        Some("function_call_output") | Some("custom_tool_call_output") => {
            let output = match o.get("output") {
                Some(Value::String(t)) => Value::String(t.clone()),
                Some(Value::Array(parts)) => Value::Array(parts.clone()),
                _ => return Err(BadRequest("a function_call_output needs an output".into())),
            };
            out.push(json!({"role": "tool", "content": output,
                "tool_call_id": s("call_id").unwrap_or("")}));
        }
        _ if s("role") == Some("assistant") => {
            let text = match o.get("content") {
                Some(Value::String(t)) => Some(t.as_str()),
                Some(Value::Array(parts)) => parts
                    .first()
                    .and_then(|p| p.get("text"))
                    .and_then(Value::as_str),
                _ => None,
            };
            if let Some(text) = text {
                if let Some(prev) = is_assistant(out.last_mut()) {
                    if prev.get("content").is_none_or(Value::is_null) {
                        prev.insert("content".into(), json!(text));
                        return Ok(());
                    }
                }
                out.push(json!({"role": "assistant", "content": text}));
            } else {
                out.push(it.clone());
            }
        }
        _ if o.get("role").is_some_and(Value::is_string) => out.push(it.clone()),
        _ => {
            return Err(BadRequest(format!(
                "Unsupported input item type: {}",
                kind.unwrap_or("(none)")
            )))
        }
    }
    Ok(())
}

/// Function tools as chat tools (module docs); None when absent or empty.
fn tools(body: &Value) -> Result<Option<Vec<Value>>, BadRequest> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(l)) if l.is_empty() => return Ok(None),
        Some(Value::Array(l)) => l,
        Some(_) => return Err(BadRequest("tools must be a list".into())),
    };
    let mut out = Vec::new();
    for t in list {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            continue;
        }
        let name = match t.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(BadRequest("each function tool needs a string name".into())),
        };
        let mut f = Map::new();
        f.insert("name".into(), Value::String(name));
        f.insert(
            "description".into(),
            opt_str(t, "description")?.map_or(Value::Null, |d| Value::String(d.into())),
        );
        let params = match t.get("parameters") {
            None | Some(Value::Null) => Value::Null,
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(BadRequest("a tool's parameters must be an object".into())),
        };
        f.insert("parameters".into(), params);
        if let Some(Value::Bool(b)) = t.get("strict") {
            f.insert("strict".into(), Value::Bool(*b));
        }
        out.push(json!({"type": "function", "function": Value::Object(f)}));
    }
    Ok((!out.is_empty()).then_some(out))
}
