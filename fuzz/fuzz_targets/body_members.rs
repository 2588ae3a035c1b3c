//! Fuzz target: the proxy's in-place reader of request bodies against serde_json.
//!
//! Byte 0 picks which members to remove (bit i: the i-th member, for the first eight);
//! the rest is a body. `proxy::members::object` must agree with serde_json's reading
//! of it as a JSON tree ([`Json`]: its `Value` without the private raw-value key): both
//! accept the same object with the same members (each member's span parses to
//! the value serde_json holds for its key, the last occurrence winning), or both
//! refuse the text; the one documented exception is a text serde_json refuses only for
//! a check left to whoever parses that member's value (a number beyond f64, nesting
//! past serde_json's limit, a lone surrogate escape). Removing members with
//! `removals` + `cut`, as the proxy strips the members it does not trust, must leave a
//! valid object holding exactly the members kept.
#![no_main]

use kvroute::proxy::members::{
    cut, object, open_index, refused_for_a_relaxed_check as relaxed, removals, ObjectError,
};
use libfuzzer_sys::fuzz_target;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

/// A JSON tree as serde_json reads one, minus a quirk of its `Value`: with the
/// `raw_value` feature, `Value` takes an object whose first key is serde_json's private
/// raw-value key for the JSON text in that member's string. JSON has no such rule, and
/// neither the proxy's reader nor the engine's applies it.
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(Number),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Num(n.into()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Num(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Json, E> {
        Ok(Number::from_f64(n).map_or(Json::Null, Json::Num))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::Str(s.to_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(Json::Arr(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        let mut m = BTreeMap::new();
        while let Some((k, v)) = a.next_entry::<String, Json>()? {
            m.insert(k, v);
        }
        Ok(Json::Obj(m))
    }
}

fn parse(text: &[u8]) -> serde_json::Result<Json> {
    serde_json::from_slice(text)
}

/// The object the members at `keep` make, as serde_json would hold it (last
/// occurrence of a key wins), or None when a span does not parse (a relaxed text).
fn object_of(
    text: &[u8],
    members: &[(String, Range<usize>)],
    keep: impl Fn(usize) -> bool,
) -> Option<Json> {
    let mut map = BTreeMap::new();
    for (i, (k, span)) in members.iter().enumerate() {
        if keep(i) {
            map.insert(k.clone(), parse(&text[span.clone()]).ok()?);
        }
    }
    Some(Json::Obj(map))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mask, text)) = data.split_first() else {
        return;
    };
    let tree = parse(text);
    let mut members: Vec<(String, Range<usize>)> = Vec::new();
    let read = object(text, |k, span| members.push((k.into_owned(), span)));
    match (&tree, &read) {
        (Ok(Json::Obj(_)), Ok(())) => {
            let whole = object_of(text, &members, |_| true);
            assert_eq!(
                whole.as_ref(),
                tree.as_ref().ok(),
                "members differ from serde_json's"
            );
        }
        (Ok(_), Err(ObjectError::NotObject)) | (Err(_), Err(ObjectError::Json(_))) => return,
        (Err(e), Err(ObjectError::NotObject)) if relaxed(e) => return,
        (Err(e), Ok(())) if relaxed(e) => {}
        (t, r) => panic!("serde_json {t:?}, members::object {r:?}"),
    }
    // Strip the members the mask names; what is left is the object of the rest.
    let dropped = |i: usize| i < 8 && mask & (1 << i) != 0;
    let spans: Vec<Range<usize>> = members.iter().map(|(_, s)| s.clone()).collect();
    let cuts = removals(text, open_index(text), &spans, dropped);
    let out = cut(text, &cuts);
    let Some(want) = object_of(text, &members, |i| !dropped(i)) else {
        return;
    };
    let got = match parse(&out) {
        Ok(v) => v,
        Err(e) => panic!(
            "stripped body is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&out)
        ),
    };
    assert_eq!(
        got,
        want,
        "stripped body: {:?}",
        String::from_utf8_lossy(&out)
    );
});
