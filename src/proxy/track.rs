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
//! as nothing) so a hostile upstream cannot grow the buffer. A line wholly inside one
//! chunk is read in place, and events are read by `event` without building a JSON
//! tree: nothing is allocated per event.

use super::event;

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
        // Whole lines are parsed in place; only a line split across chunks is copied.
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
                    self.event_line(seg, &mut seen);
                } else {
                    let mut line = std::mem::take(&mut self.line);
                    line.extend_from_slice(seg);
                    self.event_line(&line, &mut seen);
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

    /// The body ended: for a JSON answer, its output and usage.
    pub fn finish(&mut self) -> Seen {
        let mut seen = Seen::default();
        if self.sse || self.json_over {
            return seen;
        }
        if let Some(e) = event::read(&self.json, false) {
            seen.error = e.error;
            let n = e.output_choices;
            self.counted = self.counted.saturating_add(n);
            self.usage = e.usage.or(self.usage);
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
        let Some(e) = event::read(data, true) else {
            return;
        };
        if e.error {
            seen.error = true;
        }
        let n = e.output_choices;
        if n > 0 && !self.output_seen {
            self.output_seen = true;
            seen.first_output = true;
        }
        self.counted = self.counted.saturating_add(n);
        if let Some(u) = e.usage {
            self.usage = Some(u);
        }
    }
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

    /// A `data:` line of exactly `len` bytes carrying one output token.
    fn padded_event(len: usize) -> Vec<u8> {
        let head = b"data: {\"choices\":[{\"text\":\"a\"}]";
        let mut line = head.to_vec();
        line.resize(len - 1, b' ');
        line.push(b'}');
        line
    }

    #[test]
    fn lines_up_to_max_line_count_whole_or_split_and_longer_ones_do_not() {
        for split in [None, Some(1), Some(MAX_LINE / 2), Some(MAX_LINE)] {
            for (len, counted) in [(MAX_LINE, 1), (MAX_LINE + 1, 0)] {
                let mut t = Tracker::new(true, 0);
                let mut all = padded_event(len);
                all.extend_from_slice(b"\n\n");
                all.extend_from_slice(ev("b").as_bytes());
                match split {
                    None => {
                        t.feed(&all);
                    }
                    Some(at) => {
                        let (x, y) = all.split_at(at);
                        t.feed(x);
                        t.feed(y);
                    }
                }
                assert!(t.line.len() <= MAX_LINE);
                assert_eq!(t.tokens(), counted + 1, "len {len} split {split:?}");
            }
        }
        // Several events and a line split three ways, fed byte by byte or at once.
        let text = format!("{}{}: comment\r\n{}", ev("a"), ev(""), ev("c"));
        let mut whole = Tracker::new(true, 0);
        let s = whole.feed(text.as_bytes());
        assert!(s.first_output && s.progressed);
        let mut bytes = Tracker::new(true, 0);
        for b in text.as_bytes() {
            bytes.feed(std::slice::from_ref(b));
        }
        assert_eq!((whole.tokens(), bytes.tokens()), (2, 2));
        assert!(bytes.output_seen());
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
