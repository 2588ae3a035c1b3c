//! A completions prompt read from its JSON text in place (the proxy has the text of
//! the body's `prompt` member, not a JSON tree): token ids go straight into a
//! `Vec<u32>` sized from the text before anything is pushed, a text prompt is borrowed
//! from the body unless it has escapes.
//!
//! Guarantee: the same answer as [`super::prompt::completion_tokens`] on the body
//! parsed as a `Value` — the same ids, and an error exactly where it errs (the rarer
//! shapes, and every error, are read through that path from the member's text, so
//! they keep its messages). Property-tested in `proxy::request_tests`.

use super::bounds::check_token_count;
use super::{Model, PromptError};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

/// The first prompt of a completions request, as given.
#[derive(Debug, PartialEq, Eq)]
pub enum Given<'a> {
    /// A text prompt (the first of a list of texts).
    Text(Cow<'a, str>),
    /// Token ids (the first list of a list of lists), each a u32, at most the limit.
    Ids(Vec<u32>),
    /// Any other shape, and every malformed prompt: the member's JSON text, read as a
    /// `Value` by [`tokens`] (for the exact answer and message of the tree path).
    Other(&'a str),
}

/// The first prompt of `prompt` (the member's JSON text; `None`: absent) and
/// `add_special_tokens` (its JSON text, if present), at most `max` tokens of ids.
pub fn read<'a>(
    prompt: Option<&'a str>,
    add_special: Option<&str>,
    max: usize,
) -> Result<(Given<'a>, bool), PromptError> {
    let raw = prompt.ok_or_else(|| PromptError("prompt is required".into()))?;
    let add_special = match add_special.map(str::trim) {
        None | Some("null") | Some("true") => true,
        Some("false") => false,
        Some(_) => return Err(PromptError("add_special_tokens must be a boolean".into())),
    };
    let given = match raw.as_bytes().first() {
        Some(b'"') => Given::Text(string(raw)?),
        Some(b'[') => match first_byte(&raw[1..]) {
            Some(b'0'..=b'9') => ids(raw, max).map_or(Given::Other(raw), Given::Ids),
            Some(b'"' | b'[') => {
                let items: Vec<&RawValue> = parse(raw)?;
                let lead = items[0].get().as_bytes()[0];
                if !items.iter().all(|i| i.get().as_bytes()[0] == lead) {
                    Given::Other(raw)
                } else if lead == b'"' {
                    Given::Text(string(items[0].get())?)
                } else {
                    match ids(items[0].get(), max) {
                        Some(ids) if !ids.is_empty() => Given::Ids(ids),
                        _ => Given::Other(raw),
                    }
                }
            }
            _ => Given::Other(raw),
        },
        _ => Given::Other(raw),
    };
    Ok((given, add_special))
}

fn parse<'a, T: serde::Deserialize<'a>>(raw: &'a str) -> Result<T, PromptError> {
    serde_json::from_str(raw).map_err(|e| PromptError(format!("prompt: {e}")))
}

/// A JSON string's value: borrowed when it has no escapes.
fn string(raw: &str) -> Result<Cow<'_, str>, PromptError> {
    match plain_str(raw) {
        Some(s) => Ok(Cow::Borrowed(s)),
        None => parse::<String>(raw).map(Cow::Owned),
    }
}

/// A JSON string's text without its quotes when it has no escapes (then, in valid
/// JSON, the text is the string); `None` for escaped strings and anything else.
fn plain_str(raw: &str) -> Option<&str> {
    let s = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!s.contains('\\')).then_some(s)
}

fn first_byte(s: &str) -> Option<u8> {
    let b = s.as_bytes();
    b.get(super::id_list::skip_ws(b, 0)).copied()
}

/// A JSON array of token ids (`raw`, valid JSON) read in one pass
/// ([`super::id_list`]), sized before it is filled: `None` unless every element is an
/// integer of at most `u32::MAX` and there are at most `max` of them (the caller reads
/// it again the slow way, for the error).
pub fn ids(raw: &str, max: usize) -> Option<Vec<u32>> {
    let b = raw.as_bytes();
    let n = super::id_list::bound(b);
    if n > max {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    super::id_list::read(b, |id| out.push(id))?;
    Some(out)
}

/// The prompt's token ids through the model's tokenizer, or as given (`m`: the
/// model, if it has a tokenizer; ids are then checked against its vocabulary).
pub(crate) fn tokens(
    m: Option<&Model>,
    given: Given<'_>,
    add_special: bool,
    max: usize,
) -> Result<Option<Vec<u32>>, PromptError> {
    match given {
        Given::Text(s) => match m {
            None => Ok(None),
            Some(m) => super::model::encode(m, &s, add_special, max).map(Some),
        },
        Given::Other(raw) => {
            let mut body = serde_json::Map::new();
            body.insert("prompt".into(), parse::<Value>(raw)?);
            body.insert("add_special_tokens".into(), Value::Bool(add_special));
            super::prompt::completion_tokens(m, &Value::Object(body), max)
        }
        Given::Ids(ids) => {
            check_token_count(ids.len(), max)?;
            if let Some(m) = m {
                if let Some(&id) = ids.iter().find(|&&id| id >= m.vocab) {
                    return Err(PromptError(format!(
                        "prompt: token id {id} is out of vocabulary (size {})",
                        m.vocab
                    )));
                }
            }
            Ok(Some(ids))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lists_read_in_one_pass() {
        assert_eq!(ids("[1,2, 3 ]", 10), Some(vec![1, 2, 3]));
        assert_eq!(ids("[ ]", 10), Some(vec![]));
        assert_eq!(ids("[4294967295]", 10), Some(vec![u32::MAX]));
        for bad in [
            "[4294967296]",
            "[1.5]",
            "[1e2]",
            "[-1]",
            "[1,\"a\"]",
            "[[1]]",
            "[1,2]",
        ] {
            assert_eq!(ids(bad, if bad == "[1,2]" { 1 } else { 10 }), None, "{bad}");
        }
    }

    #[test]
    fn plain_strings_are_borrowed() {
        assert_eq!(plain_str("\"abc\""), Some("abc"));
        assert_eq!(plain_str("\"a\\nb\""), None);
        assert_eq!(plain_str("12"), None);
    }

    #[test]
    fn shapes_and_flags() {
        fn r(p: &str) -> Result<(Given<'_>, bool), PromptError> {
            read(Some(p), None, 8)
        }
        assert_eq!(r("[5, 6]").unwrap().0, Given::Ids(vec![5, 6]));
        assert_eq!(r("[[7], [8, 9]]").unwrap().0, Given::Ids(vec![7]));
        assert_eq!(r("\"hi\"").unwrap().0, Given::Text(Cow::Borrowed("hi")));
        assert_eq!(
            r("[\"a\\u0062\", \"c\"]").unwrap().0,
            Given::Text("ab".into())
        );
        for other in [
            "[]",
            "[[]]",
            "[1, \"a\"]",
            "[\"a\", 1]",
            "[[1], 2]",
            "[1.5]",
            "3",
            "{}",
            "[true]",
        ] {
            assert_eq!(r(other).unwrap().0, Given::Other(other), "{other}");
            assert!(
                tokens(None, r(other).unwrap().0, true, 8).is_err(),
                "{other}"
            );
        }
        let long = read(Some("[1,2,3]"), None, 2).unwrap().0;
        assert!(tokens(None, long, true, 2).is_err());
        assert!(read(None, None, 8).is_err());
        assert!(!read(Some("[1]"), Some("false"), 8).unwrap().1);
        assert!(read(Some("[1]"), Some("1"), 8).is_err());
    }
}
