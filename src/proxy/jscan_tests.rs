//! `jscan` against `event::read` (its reference): the same answer for every document
//! serde_json accepts, fed whole, byte by byte or split anywhere, and the same
//! refusals for broken ones.

use super::*;
use crate::proxy::event;
use proptest::prelude::*;

fn scan(doc: &[u8], delta: bool, splits: &[usize]) -> Option<EventInfo> {
    let mut s = Scan::new(delta);
    let mut at = 0;
    for &p in splits {
        let p = p.clamp(at, doc.len());
        s.feed(&doc[at..p]);
        at = p;
    }
    s.feed(&doc[at..]);
    s.finish()
}

fn same(doc: &[u8]) {
    for delta in [false, true] {
        let want = event::read(doc, delta);
        assert_eq!(
            scan(doc, delta, &[]),
            want,
            "whole, delta {delta}: {}",
            String::from_utf8_lossy(doc)
        );
        let mut s = Scan::new(delta);
        for b in doc {
            s.feed(std::slice::from_ref(b));
        }
        assert_eq!(
            s.finish(),
            want,
            "byte by byte: {}",
            String::from_utf8_lossy(doc)
        );
    }
}

#[test]
fn answers_like_event_read_on_known_documents() {
    let docs: &[&str] = &[
        r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":5}}"#,
        r#"{"choices":[{"delta":{"content":"hi"}},{"text":""},{"text":"x"}]}"#,
        r#"{"choices":[{"message":{"content":"","reasoning_content":"r"}}]}"#,
        r#"{"choices":[{"message":{"tool_calls":[]}},{"message":{"tool_calls":[{}]}}]}"#,
        r#"{"choices":[{"message":{"content":"a","content":""}}]}"#,
        r#"{"choices":[{"text":"a"}],"choices":[]}"#,
        r#"{"choices":{"text":"a"}}"#,
        r#"{"usage":{"completion_tokens":7},"usage":{"prompt_tokens":1}}"#,
        r#"{"usage":{"completion_tokens":-1}}"#,
        r#"{"usage":{"completion_tokens":1.0}}"#,
        r#"{"usage":{"completion_tokens":1e2}}"#,
        r#"{"usage":{"completion_tokens":-0}}"#,
        r#"{"usage":{"completion_tokens":18446744073709551615}}"#,
        r#"{"usage":{"completion_tokens":18446744073709551616}}"#,
        r#"{"usage":{"completion_tokens":99999999999}}"#,
        r#"{"usage":[{"completion_tokens":3}]}"#,
        r#"{"error":null}"#,
        r#"{"error":{"message":"x"}}"#,
        r#"{"error":[]}"#,
        r#"{"error":0}"#,
        r#"{"us\u0061ge":{"completion_tokens":2},"\u0063hoices":[{"te\u0078t":"\n"}]}"#,
        r#"{"x":{"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}}"#,
        r#"[{"choices":[{"text":"a"}]}]"#,
        r#""s""#,
        "12",
        " 0 ",
        "-1.5e-3",
        "null",
        " {\"a\" : [ 1 , true , false , null , \"\\u00e9\\ud83d\\ude00\" ] } \n",
        "{\"t\":\"\u{e9}\u{1f600}\u{800}\u{ffff}\"}",
        // Refused by both.
        "",
        "{",
        "{}}",
        "{} x",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{1:2}",
        "01",
        "-",
        "1.",
        ".5",
        "1e",
        "+1",
        "tru",
        "nul",
        "truex",
        "[1 2]",
        "\"\\x\"",
        "\"\\u12G4\"",
        "\"\\ud800\"",
        "\"\\ud800\\u0041\"",
        "\"\\udc00\"",
        "\"a\u{1}\"",
        "\"abc",
        "[}",
        "{]",
    ];
    for d in docs {
        same(d.as_bytes());
    }
    // Invalid UTF-8 inside strings, and raw bytes outside them.
    for bad in [
        &b"\"\xff\""[..],
        b"\"\xc0\x80\"",
        b"\"\xe0\x80\x80\"",
        b"\"\xed\xa0\x80\"",
        b"\"\xf4\x90\x80\x80\"",
        b"\"\xc3\"",
        b"\xc3\xa9",
    ] {
        same(bad);
    }
}

#[test]
fn nesting_stops_where_serde_json_stops() {
    for n in [126, 127, 128, 200] {
        let doc = format!("{}{}", "[".repeat(n), "]".repeat(n));
        same(doc.as_bytes());
        let doc = format!(
            "{{\"choices\":[{}1{}]}}",
            "{\"a\":".repeat(n),
            "}".repeat(n)
        );
        same(doc.as_bytes());
    }
}

