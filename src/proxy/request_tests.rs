//! Property tests: a client body read in place (`request`, `strip`, `prompt`,
//! `tokenize::given`) answers exactly what the same body parsed as a `serde_json::Value`
//! answers (the reference implementations below are the tree versions they replaced),
//! on generated bodies: the members kvroute reads, with values of every JSON type,
//! repeated members, escapes and whitespace.

use super::prompt;
use super::request::{self, Body, Endpoint};
use super::strip;
use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const KEYS: [&str; 12] = [
    "model",
    "stream",
    "max_tokens",
    "max_completion_tokens",
    "prompt",
    "add_special_tokens",
    "cache_salt",
    "kv_transfer_params",
    "bootstrap_room",
    "vllm_xargs",
    "x\\u0079",
    "messages",
];

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        (0u64..70).prop_map(|n| n.to_string()),
        Just("4294967296".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-0".to_string()),
        Just("-3".to_string()),
        Just("2.0".to_string()),
        Just("1e2".to_string()),
        Just("\"t1 t2\"".to_string()),
        Just("\"a\\\"b\\u00e9\"".to_string()),
        Just("\"\"".to_string()),
    ]
}

/// A JSON value as text, nested a few levels, with random spacing.
fn value() -> impl Strategy<Value = String> {
    scalar().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            (prop::collection::vec(inner.clone(), 0..6), any::<bool>())
                .prop_map(|(v, sp)| format!("[{}]", v.join(if sp { " , " } else { "," }))),
            prop::collection::vec((prop::sample::select(KEYS.to_vec()), inner), 0..4).prop_map(
                |v| {
                    let m: Vec<String> = v.iter().map(|(k, x)| format!("\"{k}\": {x}")).collect();
                    format!("{{{}}}", m.join(","))
                }
            ),
        ]
    })
}

/// A body: an object of known and unknown members (repeats allowed).
fn body() -> impl Strategy<Value = String> {
    (
        prop::collection::vec((prop::sample::select(KEYS.to_vec()), value()), 0..7),
        any::<bool>(),
    )
        .prop_map(|(m, sp)| {
            let m: Vec<String> = m.iter().map(|(k, x)| format!("\"{k}\":{x}")).collect();
            if sp {
                format!(" {{\n {} \n}} ", m.join(" ,\n "))
            } else {
                format!("{{{}}}", m.join(","))
            }
        })
}

/// The tree version of `request::parse`.
fn tree_parse(bytes: &[u8]) -> Result<(String, bool, Option<u32>), ()> {
    let body: Value = serde_json::from_slice(bytes).map_err(|_| ())?;
    let obj = body.as_object().ok_or(())?;
    let model = match obj.get("model") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(()),
    };
    if model.len() > 256 {
        return Err(());
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(()),
    };
    let max_tokens = ["max_tokens", "max_completion_tokens"]
        .iter()
        .filter_map(|k| obj.get(*k))
        .find_map(Value::as_u64)
        .map(|n| n.min(u64::from(u32::MAX)) as u32);
    Ok((model, stream, max_tokens))
}

/// The tree version of `Body::strip` (the body after it, labels).
fn tree_strip(v: &Value) -> (Value, Vec<&'static str>) {
    let mut v = v.clone();
    let mut out = Vec::new();
    let obj = v.as_object_mut().unwrap();
    for (i, (name, _)) in strip::TOP.iter().enumerate() {
        if obj.shift_remove(*name).is_some() {
            out.push(strip::FIELDS[i]);
        }
    }
    if let Some(Value::Object(x)) = obj.get_mut("vllm_xargs") {
        for (i, name) in strip::XARGS.iter().enumerate() {
            if x.shift_remove(*name).is_some() {
                out.push(strip::FIELDS[strip::TOP.len() + i]);
            }
        }
    }
    (v, out)
}

