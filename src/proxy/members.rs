//! The members of a JSON object read in place: one validating pass over its bytes
//! yields each member's key and the byte span of its value, with no JSON tree built and
//! nothing copied (a key is borrowed unless it has escapes, a value is a span of the
//! input). Readers then parse only the members they need, from their spans.
//!
//! Guarantees: [`object`] accepts exactly the JSON texts serde_json accepts as a
//! `Value` object, but for three checks it leaves to whoever parses a member's value
//! (serde_json's rules for a value it skips): a number beyond f64's range (`1e400`),
//! nesting deeper than serde_json's limit of 128, and a lone UTF-16 surrogate escape
//! (`"\ud800"`) in a string inside a value. Such a member only reaches the engine, whose
//! JSON reader answers as it would for any client; the members the router reads are
//! parsed with serde_json's full rules. One more difference is serde_json's own: to its
//! `Value`, an object whose first key is serde_json's private raw-value key
//! ([`SERDE_JSON_RAW_KEY`]) is the JSON text in that member's string; JSON has no such
//! rule, and [`object`] reads an ordinary member, as the engine's JSON reader does.
//! Keys are decoded in full; UTF-8, control characters and escape syntax are checked
//! everywhere, so every span is valid UTF-8 JSON. Case by case against serde_json in
//! `members_tests`.

use crate::tokenize::id_list::{self, skip_ws};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

/// A member's key: borrowed from the input unless it has escapes.
pub type Key<'a> = Cow<'a, str>;

/// Calls `f(key, span)` for each member of the JSON object `text` (leading and
/// trailing whitespace allowed), in order, duplicates included; `span` is the byte
/// range of the member's value in `text`. `Err`: not JSON, or JSON that is not an
/// object (`NotObject`).
pub fn object<'a>(
    text: &'a [u8],
    mut f: impl FnMut(Key<'a>, Range<usize>),
) -> Result<(), ObjectError> {
    if let Some(members) = quick(text) {
        for (k, span) in members {
            f(k, span);
        }
        return Ok(());
    }
    let first = text.get(skip_ws(text, 0));
    if first != Some(&b'{') {
        // Not an object: tell broken JSON from JSON of another type. Skipping a value
        // does not check the UTF-8 of its strings, so that is checked first (with
        // serde_json's own error when it fails).
        let parsed = match std::str::from_utf8(text) {
            Ok(s) => serde_json::from_str::<de::IgnoredAny>(s).map(drop),
            Err(_) => serde_json::from_slice::<serde_json::Value>(text).map(drop),
        };
        return match parsed {
            Ok(()) => Err(ObjectError::NotObject),
            Err(e) => Err(ObjectError::Json(e)),
        };
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    de.deserialize_map(Members {
        base: text.as_ptr() as usize,
        f,
    })
    .map_err(ObjectError::Json)?;
    de.end().map_err(ObjectError::Json)
}

/// The members of the object `text` the quick way, or `None` for anything unusual (an
/// escaped key, broken JSON...), which the general path in [`object`] then reads, with
/// serde_json's own error for broken JSON. The object's structure is walked here; a
/// key without escapes is taken as it lies (checked as serde_json checks one: UTF-8,
/// no control character); a list of token ids is checked by [`id_list::read`] at a
/// fraction of the cost of serde_json's skip (a long prompt is most of a body); any
/// other value is skipped by serde_json from where it starts, as the general path
/// skips it. So both paths give the same members and spans.
fn quick(text: &[u8]) -> Option<Vec<(Key<'_>, Range<usize>)>> {
    let mut i = skip_ws(text, 0);
    if text.get(i) != Some(&b'{') {
        return None;
    }
    let mut out = Vec::with_capacity(8);
    i = skip_ws(text, i + 1);
    if text.get(i) == Some(&b'}') {
        return (skip_ws(text, i + 1) == text.len()).then_some(out);
    }
    loop {
        if text.get(i) != Some(&b'"') {
            return None;
        }
        let len = text[i + 1..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        let end = i + 1 + len;
        if text[end] != b'"' {
            return None;
        }
        let key = std::str::from_utf8(&text[i + 1..end]).ok()?;
        i = skip_ws(text, end + 1);
        if text.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(text, i + 1);
        let rest = text.get(i..).filter(|r| !r.is_empty())?;
        let len = match id_list::read(rest, |_| {}) {
            Some(len) => len,
            None => {
                let mut de = serde_json::Deserializer::from_slice(rest);
                let v = <&RawValue as de::Deserialize>::deserialize(&mut de).ok()?;
                v.get().as_ptr() as usize - rest.as_ptr() as usize + v.get().len()
            }
        };
        out.push((Cow::Borrowed(key), i..i + len));
        i = skip_ws(text, i + len);
        match text.get(i) {
            Some(b',') => i = skip_ws(text, i + 1),
            Some(b'}') => return (skip_ws(text, i + 1) == text.len()).then_some(out),
            _ => return None,
        }
    }
}

/// Whether serde_json refused a text (as a `Value`) only for one of the checks
/// [`object`] leaves to whoever parses a member's value (see the module's header): a
/// number beyond f64's range, nesting past serde_json's limit, or a lone UTF-16
/// surrogate escape. The tests and the fuzz target that hold `object` to serde_json
/// allow exactly these differences.
pub fn refused_for_a_relaxed_check(e: &serde_json::Error) -> bool {
    let m = e.to_string();
    [
        "number out of range",
        "recursion limit exceeded",
        "lone leading surrogate in hex escape",
        "unexpected end of hex escape",
    ]
    .iter()
    .any(|p| m.starts_with(p))
}

/// The key serde_json's `raw_value` feature (which the proxy needs for spans) reserves:
/// its `Value` reads an object whose first key this is as the JSON text in that
/// member's string. [`object`] reads it as JSON says, an ordinary member; the tests and
/// the fuzz target that hold `object` to serde_json's `Value` leave such texts out.
pub const SERDE_JSON_RAW_KEY: &str = "$serde_json::private::RawValue";

/// Why [`object`] refused a text.
#[derive(Debug)]
pub enum ObjectError {
    /// Not JSON.
    Json(serde_json::Error),
    /// JSON, but not an object.
    NotObject,
}

struct Members<F> {
    base: usize,
    f: F,
}

impl<'de, F: FnMut(Key<'de>, Range<usize>)> Visitor<'de> for Members<F> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(k) = map.next_key_seed(KeySeed)? {
            let v: &'de RawValue = map.next_value()?;
            let start = v.get().as_ptr() as usize - self.base;
            (self.f)(k, start..start + v.get().len());
        }
        Ok(())
    }
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key<'de>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
        Ok(Cow::Owned(s.to_string()))
    }
}

