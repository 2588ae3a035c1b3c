//! Lifecycle signals read off an upstream response, chunk by chunk, without holding
//! the body: for SSE (`stream: true`) each `data:` event is parsed as it completes;
//! a JSON answer is scanned as it streams through (`jscan`, constant memory, nothing
//! of it kept) and read at its end, whatever its size.
//!
//! - the first event carrying output (completions `choices[].text`, chat
//!   `choices[].delta.content` / `reasoning_content` / `tool_calls`) is the first
//!   token;
//! - output tokens are `usage.completion_tokens` when the upstream reports it, else one
//!   per output-carrying choice of each event;
//! - an event with an `error` member is an upstream error (the stream is not cut).
//!
//! Nothing of the body is kept beyond a few hundred bytes, whatever its size or
//! shape: a line wholly inside one chunk is read in place (`event`, no JSON tree, no
//! allocation); a line split across chunks keeps its first [`HEAD`] bytes until they
//! say whether it is a `data:` line, then its data is scanned as it comes (`jscan`),
//! and any other line is skipped to its end. A line of any length counts.

use super::event::{self, EventInfo};
use super::jscan::Scan;

/// Bytes of a split line kept before deciding what it is (`data: [DONE]\r` fits).
pub const HEAD: usize = 16;

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

/// An SSE line that a chunk ended inside of.
#[derive(Debug, Default)]
enum Partial {
    #[default]
    None,
    /// Its first bytes, too few yet to tell what it is.
    Head { buf: [u8; HEAD], len: usize },
    /// A `data:` line: its JSON scanned so far.
    Data(Box<Scan>),
    /// Any other line: skipped to its end.
    Skip,
}

/// The data of a `data:` line (one space after the colon dropped), if it is one.
fn data_of(line: &[u8]) -> Option<&[u8]> {
    let data = line.strip_prefix(b"data:")?;
    Some(data.strip_prefix(b" ").unwrap_or(data))
}

#[derive(Debug)]
pub struct Tracker {
    partial: Partial,
    /// The scan of a JSON answer (`None` for SSE).
    json: Option<Box<Scan>>,
    output_seen: bool,
    counted: u32,
    usage: Option<u32>,
}

