//! What the lifecycle needs from one OpenAI response object (an SSE `data:` event or
//! a whole JSON answer), read in one pass without building a `serde_json::Value`: the
//! number of choices that carry output, `usage.completion_tokens`, and whether it has
//! a non-null `error`.
//!
//! Guarantee: the answer is exactly what reading the object as a `Value` and looking
//! the fields up gives (`track`'s rules): the same documents are refused (every
//! string, number and nesting level is still checked by serde_json, through
//! `deserialize_any`, as for a `Value`), a field of an unexpected type counts as
//! absent, and a repeated key means its last occurrence (as a `Value` map keeps it).
//! Nothing is allocated for the object (strings are borrowed or in serde_json's
//! scratch buffer), which matters because a stream has one event per output token.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// What one response object says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventInfo {
    /// Choices that carry output (`text`, or `delta` / `message` `content`,
    /// `reasoning_content`, `tool_calls`, non-empty).
    pub output_choices: u32,
    /// `usage.completion_tokens`, when a non-negative integer (capped at `u32::MAX`).
    pub usage: Option<u32>,
    /// A non-null `error` member.
    pub error: bool,
}

/// Reads `data` (one JSON document); `delta`: choices carry `delta` (a stream
/// chunk), else `message` (a whole chat answer). `None`: not valid JSON.
pub fn read(data: &[u8], delta: bool) -> Option<EventInfo> {
    let mut de = serde_json::Deserializer::from_slice(data);
    let info = Event { delta }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(info)
}

/// Visitor methods for the values a visitor does not look into: scalars give
/// `$default`, arrays are consumed as [`Skip`] (objects are the visitor's own).
macro_rules! other_values {
    ($default:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            while a.next_element::<Skip>()?.is_some() {}
            Ok($default)
        }
    };
}

/// The shape of a value read by [`Any`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    /// A non-negative integer.
    U64(u64),
    /// A string; `true`: not empty.
    Str(bool),
    /// An array; `true`: not empty.
    Seq(bool),
    Other,
}

/// Reads any value (arrays and objects consumed element by element) as its [`Kind`].
struct Any;

impl<'de> Visitor<'de> for Any {
    type Value = Kind;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Kind, E> {
        Ok(Kind::Other)
    }
    fn visit_i64<E>(self, n: i64) -> Result<Kind, E> {
        // A `Value` stores a non-negative i64 as a u64 (`as_u64` answers it).
        Ok(u64::try_from(n).map_or(Kind::Other, Kind::U64))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Kind, E> {
        Ok(Kind::U64(n))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Kind, E> {
        Ok(Kind::Other)
    }
    fn visit_str<E>(self, s: &str) -> Result<Kind, E> {
        Ok(Kind::Str(!s.is_empty()))
    }
    fn visit_unit<E>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Kind, A::Error> {
        let mut any = false;
        while a.next_element::<Skip>()?.is_some() {
            any = true;
        }
        Ok(Kind::Seq(any))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Kind, A::Error> {
        while a.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Kind::Other)
    }
}

impl<'de> de::Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Kind, D::Error> {
        d.deserialize_any(Any)
    }
}

/// Any value, consumed.
struct Skip;

impl<'de> de::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(Any).map(|_| Skip)
    }
}