/// Whether the body or its `vllm_xargs` repeats a key (a tree keeps the last only).
fn repeats(text: &str, tree: &Value) -> bool {
    let count = |t: &[u8]| {
        let mut n = 0usize;
        let _ = super::members::object(t, |_, _| n += 1);
        n
    };
    let mut xargs = false;
    let _ = super::members::object(text.as_bytes(), |k, r| {
        if k == "vllm_xargs" {
            let t = &text.as_bytes()[r];
            let v: Value = serde_json::from_slice(t).unwrap_or(Value::Null);
            xargs |= v.as_object().is_some_and(|o| o.len() != count(t));
        }
    });
    xargs
        || tree
            .as_object()
            .is_some_and(|o| o.len() != count(text.as_bytes()))
}

/// The tree version of `prompt::token_ids`.
fn tree_token_ids(body: &Value) -> Result<Option<Vec<u32>>, ()> {
    let Some(Value::Array(items)) = body.get("prompt") else {
        return Ok(None);
    };
    let first = match items.first() {
        None => return Err(()),
        Some(Value::Array(inner)) => inner,
        Some(Value::Number(_)) => items,
        Some(_) => return Ok(None),
    };
    first
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or(()))
        .collect::<Result<Vec<u32>, _>>()
        .map(Some)
}

fn tokenizers() -> &'static crate::tokenize::Tokenizers {
    static T: std::sync::OnceLock<crate::tokenize::Tokenizers> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        crate::tokenize::testing::in_memory("m", 64)
            .expect("test tokenizer")
            .with_max_prompt_tokens(5)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_body_read_in_place_answers_as_its_tree(text in body()) {
        let tree: Value = serde_json::from_str(&text).expect("generated JSON");
        let got = request::parse(text.as_bytes());
        let want = tree_parse(text.as_bytes());
        match (&got, &want) {
            (Ok(c), Ok(w)) => prop_assert_eq!((&c.model, c.stream, c.max_tokens), (&w.0, w.1, w.2)),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "{text}: {got:?} vs {want:?}"),
        }
        let body = Body::parse(Bytes::from(text.clone())).unwrap();

        // strip: the bytes left parse to the tree's result.
        let mut stripped = body.clone();
        let labels = stripped.strip();
        let after: Value = serde_json::from_slice(stripped.bytes()).expect("stripped JSON");
        let (want_v, want_labels) = tree_strip(&tree);
        prop_assert_eq!(&after, &want_v, "{}", text);
        if !repeats(&text, &tree) {
            prop_assert_eq!(labels, want_labels, "{}", text);
        }

        // Token ids without a tokenizer.
        let ids = prompt::token_ids(Endpoint::Completions, "m", &body).map_err(|_| ());
        prop_assert_eq!(ids, tree_token_ids(&tree), "{}", text);

        // Through a tokenizer (small prompt limit): same ids, same errors.
        let t = tokenizers();
        for model in ["m", "other"] {
            let got = prompt::prompt_tokens(Some(t), Endpoint::Completions, model, &body)
                .map_err(|e| e.0);
            let want = t
                .prompt_tokens(crate::tokenize::Endpoint::Completions, model, &tree)
                .map_err(|e| e.0);
            prop_assert_eq!(got, want, "{}", text);
        }
        prop_assert_eq!(prompt::cache_salt(&body), match tree.get("cache_salt") {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            _ => None,
        });
    }
}

#[test]
fn chat_members_reach_the_template() {
    let t = tokenizers();
    let v = json!({"model": "m", "messages": [{"role": "user", "content": "t1 t2"}],
                   "temperature": 0.5, "add_generation_prompt": false});
    let body = Body::parse(Bytes::from(v.to_string())).unwrap();
    let got = prompt::prompt_tokens(Some(t), Endpoint::Chat, "m", &body);
    let want = t.prompt_tokens(crate::tokenize::Endpoint::Chat, "m", &v);
    assert_eq!(got.map_err(|e| e.0), want.map_err(|e| e.0));
    let mut m = Map::new();
    m.insert("messages".into(), v["messages"].clone());
    m.insert("add_generation_prompt".into(), json!(false));
    assert_eq!(body.subset(&prompt::CHAT).unwrap(), Value::Object(m));
}
