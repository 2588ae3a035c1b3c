//! `event::read` against the `Value` reading it replaces (the reference below is the
//! former `track` code), on hand-written cases and on random documents.

use super::*;
use proptest::prelude::*;
use serde_json::{json, Value};

fn reference(data: &[u8], delta: bool) -> Option<EventInfo> {
    let v: Value = serde_json::from_slice(data).ok()?;
    let error = v.get("error").is_some_and(|e| !e.is_null());
    let output_choices = match v.get("choices").and_then(Value::as_array) {
        None => 0,
        Some(choices) => choices
            .iter()
            .filter(|c| {
                let nonempty = |x: Option<&Value>| match x {
                    Some(Value::String(s)) => !s.is_empty(),
                    Some(Value::Array(a)) => !a.is_empty(),
                    _ => false,
                };
                let m = if delta {
                    c.get("delta")
                } else {
                    c.get("message")
                };
                nonempty(c.get("text"))
                    || m.is_some_and(|m| {
                        nonempty(m.get("content"))
                            || nonempty(m.get("reasoning_content"))
                            || nonempty(m.get("tool_calls"))
                    })
            })
            .count() as u32,
    };
    let usage = v
        .get("usage")
        .and_then(|u| u.get("completion_tokens"))
        .and_then(Value::as_u64)
        .map(|n| n.min(u64::from(u32::MAX)) as u32);
    Some(EventInfo {
        output_choices,
        usage,
        error,
    })
}

fn both(data: &str) -> Option<EventInfo> {
    for delta in [true, false] {
        assert_eq!(
            read(data.as_bytes(), delta),
            reference(data.as_bytes(), delta),
            "{data} (delta {delta})"
        );
    }
    read(data.as_bytes(), true)
}

#[test]
fn reads_what_the_lifecycle_needs() {
    let e = both(
        r#"{"id":"x","choices":[{"index":0,"text":"a"},{"text":""}],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#,
    );
    assert_eq!(
        e,
        Some(EventInfo {
            output_choices: 1,
            usage: Some(7),
            error: false
        })
    );
    let e = both(
        r#"{"choices":[{"delta":{"role":"assistant"}},{"delta":{"content":"c"}},{"delta":{"tool_calls":[{}]}}]}"#,
    );
    assert_eq!(e.map(|e| e.output_choices), Some(2));
    assert_eq!(
        both(r#"{"error":{"message":"x"}}"#).map(|e| e.error),
        Some(true)
    );
    assert_eq!(both(r#"{"error":null}"#).map(|e| e.error), Some(false));
    // Chat answers carry `message`, not `delta`.
    let d = br#"{"choices":[{"message":{"content":"hi"}}]}"#;
    assert_eq!(read(d, false).map(|e| e.output_choices), Some(1));
    assert_eq!(read(d, true).map(|e| e.output_choices), Some(0));
}

#[test]
fn odd_documents_read_as_a_value_reads_them() {
    for d in [
        "",
        "{",
        "[1]",
        "null",
        "\"s\"",
        "{} x",
        "{}  \n",
        r#"{"choices":"no"}"#,
        r#"{"choices":[1,"a",null,[],{"text":["x"]}]}"#,
        r#"{"choices":[{"text":"a"}],"choices":[]}"#,
        r#"{"usage":{"completion_tokens":-1}}"#,
        r#"{"usage":{"completion_tokens":-0}}"#,
        r#"{"usage":{"completion_tokens":5.0}}"#,
        r#"{"usage":{"completion_tokens":99999999999}}"#,
        r#"{"usage":{"completion_tokens":1e400}}"#,
        r#"{"usage":{"completion_tokens":3,"completion_tokens":null}}"#,
        r#"{"usage":[{"completion_tokens":3}]}"#,
        r#"{"choices":[{"delta":{"content":"a"},"delta":{}}]}"#,
        r#"{"choices":[{"delta":{"content":"\ud800"}}]}"#,
        r#"{"choices":[{"delta":{"content":"\u00e9\n"}}]}"#,
        r#"{"ch\u006fices":[{"text":"a"}]}"#,
        r#"{"error":false}"#,
    ] {
        both(d);
    }
    let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
    assert_eq!(both(&deep), None);
    // Invalid UTF-8 inside a string is refused as for a Value.
    let bad = b"{\"choices\":[{\"text\":\"\xff\"}]}";
    assert_eq!(read(bad, true), reference(bad, true));
}

fn doc() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("choices"),
        Just("usage"),
        Just("error"),
        Just("completion_tokens"),
        Just("text"),
        Just("delta"),
        Just("message"),
        Just("content"),
        Just("reasoning_content"),
        Just("tool_calls"),
        Just("x"),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..20).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-z]{0,3}".prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..5).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

proptest! {
    #[test]
    fn random_documents_read_as_a_value_reads_them(v in doc(), delta in any::<bool>()) {
        let text = serde_json::to_vec(&v).unwrap();
        prop_assert_eq!(read(&text, delta), reference(&text, delta));
    }

    #[test]
    fn random_bytes_read_as_a_value_reads_them(b in prop::collection::vec(any::<u8>(), 0..64)) {
        prop_assert_eq!(read(&b, true), reference(&b, true));
    }
}

#[test]
fn json_macro_documents() {
    let v = json!({"choices": [{"text": "t", "delta": {"content": ""}}], "usage": {"completion_tokens": 2}});
    let text = serde_json::to_vec(&v).unwrap();
    assert_eq!(
        read(&text, true),
        Some(EventInfo {
            output_choices: 1,
            usage: Some(2),
            error: false
        })
    );
}
