//! The lifecycle of an Anthropic Messages or OpenAI Responses answer, read off its
//! bytes chunk by chunk without holding the body (the counterpart of
//! `proxy::track` for these APIs; it answers with the same [`Seen`]):
//!
//! - Messages, streamed (`event: …` / `data: {"type": …}`): the first
//!   `content_block_delta` carrying text, thinking or tool input is the first token;
//!   each such delta counts one token until `message_delta`'s `usage.output_tokens`
//!   says how many; `message_stop` ends it; an `error` event is an upstream error.
//! - Responses, streamed: the first `response.*.delta` event with a non-empty `delta`
//!   (output text, reasoning, tool arguments) is the first token, each counts one;
//!   `response.completed` / `response.incomplete` carry `usage.output_tokens` and end
//!   it, `response.failed` and `error` events are errors; the response's `id` (from
//!   `response.created` or the final response) is kept for the response → worker map.
//! - A whole JSON answer (`stream: false`) is read at the end, up to `max_json` bytes:
//!   `content` (Messages) or `output` (Responses) non-empty is output, `usage`
//!   the token count, `type: error` / a non-null `error` an error.
//!
//! Lines are buffered up to [`MAX_LINE`] (a longer one is skipped); only
//! the `data:` lines are read (each carries its event's `type`). An event of an
//! unexpected shape counts as nothing; nothing here panics on any input.

use super::Api;
use crate::proxy::track::Seen;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::fmt;

/// Visitor methods answering `$v` for every value a leaf does not read (containers
/// consumed).
macro_rules! other_as {
    ($v:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            while a.next_element::<IgnoredAny>()?.is_some() {}
            Ok($v)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok($v)
        }
    };
}

/// Longest SSE line buffered (1 MiB); a longer one is skipped.
pub const MAX_LINE: usize = 1 << 20;

#[derive(Debug)]
pub struct StreamTracker {
    api: Api,
    sse: bool,
    line: Vec<u8>,
    skipping: bool,
    max_json: usize,
    json: Vec<u8>,
    json_over: bool,
    output_seen: bool,
    counted: u32,
    usage: Option<u32>,
    response_id: Option<String>,
}

impl StreamTracker {
    pub fn new(api: Api, sse: bool, max_json: usize) -> StreamTracker {
        StreamTracker {
            api,
            sse,
            line: Vec::new(),
            skipping: false,
            max_json,
            json: Vec::new(),
            json_over: false,
            output_seen: false,
            counted: 0,
            usage: None,
            response_id: None,
        }
    }

    /// The API whose answer this reads.
    pub fn api(&self) -> Api {
        self.api
    }

    /// Output tokens so far.
    pub fn tokens(&self) -> u32 {
        self.usage.unwrap_or(self.counted)
    }

    pub fn output_seen(&self) -> bool {
        self.output_seen
    }

    /// Responses: the answer's id, once seen (at most `responses::MAX_RESPONSE_ID`).
    pub fn response_id(&self) -> Option<&str> {
        self.response_id.as_deref()
    }

    pub fn feed(&mut self, chunk: &[u8]) -> Seen {
        let mut seen = Seen::default();
        if !self.sse {
            if !self.json_over {
                if self.json.len() + chunk.len() > self.max_json {
                    self.json_over = true;
                    self.json = Vec::new();
                } else {
                    self.json.extend_from_slice(chunk);
                }
            }
            return seen;
        }
        let before = self.tokens();
        let mut rest = chunk;
        while !rest.is_empty() {
            let Some(i) = rest.iter().position(|&b| b == b'\n') else {
                if !self.skipping {
                    if self.line.len() + rest.len() > MAX_LINE {
                        self.skipping = true;
                        self.line.clear();
                    } else {
                        self.line.extend_from_slice(rest);
                    }
                }
                break;
            };
            let seg = &rest[..i];
            rest = &rest[i + 1..];
            if !self.skipping && self.line.len() + seg.len() <= MAX_LINE {
                if self.line.is_empty() {
                    self.line_in(seg, &mut seen);
                } else {
                    let mut line = std::mem::take(&mut self.line);
                    line.extend_from_slice(seg);
                    self.line_in(&line, &mut seen);
                    line.clear();
                    self.line = line;
                }
            }
            self.line.clear();
            self.skipping = false;
        }
        seen.progressed = self.tokens() != before;
        seen
    }

    /// The body ended: for a JSON answer, its output, usage and id.
    pub fn finish(&mut self) -> Seen {
        let mut seen = Seen::default();
        if self.sse || self.json_over {
            return seen;
        }
        let json = std::mem::take(&mut self.json);
        if let Ok(e) = serde_json::from_slice::<Event>(&json) {
            let kind = e.kind.0.as_deref().unwrap_or("");
            seen.error =
                e.error.is_some() || kind == "error" || e.status.0.as_deref() == Some("failed");
            let out = e.content.0 || e.output.0;
            if let Some(u) = e.usage.and_then(|u| u.output_tokens.0) {
                self.usage = Some(cap(u));
            } else if out {
                self.counted = 1;
            }
            if self.api == Api::Responses {
                self.keep_id(e.id.0);
            }
            seen.first_output = (out || self.tokens() > 0) && !self.output_seen;
            self.output_seen |= seen.first_output;
            seen.progressed = self.tokens() > 0;
        }
        seen
    }