impl Tracker {
    pub fn new(sse: bool) -> Tracker {
        Tracker {
            partial: Partial::None,
            json: (!sse).then(|| Box::new(Scan::new(false))),
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
        if let Some(scan) = &mut self.json {
            scan.feed(chunk);
            return seen;
        }
        let before = self.tokens();
        let mut rest = chunk;
        while !rest.is_empty() {
            let (seg, ended) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    let seg = &rest[..i];
                    rest = &rest[i + 1..];
                    (seg, true)
                }
                None => (std::mem::take(&mut rest), false),
            };
            if ended && matches!(self.partial, Partial::None) {
                self.event_line(seg, &mut seen);
                continue;
            }
            self.carry(seg);
            if ended {
                self.end_partial(&mut seen);
            }
        }
        seen.progressed = self.tokens() != before;
        seen
    }

    /// The body ended: for a JSON answer, its output and usage.
    pub fn finish(&mut self) -> Seen {
        let mut seen = Seen::default();
        let Some(mut scan) = self.json.take() else {
            return seen;
        };
        if let Some(e) = scan.finish() {
            seen.error = e.error;
            let n = e.output_choices;
            self.counted = self.counted.saturating_add(n);
            self.usage = e.usage.or(self.usage);
            seen.first_output = (n > 0 || self.tokens() > 0) && !self.output_seen;
            self.output_seen |= seen.first_output;
            seen.progressed = self.tokens() > 0;
        }
        seen
    }

    /// Adds `seg` (no newline in it) to the line a chunk ended inside of.
    fn carry(&mut self, mut seg: &[u8]) {
        loop {
            match &mut self.partial {
                Partial::None => {
                    self.partial = Partial::Head {
                        buf: [0; HEAD],
                        len: 0,
                    }
                }
                Partial::Head { buf, len } => {
                    let take = (HEAD - *len).min(seg.len());
                    buf[*len..*len + take].copy_from_slice(&seg[..take]);
                    *len += take;
                    seg = &seg[take..];
                    if seg.is_empty() {
                        return;
                    }
                    // Longer than the head: a data line is scanned from here on.
                    self.partial = match data_of(&buf[..]) {
                        Some(data) => {
                            let mut scan = Box::new(Scan::new(true));
                            scan.feed(data);
                            Partial::Data(scan)
                        }
                        None => Partial::Skip,
                    };
                }
                Partial::Data(scan) => return scan.feed(seg),
                Partial::Skip => return,
            }
        }
    }

    /// The carried line ended.
    fn end_partial(&mut self, seen: &mut Seen) {
        match std::mem::take(&mut self.partial) {
            Partial::Head { buf, len } => self.event_line(&buf[..len], seen),
            Partial::Data(mut scan) => {
                if let Some(e) = scan.finish() {
                    self.event(e, seen);
                }
            }
            Partial::None | Partial::Skip => {}
        }
    }

    fn event_line(&mut self, line: &[u8], seen: &mut Seen) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = data_of(line) else {
            return;
        };
        if data == b"[DONE]" {
            seen.done = true;
            return;
        }
        if let Some(e) = event::read(data, true) {
            self.event(e, seen);
        }
    }

    /// One SSE event's fields.
    fn event(&mut self, e: EventInfo, seen: &mut Seen) {
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
        let mut t = Tracker::new(true);
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
    fn json_answers_are_read_at_the_end_whatever_their_size() {
        let mut t = Tracker::new(false);
        t.feed(br#"{"choices":[{"message":{"content":"hi"}}],"#);
        t.feed(br#""usage":{"completion_tokens":5}}"#);
        let s = t.finish();
        assert!(s.first_output && s.progressed && t.tokens() == 5);
        // 64 MiB of content before the usage: read, nothing kept.
        let mut t = Tracker::new(false);
        t.feed(br#"{"choices":[{"text":""#);
        let block = vec![b'a'; 1 << 20];
        for _ in 0..64 {
            t.feed(&block);
        }
        t.feed(br#""}],"usage":{"completion_tokens":9}}"#);
        let s = t.finish();
        assert!(s.first_output && t.tokens() == 9);
        let mut t = Tracker::new(false);
        t.feed(b"0123456789 junk");
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
    fn lines_of_any_length_count_whole_or_split_anywhere() {
        for len in [32, HEAD + 20, 3 << 20] {
            let mut all = padded_event(len);
            all.extend_from_slice(b"\r\n\n");
            all.extend_from_slice(ev("b").as_bytes());
            let splits = [
                None,
                Some(1),
                Some(5),
                Some(HEAD - 1),
                Some(HEAD),
                Some(HEAD + 1),
                Some(len / 2),
                Some(len),
                Some(len + 1),
            ];
            for split in splits {
                let mut t = Tracker::new(true);
                match split {
                    None => {
                        t.feed(&all);
                    }
                    Some(at) => {
                        let (x, y) = all.split_at(at.min(all.len()));
                        t.feed(x);
                        t.feed(y);
                    }
                }
                assert_eq!(t.tokens(), 2, "len {len} split {split:?}");
                assert!(matches!(t.partial, Partial::None));
            }
        }
        // Several events, a comment and [DONE], fed byte by byte or at once.
        let text = format!(
            "{}{}: comment\r\n{}data: [DONE]\r\n\n",
            ev("a"),
            ev(""),
            ev("c")
        );
        let mut whole = Tracker::new(true);
        let s = whole.feed(text.as_bytes());
        assert!(s.first_output && s.progressed && s.done);
        let mut bytes = Tracker::new(true);
        let mut done = false;
        for b in text.as_bytes() {
            done |= bytes.feed(std::slice::from_ref(b)).done;
        }
        assert_eq!((whole.tokens(), bytes.tokens()), (2, 2));
        assert!(bytes.output_seen() && done);
    }

    #[test]
    fn an_endless_line_holds_no_memory() {
        let mut t = Tracker::new(true);
        let junk = vec![b'x'; 4 << 20];
        t.feed(&junk);
        t.feed(&junk);
        assert!(matches!(t.partial, Partial::Skip));
        t.feed(b"\n");
        t.feed(ev("z").as_bytes());
        assert_eq!(t.tokens(), 1);
        // An endless data line is scanned, not kept.
        t.feed(b"data: {\"choices\":[{\"text\":\"");
        for _ in 0..4 {
            t.feed(&junk);
        }
        assert!(matches!(t.partial, Partial::Data(_)));
        t.feed(b"\"}]}\n\n");
        assert_eq!(t.tokens(), 2);
    }
}
