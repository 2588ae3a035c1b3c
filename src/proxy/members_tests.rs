//! `members::object` case by case against serde_json (the reference it must agree
//! with): every kind of member value, escapes, repeated keys, nesting, invalid UTF-8,
//! numbers at the edges, whitespace, and a corpus built from all of them. Where the two
//! differ by design (see the module's header) the test says which difference it is.

use super::members::{
    object, refused_for_a_relaxed_check as relaxed, ObjectError, SERDE_JSON_RAW_KEY,
};
use serde_json::Value;

/// What `object` and serde_json say of `text`: `Ok(true)` both read the same object,
/// `Ok(false)` both refuse it (for the same reason: not JSON, or not an object),
/// `Err(())` `object` accepts a [`relaxed`] text. Panics on any other disagreement.
fn agree(text: &[u8]) -> Result<bool, ()> {
    let tree = serde_json::from_slice::<Value>(text);
    let mut got: Vec<(String, std::ops::Range<usize>)> = Vec::new();
    let r = object(text, |k, span| got.push((k.into_owned(), span)));
    let show = String::from_utf8_lossy(text);
    match (tree, r) {
        (Ok(Value::Object(o)), Ok(())) => {
            // First occurrence's place, last occurrence's value (as a `Map` keeps them).
            let mut want = serde_json::Map::new();
            for (k, span) in &got {
                let v: Value = serde_json::from_slice(&text[span.clone()])
                    .unwrap_or_else(|e| panic!("{show}: span of {k}: {e}"));
                want.insert(k.clone(), v);
            }
            let keys: Vec<&String> = want.keys().collect();
            assert_eq!(keys, o.keys().collect::<Vec<_>>(), "{show}");
            assert_eq!(Value::Object(want), Value::Object(o), "{show}");
            Ok(true)
        }
        (Ok(_), Err(ObjectError::NotObject)) => Ok(false),
        (Err(_), Err(ObjectError::Json(_))) => Ok(false),
        // Refused by both, told apart as "not an object" by the lenient check.
        (Err(e), Err(ObjectError::NotObject)) if relaxed(&e) => Ok(false),
        (Err(e), Ok(())) if relaxed(&e) => Err(()),
        (t, r) => panic!("{show}: serde_json {t:?}, object {r:?}"),
    }
}

fn obj(member: &str) -> String {
    format!("{{\"k\":{member}}}")
}

#[test]
fn every_kind_of_value_is_read_with_its_span() {
    let values = [
        "null",
        "true",
        "false",
        "0",
        "-0",
        "7",
        "-12",
        "3.25",
        "-0.0",
        "1e3",
        "1E-3",
        "2.5e+10",
        "\"\"",
        "\"text\"",
        "[]",
        "[1,\"a\",null,[],{}]",
        "{}",
        "{\"a\":{\"b\":[true]}}",
        "[ 1 , 2 ]",
        "{ \"x\" : 1 }",
    ];
    for v in values {
        let text = obj(v);
        assert_eq!(agree(text.as_bytes()), Ok(true), "{text}");
        let mut spans = Vec::new();
        object(text.as_bytes(), |_, r| spans.push(text[r].to_string())).unwrap();
        assert_eq!(spans, [v], "the span is the value's text as sent");
    }
}

#[test]
fn escapes_in_keys_and_values() {
    let strings = [
        r#""\"""#,
        r#""\\""#,
        r#""\/""#,
        r#""\b\f\n\r\t""#,
        r#""\u0000""#,
        r#""\u00e9\u00E9""#,
        r#""\ud83d\ude00""#,
        r#""\uffff""#,
        "\"é ☃ 😀\"",
        "\"\u{7f}\"",
        "\"\u{2028}\"",
    ];
    for s in strings {
        assert_eq!(agree(obj(s).as_bytes()), Ok(true), "{s}");
        let key = format!("{{{s}:1}}");
        assert_eq!(agree(key.as_bytes()), Ok(true), "key {s}");
    }
    // A key with escapes is decoded; a key without is borrowed from the text.
    let text = r#"{"a\u0062":1,"plain":2}"#;
    let mut keys = Vec::new();
    object(text.as_bytes(), |k, _| {
        keys.push((k.to_string(), matches!(k, std::borrow::Cow::Borrowed(_))))
    })
    .unwrap();
    assert_eq!(keys, [("ab".into(), false), ("plain".into(), true)]);
    let bad = [
        r#""\x""#,
        r#""\u12""#,
        r#""\u12g4""#,
        "\"\u{1}\"",
        "\"\t\"",
        "\"\n\"",
        r#""unterminated"#,
        r#""\""#,
    ];
    for s in bad {
        assert_eq!(agree(obj(s).as_bytes()), Ok(false), "{s}");
        assert_eq!(agree(format!("{{{s}:1}}").as_bytes()), Ok(false), "key {s}");
    }
    // A lone surrogate: refused in a key (kvroute decodes keys), left to the reader
    // of the member in a value (the engine's JSON decides, as for any client).
    for s in [r#""\ud800""#, r#""\udc00x""#, r#""\ud800\u0041""#] {
        assert_eq!(agree(format!("{{{s}:1}}").as_bytes()), Ok(false), "key {s}");
        assert_eq!(agree(obj(s).as_bytes()), Err(()), "{s}");
    }
}