    fn keep_id(&mut self, id: Option<Cow<'_, str>>) {
        if let Some(id) =
            id.filter(|i| !i.is_empty() && i.len() <= super::responses::MAX_RESPONSE_ID)
        {
            self.response_id = Some(id.into_owned());
        }
    }

    fn line_in(&mut self, line: &[u8], seen: &mut Seen) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            seen.done = true;
            return;
        }
        let Ok(e) = serde_json::from_slice::<Event>(data) else {
            return;
        };
        let kind = e.kind.0.as_deref().unwrap_or("");
        let output = match (self.api, kind) {
            (_, "error") => {
                seen.error = true;
                false
            }
            (Api::Messages, "content_block_delta") => e.delta.0,
            (Api::Messages, "message_delta") => {
                if let Some(u) = e.usage.and_then(|u| u.output_tokens.0) {
                    self.usage = Some(cap(u));
                }
                false
            }
            (Api::Messages, "message_stop") => {
                seen.done = true;
                false
            }
            (Api::Responses, k) if k.ends_with(".delta") => e.delta.0,
            (Api::Responses, "response.created" | "response.in_progress") => {
                if let Some(r) = e.response {
                    self.keep_id(r.id.0);
                }
                false
            }
            (Api::Responses, "response.completed" | "response.incomplete" | "response.failed") => {
                seen.done = true;
                seen.error |= kind == "response.failed";
                if let Some(r) = e.response {
                    if let Some(u) = r.usage.and_then(|u| u.output_tokens.0) {
                        self.usage = Some(cap(u));
                    }
                    self.keep_id(r.id.0);
                }
                false
            }
            _ => false,
        };
        if output {
            if !self.output_seen {
                self.output_seen = true;
                seen.first_output = true;
            }
            self.counted = self.counted.saturating_add(1);
        }
    }
}

fn cap(n: u64) -> u32 {
    n.min(u64::from(u32::MAX)) as u32
}

/// The fields read from one event or answer; each leaf takes any JSON value (a value
/// of another type reads as absent).
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: LStr<'a>,
    #[serde(default)]
    delta: LOutput,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    response: Option<Resp<'a>>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(borrow, default)]
    id: LStr<'a>,
    #[serde(borrow, default)]
    status: LStr<'a>,
    #[serde(default)]
    content: LOutput,
    #[serde(default)]
    output: LOutput,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    output_tokens: LCount,
}

#[derive(Deserialize)]
struct Resp<'a> {
    #[serde(borrow, default)]
    id: LStr<'a>,
    #[serde(default)]
    usage: Option<Usage>,
}

/// A string, or nothing.
#[derive(Default)]
struct LStr<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for LStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(LStr(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LStr(Some(Cow::Owned(s.to_string()))))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LStr(None))
            }
            other_as!(LStr(None));
        }
        d.deserialize_any(V)
    }
}

/// A non-negative integer, or nothing.
#[derive(Default)]
struct LCount(Option<u64>);

impl<'de> Deserialize<'de> for LCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LCount;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_u64<E>(self, n: u64) -> Result<LCount, E> {
                Ok(LCount(Some(n)))
            }
            fn visit_str<E>(self, _: &str) -> Result<LCount, E> {
                Ok(LCount(None))
            }
            other_as!(LCount(None));
        }
        d.deserialize_any(V)
    }
}

/// Whether a value carries output: a non-empty string or list, or an object with a
/// non-empty `text`, `thinking` or `partial_json` (an Anthropic delta).
#[derive(Default)]
struct LOutput(bool);

impl<'de> Deserialize<'de> for LOutput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LOutput;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E>(self, s: &str) -> Result<LOutput, E> {
                Ok(LOutput(!s.is_empty()))
            }
            fn visit_u64<E>(self, _: u64) -> Result<LOutput, E> {
                Ok(LOutput(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<LOutput, A::Error> {
                let mut any = false;
                while a.next_element::<IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(LOutput(any))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<LOutput, A::Error> {
                let mut any = false;
                while let Some(k) = a.next_key::<LStr>()? {
                    if matches!(k.0.as_deref(), Some("text" | "thinking" | "partial_json")) {
                        any |= a.next_value::<LOutput>()?.0;
                    } else {
                        a.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(LOutput(any))
            }
            fn visit_bool<E>(self, _: bool) -> Result<LOutput, E> {
                Ok(LOutput(false))
            }
            fn visit_i64<E>(self, _: i64) -> Result<LOutput, E> {
                Ok(LOutput(false))
            }
            fn visit_f64<E>(self, _: f64) -> Result<LOutput, E> {
                Ok(LOutput(false))
            }
            fn visit_unit<E>(self) -> Result<LOutput, E> {
                Ok(LOutput(false))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
