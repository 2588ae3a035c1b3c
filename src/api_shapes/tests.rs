use super::*;
use serde_json::json;

fn chat(api: Api, body: Value, merge: bool) -> Value {
    from_value(api, &body, 1 << 20, merge).unwrap().chat
}

#[test]
fn anthropic_system_messages_tools_and_results_become_chat() {
    let body = json!({
        "model": "m", "max_tokens": 8, "stream": true,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"},
                   {"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}],
        "messages": [
            {"role": "user", "content": "t1 t2"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "tu_1", "name": "ls", "input": {"path": "/", "all": true}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "tu_1", "content": [
                    {"type": "text", "text": "a"}, {"type": "text", "text": "b"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QQ=="}}]},
                {"type": "text", "text": "go on"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_2", "content": "ok"}]},
        ],
        "tools": [{"name": "ls", "input_schema": {"properties": {}}, "strict": true}],
        "cache_salt": "s1",
    });
    let c = chat(Api::Messages, body, false);
    assert_eq!(
        c["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "t1 t2"},
            {"role": "assistant", "reasoning": "hmm", "content": "calling", "tool_calls": [
                {"id": "tu_1", "type": "function",
                 "function": {"name": "ls", "arguments": "{\"path\":\"/\",\"all\":true}"}}]},
            {"role": "tool", "tool_call_id": "tu_1", "content": "a\nb"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,QQ=="}}]},
            {"role": "user", "content": "go on"},
            {"role": "tool", "tool_call_id": "tu_2", "content": "ok"},
        ])
    );
    assert_eq!(
        c["tools"],
        json!([{"type": "function", "function": {"name": "ls", "description": null,
            "parameters": {"properties": {}, "type": "object"}, "strict": true}}])
    );
    assert_eq!(
        (c["cache_salt"].as_str(), c["stream"].as_bool()),
        (Some("s1"), Some(true))
    );
}

#[test]
fn anthropic_inline_system_stays_or_merges_first() {
    let body = json!({"model": "m", "max_tokens": 1, "system": "A.",
        "messages": [{"role": "user", "content": "u"},
                     {"role": "system", "content": [{"type": "text", "text": "B."}]},
                     {"role": "user", "content": "v"}]});
    let kept = chat(Api::Messages, body.clone(), false);
    assert_eq!(
        kept["messages"][2],
        json!({"role": "system", "content": "B."})
    );
    let merged = chat(Api::Messages, body, true);
    assert_eq!(
        merged["messages"][0],
        json!({"role": "system", "content": "A.B."})
    );
    assert_eq!(merged["messages"].as_array().unwrap().len(), 3);
}

#[test]
fn anthropic_bad_bodies_are_refused() {
    let ok = json!({"model": "m", "max_tokens": 1, "messages": []});
    assert!(from_value(Api::Messages, &ok, 100, false).is_ok());
    for (k, v) in [
        ("model", json!("")),
        ("max_tokens", json!(0)),
        ("max_tokens", json!("3")),
        ("messages", json!({})),
        ("messages", json!([{"role": "tool", "content": "x"}])),
        ("messages", json!([{"role": "user", "content": 3}])),
        (
            "messages",
            json!([{"role": "user", "content": [{"type": "video"}]}]),
        ),
        (
            "messages",
            json!([{"role": "user", "content": [{"type": "tool_use", "input": []}]}]),
        ),
        ("system", json!(7)),
        ("tools", json!([{"name": "x"}])),
        ("stream", json!("yes")),
    ] {
        let mut b = ok.clone();
        b[k] = v.clone();
        assert!(
            from_value(Api::Messages, &b, 100, false).is_err(),
            "{k}: {v}"
        );
    }
    let mut b = ok.clone();
    b["messages"] = json!([{"role": "user", "content": "x".repeat(200)}]);
    assert!(from_value(Api::Messages, &b, 100, false).is_err());
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let v: Value = serde_json::from_str(&format!(
        r#"{{"model":"m","max_tokens":1,"messages":[],"x":{deep}}}"#
    ))
    .unwrap();
    assert!(from_value(Api::Messages, &v, 1000, false).is_err());
    assert!(parse(Api::Messages, b"[1]", 100, false).is_err());
    assert!(parse(Api::Messages, b"{", 100, false).is_err());
}

#[test]
fn responses_input_items_become_chat() {
    let body = json!({
        "model": "m", "instructions": "Be brief.", "stream": true, "max_output_tokens": 9,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "t1"}]},
            {"type": "reasoning", "id": "rs", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}", "namespace": "ns"},
            {"type": "function_call_output", "call_id": "c1", "output": "r1"},
            {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
             "content": [{"type": "output_text", "text": "done"}]},
            {"role": "user", "content": "more"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                  {"type": "web_search_preview"}],
    });
    let r = from_value(Api::Responses, &body, 1 << 20, false).unwrap();
    assert_eq!((r.stream, r.max_tokens, r.store), (true, Some(9), true));
    assert_eq!(
        r.chat["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "t1"}]},
            {"role": "assistant", "reasoning": "think", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
                {"id": "c2", "type": "function", "function": {"name": "ns.g", "arguments": "{}"}}]},
            {"role": "tool", "content": "r1", "tool_call_id": "c1"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "more"},
        ])
    );
    assert_eq!(
        r.chat["tools"],
        json!([{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}}}])
    );
    let s = from_value(
        Api::Responses,
        &json!({"model": "m", "input": "hi", "previous_response_id": "resp_1", "store": false}),
        100,
        false,
    )
    .unwrap();
    assert_eq!(
        s.chat["messages"],
        json!([{"role": "user", "content": "hi"}])
    );
    assert_eq!(
        (s.previous_response_id.as_deref(), s.store),
        (Some("resp_1"), false)
    );
}