#[test]
fn repeated_keys_are_all_seen_in_order() {
    let text = r#"{"a":1,"b":2,"a":[3],"a":null}"#;
    let mut seen = Vec::new();
    object(text.as_bytes(), |k, r| {
        seen.push(format!("{k}={}", &text[r]))
    })
    .unwrap();
    assert_eq!(seen, ["a=1", "b=2", "a=[3]", "a=null"]);
    assert_eq!(agree(text.as_bytes()), Ok(true));
    assert_eq!(agree(br#"{"a":1,"a":1}"#), Ok(true));
    assert_eq!(agree(br#"{"a\u0061":1,"aa":2}"#), Ok(true));
}

#[test]
fn serde_json_private_raw_key_is_an_ordinary_member() {
    // To serde_json's `Value` this object is the JSON text in its string; to JSON (and
    // to the engine) it is an object with one member (found by the body_members fuzz
    // target).
    for (text, value) in [
        (format!(r#"{{"{SERDE_JSON_RAW_KEY}":"[1,2]"}}"#), Ok(true)),
        (format!(r#"{{"{SERDE_JSON_RAW_KEY}":"%9@"}}"#), Err(())),
        (
            format!(r#"{{"{SERDE_JSON_RAW_KEY}":"{{}}","a":1}}"#),
            Err(()),
        ),
    ] {
        let tree = serde_json::from_str::<Value>(&text);
        assert_eq!(
            tree.as_ref().map(Value::is_array).map_err(drop),
            value,
            "{text}"
        );
        let mut got = Vec::new();
        object(text.as_bytes(), |k, r| got.push((k.into_owned(), r))).unwrap();
        assert_eq!(got[0].0, SERDE_JSON_RAW_KEY, "{text}");
    }
    // Not first, or inside a member: read alike.
    assert_eq!(
        agree(format!(r#"{{"a":1,"{SERDE_JSON_RAW_KEY}":"[1]"}}"#).as_bytes()),
        Ok(true)
    );
    assert_eq!(
        agree(format!(r#"{{"a":{{"{SERDE_JSON_RAW_KEY}":"[1]"}}}}"#).as_bytes()),
        Ok(true)
    );
}

#[test]
fn nesting_is_left_to_the_member_reader_past_serde_json_limit() {
    for depth in [1, 50, 126] {
        let t = obj(&format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        assert_eq!(agree(t.as_bytes()), Ok(true), "{depth}");
        let t = obj(&format!(
            "{}1{}",
            "{\"x\":".repeat(depth),
            "}".repeat(depth)
        ));
        assert_eq!(agree(t.as_bytes()), Ok(true), "{depth}");
    }
    for depth in [127, 1000, 100_000] {
        let t = obj(&format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
        assert_eq!(agree(t.as_bytes()), Err(()), "{depth}");
    }
    // Unbalanced, however deep: refused by both.
    for t in [
        obj(&"[".repeat(100_000)),
        obj(&format!("{}{}", "[".repeat(10), "]".repeat(9))),
        obj(&format!("{}{}", "[".repeat(9), "]".repeat(10))),
        obj("[}"),
        obj("{]"),
    ] {
        assert_eq!(agree(t.as_bytes()), Ok(false));
    }
}

#[test]
fn invalid_utf8_is_refused_wherever_it_is() {
    let bytes: [&[u8]; 7] = [
        b"\xff",
        b"\xc3",
        b"\xc0\xaf",
        b"\xe0\x80\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x82",
    ];
    for b in bytes {
        let mut value = b"{\"k\":\"a".to_vec();
        value.extend_from_slice(b);
        value.extend_from_slice(b"\"}");
        assert_eq!(agree(&value), Ok(false), "{b:?} in a value");
        let mut key = b"{\"a".to_vec();
        key.extend_from_slice(b);
        key.extend_from_slice(b"\":1}");
        assert_eq!(agree(&key), Ok(false), "{b:?} in a key");
        let mut nested = b"{\"k\":[{\"x\":\"".to_vec();
        nested.extend_from_slice(b);
        nested.extend_from_slice(b"\"}]}");
        assert_eq!(agree(&nested), Ok(false), "{b:?} nested");
        let mut bare = b"{\"k\":".to_vec();
        bare.extend_from_slice(b);
        bare.extend_from_slice(b"}");
        assert_eq!(agree(&bare), Ok(false), "{b:?} bare");
    }
}

#[test]
fn numbers_at_the_edges() {
    let good = [
        "0",
        "-0",
        "18446744073709551615",
        "18446744073709551616",
        "-9223372036854775808",
        "-9223372036854775809",
        "123456789012345678901234567890",
        "1.7976931348623157e308",
        "-1.7976931348623157e308",
        "5e-324",
        "1e-400",
        "0.000000000000000000000000000001",
        "1E+2",
        "0e0",
    ];
    for n in good {
        assert_eq!(agree(obj(n).as_bytes()), Ok(true), "{n}");
    }
    let bad = [
        "01",
        "-01",
        "1.",
        ".5",
        "-",
        "1e",
        "1e+",
        "+1",
        "--1",
        "0x10",
        "NaN",
        "Infinity",
        "-Infinity",
        "1_000",
        "1.5.2",
        "١",
    ];
    for n in bad {
        assert_eq!(agree(obj(n).as_bytes()), Ok(false), "{n}");
    }
    for n in ["1e309", "-1e400", "1.8e308"] {
        assert_eq!(agree(obj(n).as_bytes()), Err(()), "{n}");
    }
}

#[test]
fn shapes_around_the_object() {
    for t in ["{}", " {} ", "\n\t{\r\n}\n", "{ }", "{\"a\" :1 ,\"b\": 2}"] {
        assert_eq!(agree(t.as_bytes()), Ok(true), "{t:?}");
    }
    for t in ["[]", "1", "\"s\"", "null", " true "] {
        assert!(matches!(
            object(t.as_bytes(), |_, _| {}),
            Err(ObjectError::NotObject)
        ));
        assert_eq!(agree(t.as_bytes()), Ok(false), "{t:?}");
    }
    let bad = [
        "",
        " ",
        "{",
        "}",
        "{,}",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":1 \"b\":2}",
        "{a:1}",
        "{'a':1}",
        "{\"a\":1}}",
        "{\"a\":1} x",
        "{}{}",
        "\u{feff}{}",
        "{\"a\":1}\0",
        "{\u{a0}}",
        "{\"a\":tru}",
        "{\"a\":nul}",
        "{1:2}",
        "[{}",
    ];
    for t in bad {
        assert!(
            matches!(object(t.as_bytes(), |_, _| {}), Err(ObjectError::Json(_))),
            "{t:?}"
        );
        assert_eq!(agree(t.as_bytes()), Ok(false), "{t:?}");
    }
}

/// Every pair of fragments from the cases above, as members, keys and whole texts.
#[test]
fn agrees_with_serde_json_on_a_corpus() {
    let frags = [
        "null",
        "true",
        "1",
        "-0",
        "1e400",
        "0.5",
        "\"s\"",
        "\"\\ud800\"",
        "\"\\u00e9\"",
        "[]",
        "[1,[2]]",
        "{}",
        "{\"a\":{}}",
        "{\"a\":1,\"a\":2}",
        "\"\\x\"",
        "01",
        "[1,]",
        "{\"a\"}",
        "\"\u{1}\"",
        "",
        " ",
        ",",
        ":",
        "}",
        "]",
        "{",
        "[",
    ];
    let keys = [
        "\"a\"",
        "\"model\"",
        "\"a\\u0062\"",
        "\"\\ud800\"",
        "1",
        "a",
        "\"\"",
    ];
    let (mut same, mut refused, mut relaxed) = (0, 0, 0);
    for a in frags {
        for b in frags {
            for k in keys {
                let texts = [
                    format!("{{{k}:{a}}}"),
                    format!("{{{k}:{a},{k}:{b}}}"),
                    format!("{{\"x\":{a}, {k} : {b} }}"),
                    format!("{{{k}:[{a},{b}]}}"),
                    format!("{a}{b}"),
                    format!("{{{a}{b}}}"),
                ];
                for t in texts {
                    match agree(t.as_bytes()) {
                        Ok(true) => same += 1,
                        Ok(false) => refused += 1,
                        Err(()) => relaxed += 1,
                    }
                }
            }
        }
    }
    assert!(
        same > 1000 && refused > 1000 && relaxed > 100,
        "{same} {refused} {relaxed}"
    );
}