/// The byte ranges of `text` that removing the members at `drop` (indices into
/// `values`, the value spans of the object's members in order, as [`object`] gives
/// them) takes out, leaving a valid object: each dropped member from the end of the
/// value before it (or the `{`) to the end of its own value, and, when the members
/// before the first kept one are all dropped, the separator after them. `open`: the
/// index just past the object's `{`.
pub fn removals(
    text: &[u8],
    open: usize,
    values: &[Range<usize>],
    drop: impl Fn(usize) -> bool,
) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut leading = true;
    for (i, v) in values.iter().enumerate() {
        let from = if i == 0 { open } else { values[i - 1].end };
        if drop(i) {
            out.push(from..v.end);
        } else {
            if leading && i > 0 {
                // The first kept member lost its predecessors: drop its separator.
                if let Some(c) = text[from..v.start].iter().position(|&b| b == b',') {
                    out.push(from..from + c + 1);
                }
            }
            leading = false;
        }
    }
    out
}

/// `text` without the byte ranges `cut` (sorted, disjoint).
pub fn cut(text: &[u8], cut: &[Range<usize>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut at = 0;
    for r in cut {
        out.extend_from_slice(&text[at..r.start]);
        at = r.end;
    }
    out.extend_from_slice(&text[at..]);
    out
}

/// The index just past the `{` of an object text (whitespace before it skipped).
pub fn open_index(text: &[u8]) -> usize {
    text.iter().position(|&b| b == b'{').map_or(0, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(text: &str) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::new();
        object(text.as_bytes(), |k, r| {
            out.push((k.into_owned(), text[r].to_string()))
        })
        .map_err(|e| format!("{e:?}"))?;
        Ok(out)
    }

    #[test]
    fn members_in_order_with_their_value_text() {
        let got =
            members(" {\"a\" : [1, {\"x\":2}] ,\"b\\u0063\":\"s\\n\", \"a\":null } ").unwrap();
        assert_eq!(
            got,
            [
                ("a".into(), "[1, {\"x\":2}]".into()),
                ("bc".into(), "\"s\\n\"".into()),
                ("a".into(), "null".into()),
            ]
        );
        assert_eq!(members("{}").unwrap(), []);
        for bad in [
            "",
            "{",
            "{\"a\":1,}",
            "{\"a\":1} x",
            "{\"a\":\"\u{1}\"}",
            "{\"a\":01}",
        ] {
            assert!(
                matches!(members(bad), Err(e) if e.starts_with("Json")),
                "{bad:?}"
            );
        }
        assert!(object(b"[1]", |_, _| {}).is_err_and(|e| matches!(e, ObjectError::NotObject)));
        assert!(object(b" 3 ", |_, _| {}).is_err_and(|e| matches!(e, ObjectError::NotObject)));
        assert!(object(b"{\"a\":\"\xff\"}", |_, _| {}).is_err());
        // Invalid UTF-8 in a value that is not an object is broken JSON, not "not an
        // object" (found by the body_members fuzz target).
        for bad in [&b"\"\xff\""[..], b" [\"a\xc3\"] ", b"\xff"] {
            assert!(
                object(bad, |_, _| {}).is_err_and(|e| matches!(e, ObjectError::Json(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn removals_leave_a_valid_object() {
        let text = r#"{ "a":1 , "b" :[2], "c":{"d":3} }"#;
        let mut spans = Vec::new();
        object(text.as_bytes(), |_, r| spans.push(r)).unwrap();
        let open = open_index(text.as_bytes());
        for mask in 0..8u32 {
            let r = removals(text.as_bytes(), open, &spans, |i| mask & (1 << i) != 0);
            let out = String::from_utf8(cut(text.as_bytes(), &r)).unwrap();
            let v: serde_json::Value = serde_json::from_str(&out).expect(&out);
            let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
            let want: Vec<&str> = ["a", "b", "c"]
                .into_iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) == 0)
                .map(|(_, k)| k)
                .collect();
            assert_eq!(keys, want, "{out}");
        }
    }
}