#[test]
fn responses_partial_final_message_is_continued_and_bad_items_refused() {
    let body = json!({"model": "m", "input": [{"role": "user", "content": "q"},
        {"type": "message", "role": "assistant", "status": "incomplete", "content": [{"type": "output_text", "text": "The answer is"}]}]});
    let c = chat(Api::Responses, body, false);
    assert_eq!(c["continue_final_message"], true);
    assert_eq!(c["add_generation_prompt"], false);
    for bad in [
        json!({"model": "m"}),
        json!({"model": "m", "input": 3}),
        json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}),
        json!({"model": "m", "input": [{"type": "reasoning", "encrypted_content": "zz"}]}),
        json!({"model": "m", "input": "x", "previous_response_id": ""}),
        json!({"model": "m", "input": "x", "previous_response_id": "r", "previous_input_messages": []}),
        json!({"model": "m", "input": "x", "max_output_tokens": -1}),
        json!({"input": "x"}),
    ] {
        assert!(
            from_value(Api::Responses, &bad, 100, false).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn both_apis_tokenize_like_the_chat_they_render() {
    let dir = tempfile_dir();
    crate::tokenize::testing::write_dir(&dir, 64).unwrap();
    let tok = crate::tokenize::Tokenizers::load(&[("m".into(), dir.clone())]).unwrap();
    let chat_body = json!({"model": "m", "messages": [
        {"role": "system", "content": "t1 t2"}, {"role": "user", "content": "t3 t4"}]});
    let want = tok
        .prompt_tokens(crate::tokenize::Endpoint::Chat, "m", &chat_body)
        .unwrap()
        .unwrap();
    let a = json!({"model": "m", "max_tokens": 4, "system": "t1 t2",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "t3 t4"}]}]});
    let (req, ids) = prompt_tokens(&tok, Api::Messages, &a).unwrap();
    assert_eq!((req.model.as_str(), ids.as_ref()), ("m", Some(&want)));
    let r = json!({"model": "m", "instructions": "t1 t2", "input": "t3 t4"});
    assert_eq!(
        prompt_tokens(&tok, Api::Responses, &r).unwrap().1,
        Some(want)
    );
    // The test template accepts a system message anywhere: nothing is merged.
    assert!(!tok.system_first("m"));
    assert!(tok.system_first("unknown"));
    let other = json!({"model": "other", "input": "t1"});
    assert_eq!(prompt_tokens(&tok, Api::Responses, &other).unwrap().1, None);
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "kvroute-api-shapes-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn a_template_refusing_late_system_messages_is_system_first() {
    use crate::tokenize::chat::ChatTemplates;
    let strict = "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}\
        {{ raise_exception('System message must be at the beginning.') }}{% endif %}\
        {{ m['content'] }}{% endfor %}";
    let t = ChatTemplates::from_config(&json!({"chat_template": strict}), None)
        .unwrap()
        .unwrap();
    assert!(t.system_first());
    let lax = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    let t = ChatTemplates::from_config(&json!({"chat_template": lax}), None)
        .unwrap()
        .unwrap();
    assert!(!t.system_first());
}
