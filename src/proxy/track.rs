//! Lifecycle signals read off an upstream response, chunk by chunk, without holding
//! the body: for SSE (`stream: true`) each `data:` event is parsed as it completes;
//! for a JSON answer the body is kept only up to `max_json` bytes to read its `usage`
//! at the end (past that, tokens are not counted; the bytes still flow to the client).
//!
//! - the first event carrying output (completions `choices[].text`, chat
//!   `choices[].delta.content` / `reasoning_content` / `tool_calls`) is the first
//!   token;
//! - output tokens are `usage.completion_tokens` when the upstream reports it, else one
//!   per output-carrying choice of each event;
//! - an event with an `error` member is an upstream error (the stream is not cut).
//!
//! A partial SSE line is buffered up to `MAX_LINE`; a longer line is skipped (counted
//! as nothing) so a hostile upstream cannot grow the buffer.

use serde_json::Value;

/// Longest SSE line parsed.
pub const MAX_LINE: usize = 1 << 20;

/// What one chunk changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// This chunk carried the first output.
    pub first_output: bool,
    /// The output token count changed (its new value is [`Tracker::tokens`]).
    pub progressed: bool,
    /// The stream reported an error event.
    pub error: bool,
    /// `data: [DONE]` arrived.
    pub done: bool,
}

#[derive(Debug)]
pub struct Tracker {
    sse: bool,
    line: Vec<u8>,
    skipping: bool,
    max_json: usize,
    json: Vec<u8>,
    json_over: bool,
    output_seen: bool,
    counted: u32,
    usage: Option<u32>,
}

impl Tracker {
    pub fn new(sse: bool, max_json: usize) -> Tracker {
        Tracker {
            sse,
            line: Vec::new(),
            skipping: false,
            max_json,
            json: Vec::new(),
            json_over: false,
            output_seen: false,
            counted: 0,
            usage: None,
        }
    }

    /// Output tokens so far.
    pub fn tokens(&self) -> u32 {
        self.usage.unwrap_or(self.counted)
    }

    pub fn output_seen(&self) -> bool {
        self.output_seen
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
        for &b in chunk {
            if b == b'\n' {
                if !self.skipping {
                    let line = std::mem::take(&mut self.line);
                    self.event_line(&line, &mut seen);
                    self.line = line;
                    self.line.clear();
                }
                self.skipping = false;
            } else if !self.skipping {
                if self.line.len() >= MAX_LINE {
                    self.skipping = true;
                    self.line.clear();
                } else {
                    self.line.push(b);
                }
            }
        }
        seen.progressed = self.tokens() != before;
        seen
    }

    /// The body ended: for a JSON answer, its output and usage.
    pub fn finish(&mut self) -> Seen {
        let mut seen = Seen::default();
        if self.sse || self.json_over {
            return seen;
        }
        if let Ok(v) = serde_json::from_slice::<Value>(&self.json) {
            if v.get("error").is_some_and(|e| !e.is_null()) {
                seen.error = true;
            }
            let n = output_choices(&v, false);
            self.counted += n;
            self.usage = usage(&v).or(self.usage);
            seen.first_output = (n > 0 || self.tokens() > 0) && !self.output_seen;
            self.output_seen |= seen.first_output;
            seen.progressed = self.tokens() > 0;
        }
        self.json = Vec::new();
        seen
    }

    fn event_line(&mut self, line: &[u8], seen: &mut Seen) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            seen.done = true;
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            seen.error = true;
        }
        let n = output_choices(&v, true);
        if n > 0 && !self.output_seen {
            self.output_seen = true;
            seen.first_output = true;
        }
        self.counted = self.counted.saturating_add(n);
        if let Some(u) = usage(&v) {
            self.usage = Some(u);
        }
    }
}

/// Choices of `v` that carry output.
fn output_choices(v: &Value, delta: bool) -> u32 {
    let Some(choices) = v.get("choices").and_then(Value::as_array) else {
        return 0;
    };
    choices
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
        .count() as u32
}

fn usage(v: &Value) -> Option<u32> {
    v.get("usage")?
        .get("completion_tokens")?
        .as_u64()
        .map(|n| n.min(u64::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(text: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{text}\"}}]}}\n\n")
    }

    #[test]
    fn sse_first_token_and_counts_across_split_chunks() {
        let mut t = Tracker::new(true, 1024);
        // A role-only chat chunk carries no output.
        let s = t.feed(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
        assert!(!s.first_output && t.tokens() == 0);
        let all = format!("{}{}", ev("a"), ev("b"));
        let (x, y) = all.as_bytes().split_at(17);
        let s1 = t.feed(x);
        assert!(!s1.first_output);
        let s2 = t.feed(y);
        assert!(s2.first_output && s2.progressed);
        assert_eq!(t.tokens(), 2);
        let s = t.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\r\n\r\n");
        assert!(!s.first_output && s.progressed && t.tokens() == 3);
        // usage wins over the count.
        t.feed(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":9}}\n\n");
        assert_eq!(t.tokens(), 9);
        assert!(t.feed(b"data: [DONE]\n\n").done);
        assert!(t.feed(b"data: {\"error\":{\"message\":\"x\"}}\n\n").error);
    }

    #[test]
    fn json_answers_are_read_at_the_end_and_bounded() {
        let mut t = Tracker::new(false, 1024);
        t.feed(br#"{"choices":[{"message":{"content":"hi"}}],"#);
        t.feed(br#""usage":{"completion_tokens":5}}"#);
        let s = t.finish();
        assert!(s.first_output && s.progressed && t.tokens() == 5);
        let mut t = Tracker::new(false, 8);
        t.feed(b"0123456789");
        assert_eq!(t.finish(), Seen::default());
    }

    #[test]
    fn an_endless_line_is_skipped_not_buffered() {
        let mut t = Tracker::new(true, 0);
        let junk = vec![b'x'; MAX_LINE + 10];
        t.feed(&junk);
        assert!(t.line.len() <= MAX_LINE);
        t.feed(b"\n");
        t.feed(ev("z").as_bytes());
        assert_eq!(t.tokens(), 1);
    }
}