/// A map key among the names looked for (else `Other`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Choices,
    Usage,
    Error,
    CompletionTokens,
    Text,
    Delta,
    Message,
    Content,
    ReasoningContent,
    ToolCalls,
    Other,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E>(self, s: &str) -> Result<Key, E> {
                Ok(match s {
                    "choices" => Key::Choices,
                    "usage" => Key::Usage,
                    "error" => Key::Error,
                    "completion_tokens" => Key::CompletionTokens,
                    "text" => Key::Text,
                    "delta" => Key::Delta,
                    "message" => Key::Message,
                    "content" => Key::Content,
                    "reasoning_content" => Key::ReasoningContent,
                    "tool_calls" => Key::ToolCalls,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

fn nonempty(k: Kind) -> bool {
    matches!(k, Kind::Str(true) | Kind::Seq(true))
}

/// The top-level object.
struct Event {
    delta: bool,
}

impl<'de> DeserializeSeed<'de> for Event {
    type Value = EventInfo;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<EventInfo, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Event {
    type Value = EventInfo;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a response object")
    }
    other_values!(EventInfo::default());
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<EventInfo, A::Error> {
        let mut info = EventInfo::default();
        while let Some(k) = a.next_key::<Key>()? {
            match k {
                Key::Choices => {
                    info.output_choices = a.next_value_seed(Choices { delta: self.delta })?
                }
                Key::Usage => info.usage = a.next_value_seed(Usage)?,
                Key::Error => info.error = a.next_value::<Kind>()? != Kind::Null,
                _ => {
                    a.next_value::<Skip>()?;
                }
            }
        }
        Ok(info)
    }
}

/// `choices`: how many carry output (0 unless an array).
struct Choices {
    delta: bool,
}

impl<'de> DeserializeSeed<'de> for Choices {
    type Value = u32;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u32, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Choices {
    type Value = u32;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("choices")
    }
    fn visit_bool<E>(self, _: bool) -> Result<u32, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<u32, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<u32, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<u32, E> {
        Ok(0)
    }
    fn visit_str<E>(self, _: &str) -> Result<u32, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<u32, E> {
        Ok(0)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<u32, A::Error> {
        while a.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<u32, A::Error> {
        let mut n = 0u32;
        while let Some(out) = a.next_element_seed(Choice { delta: self.delta })? {
            n = n.saturating_add(u32::from(out));
        }
        Ok(n)
    }
}

/// One choice: does it carry output (`false` unless an object).
struct Choice {
    delta: bool,
}

impl<'de> DeserializeSeed<'de> for Choice {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Choice {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a choice")
    }
    other_values!(false);
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<bool, A::Error> {
        let (mut text, mut msg) = (false, false);
        while let Some(k) = a.next_key::<Key>()? {
            match k {
                Key::Text => text = nonempty(a.next_value::<Kind>()?),
                Key::Delta if self.delta => msg = a.next_value_seed(Message)?,
                Key::Message if !self.delta => msg = a.next_value_seed(Message)?,
                _ => {
                    a.next_value::<Skip>()?;
                }
            }
        }
        Ok(text || msg)
    }
}

/// A choice's `delta` / `message`: does it carry output (`false` unless an object).
struct Message;

impl<'de> DeserializeSeed<'de> for Message {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Message {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message")
    }
    other_values!(false);
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<bool, A::Error> {
        let (mut content, mut reasoning, mut tools) = (false, false, false);
        while let Some(k) = a.next_key::<Key>()? {
            match k {
                Key::Content => content = nonempty(a.next_value::<Kind>()?),
                Key::ReasoningContent => reasoning = nonempty(a.next_value::<Kind>()?),
                Key::ToolCalls => tools = nonempty(a.next_value::<Kind>()?),
                _ => {
                    a.next_value::<Skip>()?;
                }
            }
        }
        Ok(content || reasoning || tools)
    }
}

/// `usage`: its `completion_tokens` (`None` unless an object with a non-negative
/// integer there).
struct Usage;

impl<'de> DeserializeSeed<'de> for Usage {
    type Value = Option<u32>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u32>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Usage {
    type Value = Option<u32>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("usage")
    }
    other_values!(None);
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Option<u32>, A::Error> {
        let mut n = None;
        while let Some(k) = a.next_key::<Key>()? {
            if k == Key::CompletionTokens {
                n = match a.next_value::<Kind>()? {
                    Kind::U64(v) => Some(v.min(u64::from(u32::MAX)) as u32),
                    _ => None,
                };
            } else {
                a.next_value::<Skip>()?;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
#[path = "event_tests.rs"]
mod tests;
