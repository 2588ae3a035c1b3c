//! Fuzz target: the proxy's in-place reader of request bodies against serde_json.
//!
//! Byte 0 picks which members to remove (bit i: the i-th member, for the first eight);
//! the rest is a body. `proxy::members::object` must agree with serde_json's `Value`:
//! both accept the same object with the same members (each member's span parses to
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
use serde_json::{Map, Value};
use std::ops::Range;

/// The object the members at `keep` make, as serde_json would hold it (last
/// occurrence of a key wins), or None when a span does not parse (a relaxed text).
fn object_of(
    text: &[u8],
    members: &[(String, Range<usize>)],
    keep: impl Fn(usize) -> bool,
) -> Option<Value> {
    let mut map = Map::new();
    for (i, (k, span)) in members.iter().enumerate() {
        if keep(i) {
            map.insert(k.clone(), serde_json::from_slice(&text[span.clone()]).ok()?);
        }
    }
    Some(Value::Object(map))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mask, text)) = data.split_first() else {
        return;
    };
    let tree = serde_json::from_slice::<Value>(text);
    let mut members: Vec<(String, Range<usize>)> = Vec::new();
    let read = object(text, |k, span| members.push((k.into_owned(), span)));
    match (&tree, &read) {
        (Ok(Value::Object(_)), Ok(())) => {
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
    let got: Value = match serde_json::from_slice(&out) {
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