#[test]
fn state_stays_small() {
    assert!(
        std::mem::size_of::<Scan>() <= 160,
        "{}",
        std::mem::size_of::<Scan>()
    );
}

/// JSON text with repeated keys allowed (a `Value` map cannot hold them).
#[derive(Clone, Debug)]
enum Doc {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Doc>),
    Obj(Vec<(String, Doc)>),
}

impl Doc {
    fn write(&self, out: &mut String, pretty: bool) {
        let ws = if pretty { " \n" } else { "" };
        match self {
            Doc::Null => out.push_str("null"),
            Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Doc::Num(n) => out.push_str(n),
            Doc::Str(s) => out.push_str(&serde_json::to_string(s).unwrap()),
            Doc::Arr(items) => {
                out.push('[');
                for (i, d) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(ws);
                    d.write(out, pretty);
                }
                out.push(']');
            }
            Doc::Obj(members) => {
                out.push('{');
                for (i, (k, d)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(ws);
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push(':');
                    out.push_str(ws);
                    d.write(out, pretty);
                }
                out.push('}');
            }
        }
    }
}

const KEYS: [&str; 12] = [
    "choices",
    "usage",
    "error",
    "text",
    "message",
    "delta",
    "content",
    "reasoning_content",
    "tool_calls",
    "completion_tokens",
    "x",
    "wörd",
];

fn leaf() -> impl Strategy<Value = Doc> {
    prop_oneof![
        Just(Doc::Null),
        any::<bool>().prop_map(Doc::Bool),
        prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            (0u32..100).prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            Just("-0".to_string()),
            Just("18446744073709551616".to_string()),
            (-1e6f64..1e6).prop_map(|f| format!("{f}")),
            (0u32..50, -20i32..20).prop_map(|(m, e)| format!("{m}e{e}")),
        ]
        .prop_map(Doc::Num),
        prop_oneof![
            Just(String::new()),
            "[a-z]{1,4}",
            "\\PC{0,6}",
            Just("\u{1f600}\"\\\n\u{7}".to_string()),
        ]
        .prop_map(Doc::Str),
    ]
}

fn doc() -> impl Strategy<Value = Doc> {
    leaf().prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Doc::Arr),
            prop::collection::vec(
                (
                    prop::sample::select(KEYS.to_vec()).prop_map(String::from),
                    inner
                ),
                0..6
            )
            .prop_map(Doc::Obj),
        ]
    })
}

/// Whether serde_json refuses `doc` for a number beyond f64's range.
fn out_of_range(doc: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(doc)
        .is_err_and(|e| e.to_string().contains("number out of range"))
}

#[test]
fn a_number_beyond_f64_is_the_one_difference() {
    for doc in [
        "1e400",
        "[1,-1e999]",
        "{\"usage\":{\"completion_tokens\":1e400}}",
    ] {
        assert!(event::read(doc.as_bytes(), false).is_none());
        assert!(out_of_range(doc.as_bytes()));
        assert!(scan(doc.as_bytes(), false, &[]).is_some());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn same_answer_for_any_document_and_any_split(
        d in doc(),
        pretty in any::<bool>(),
        splits in prop::collection::vec(0usize..400, 0..6),
        cut in prop::option::of(0usize..400),
        junk in prop::option::of((0usize..400, any::<u8>())),
    ) {
        let mut text = String::new();
        d.write(&mut text, pretty);
        let mut bytes = text.into_bytes();
        let mut splits = splits;
        splits.sort_unstable();
        for delta in [false, true] {
            prop_assert_eq!(scan(&bytes, delta, &splits), event::read(&bytes, delta));
        }
        // Broken versions: cut short, or one byte replaced.
        if let Some(c) = cut {
            let c = c.min(bytes.len());
            prop_assert_eq!(scan(&bytes[..c], false, &splits), event::read(&bytes[..c], false));
        }
        if let Some((at, b)) = junk {
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] = b;
                let (got, want) = (scan(&bytes, false, &splits), event::read(&bytes, false));
                if got != want {
                    // The one documented difference: a number beyond f64's range.
                    prop_assert!(want.is_none() && out_of_range(&bytes), "{:?} {:?}", got, want);
                }
            }
        }
    }
}

#[test]
fn plain_runs_stop_at_every_special_byte() {
    for special in [b'"', b'\\', 0x00, 0x1f, 0x80, 0xff] {
        for at in 0..20 {
            let mut v = vec![b'a'; 20];
            v[at] = special;
            assert_eq!(skip_plain(&v, 0), at, "{special:#x} at {at}");
        }
    }
    assert_eq!(skip_plain(&[b' '; 19], 3), 19);
    assert_eq!(skip_plain(b"\x7f~ ", 0), 3);
}
