//! A push scanner of one JSON document, fed chunk by chunk as an upstream answer
//! streams through, that reads what the lifecycle needs from it ([`EventInfo`]: the
//! choices carrying output, `usage.completion_tokens`, a non-null `error`) in constant
//! memory: about a hundred bytes of state whatever the document's size, nothing kept
//! of the bytes themselves.
//!
//! Guarantee: for every document serde_json accepts, [`Scan::finish`] answers exactly
//! what `event::read` answers for the whole document (the same field rules: last
//! occurrence of a repeated key wins, a field of an unexpected type counts as absent).
//! It refuses (`None`) what breaks JSON's grammar as serde_json does: structure,
//! literals, number syntax, string escapes (unpaired surrogates included), control
//! characters and invalid UTF-8 in strings, nesting deeper than serde_json's 127
//! levels, and anything after the document. The one difference: a number beyond
//! f64's range (`1e400`), which serde_json refuses, is read here as a number; only a
//! broken answer has one, and it only changes that answer's token count.
//!
//! How: a byte-level state machine (`Lex`; strings and numbers in `lex`) with a bit
//! per nesting level (object or array), plus the *role* of the containers on the five outer levels that matter
//! (the top object, its `choices` array, a choice, its `message`/`delta`, `usage`)
//! and the field each of those objects' last key named. A value's kind (null,
//! non-negative integer, (non-)empty string or array, other) is known when it ends,
//! and is then credited to the field it belongs to.

use super::event::EventInfo;
use crate::tokenize::id_list::is_ws;
use plain::skip_plain;

mod lex;
mod plain;

/// serde_json's nesting limit: 127 levels parse, the 128th is refused.
const MAX_DEPTH: u8 = 127;
/// Levels whose containers can have a role (top, choices, choice, message, and the
/// value containers inside a message).
const ROLE_DEPTH: usize = 5;
/// Longest key compared with the names looked for (longer keys are none of them).
const KEY_MAX: usize = 24;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Ignore,
    Top,
    Choices,
    Choice,
    Message,
    Usage,
}

/// What a value is to the scan: the field of the object it is in, an element of
/// `choices`, the document itself, or nothing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Field {
    Other,
    Root,
    Elem,
    Choices,
    Usage,
    Error,
    Text,
    Message,
    Content,
    Reasoning,
    ToolCalls,
    CompletionTokens,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Null,
    U64(u64),
    /// A string; `true`: not empty.
    Str(bool),
    /// An array; `true`: not empty.
    Seq(bool),
    Other,
}

fn nonempty(k: Kind) -> bool {
    matches!(k, Kind::Str(true) | Kind::Seq(true))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lex {
    /// A value must come (after `:`, `,` in an array, or at the start).
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    Colon,
    /// After a value inside a container: `,` or the container's close.
    After,
    Str,
    Esc,
    /// In a `\uXXXX` escape, `hex_n` digits read.
    Hex,
    /// After a leading surrogate: its trailing one's `\`, then `u`.
    LowEsc,
    LowU,
    /// Continuation bytes of a UTF-8 sequence.
    Utf8,
    Num(Num),
    /// In `true` / `false` / `null`.
    Lit,
    /// The document ended; only whitespace may follow.
    Done,
    Failed,
}

/// The scan of one document (module docs).
#[derive(Clone, Debug)]
pub struct Scan {
    /// Choices carry `delta` (a stream chunk), else `message`.
    delta: bool,
    lex: Lex,
    depth: u8,
    /// Bit `d`: level `d + 1` is an object.
    objects: u128,
    roles: [Role; ROLE_DEPTH],
    fields: [Field; ROLE_DEPTH],
    in_key: bool,
    str_any: bool,
    hex_n: u8,
    hex: u16,
    low: bool,
    utf8_need: u8,
    utf8_lo: u8,
    utf8_hi: u8,
    key: [u8; KEY_MAX],
    /// Bytes in `key`; `u8::MAX`: not one of the names looked for.
    key_len: u8,
    neg: bool,
    int_only: bool,
    over: bool,
    num: u64,
    lit: &'static [u8],
    lit_pos: u8,
    info: EventInfo,
    choices: u32,
    text: bool,
    msg: bool,
    content: bool,
    reasoning: bool,
    tools: bool,
    usage: Option<u32>,
}

impl Scan {
    /// A scan of a chunk (`delta`) or a whole answer (`message`) object.
    pub fn new(delta: bool) -> Scan {
        Scan {
            delta,
            lex: Lex::Value,
            depth: 0,
            objects: 0,
            roles: [Role::Ignore; ROLE_DEPTH],
            fields: [Field::Other; ROLE_DEPTH],
            in_key: false,
            str_any: false,
            hex_n: 0,
            hex: 0,
            low: false,
            utf8_need: 0,
            utf8_lo: 0,
            utf8_hi: 0,
            key: [0; KEY_MAX],
            key_len: 0,
            neg: false,
            int_only: true,
            over: false,
            num: 0,
            lit: b"",
            lit_pos: 0,
            info: EventInfo::default(),
            choices: 0,
            text: false,
            msg: false,
            content: false,
            reasoning: false,
            tools: false,
            usage: None,
        }
    }

    /// Whether the bytes so far already break the grammar (nothing more is read).
    pub fn failed(&self) -> bool {
        matches!(self.lex, Lex::Failed)
    }

    /// The next bytes of the document.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while i < chunk.len() {
            match self.lex {
                Lex::Failed => return,
                // Strings, keys and values, are most of an answer: a run of plain
                // ASCII is taken whole, as `string_byte` would take it byte by byte.
                Lex::Str => {
                    let start = i;
                    i = skip_plain(chunk, i);
                    if i > start {
                        self.str_any = true;
                        if self.in_key {
                            self.key_run(&chunk[start..i]);
                        }
                    }
                    if i == chunk.len() {
                        return;
                    }
                }
                _ => {}
            }
            self.byte(chunk[i]);
            i += 1;
        }
    }

    /// The document ended: what it says, or `None` if it is not one JSON document.
    pub fn finish(&mut self) -> Option<EventInfo> {
        if let Lex::Num(n) = self.lex {
            if self.depth == 0 && matches!(n, Num::Zero | Num::Int | Num::Frac | Num::Exp) {
                self.end_number();
            }
        }
        matches!(self.lex, Lex::Done).then_some(self.info)
    }

    fn fail(&mut self) {
        self.lex = Lex::Failed;
    }

    fn byte(&mut self, b: u8) {
        match self.lex {
            Lex::Value | Lex::ValueOrClose => {
                if is_ws(b) {
                } else if b == b']' && matches!(self.lex, Lex::ValueOrClose) {
                    self.close(false, false);
                } else {
                    self.start_value(b);
                }
            }
            Lex::KeyOrClose | Lex::Key => {
                if is_ws(b) {
                } else if b == b'"' {
                    self.start_string(true);
                } else if b == b'}' && matches!(self.lex, Lex::KeyOrClose) {
                    self.close(true, false);
                } else {
                    self.fail();
                }
            }
            Lex::Colon => match b {
                b':' => self.lex = Lex::Value,
                _ if is_ws(b) => {}
                _ => self.fail(),
            },
            Lex::After => {
                let object = self.top_is_object();
                match b {
                    b',' => self.lex = if object { Lex::Key } else { Lex::Value },
                    b'}' if object => self.close(true, true),
                    b']' if !object => self.close(false, true),
                    _ if is_ws(b) => {}
                    _ => self.fail(),
                }
            }
            Lex::Done => {
                if !is_ws(b) {
                    self.fail();
                }
            }
            Lex::Str => self.string_byte(b),
            Lex::Esc => self.escape(b),
            Lex::Hex => self.hex_digit(b),
            Lex::LowEsc => match b {
                b'\\' => self.lex = Lex::LowU,
                _ => self.fail(),
            },
            Lex::LowU => match b {
                b'u' => {
                    self.lex = Lex::Hex;
                    self.hex_n = 0;
                    self.hex = 0;
                }
                _ => self.fail(),
            },
            Lex::Utf8 => {
                if !(self.utf8_lo..=self.utf8_hi).contains(&b) {
                    return self.fail();
                }
                self.utf8_need -= 1;
                (self.utf8_lo, self.utf8_hi) = (0x80, 0xbf);
                if self.utf8_need == 0 {
                    self.lex = Lex::Str;
                }
            }
            Lex::Num(n) => self.number_byte(n, b),
            Lex::Lit => {
                if self.lit.get(usize::from(self.lit_pos)) != Some(&b) {
                    return self.fail();
                }
                self.lit_pos += 1;
                if usize::from(self.lit_pos) == self.lit.len() {
                    let kind = if self.lit == b"null" {
                        Kind::Null
                    } else {
                        Kind::Other
                    };
                    self.value_done(kind, Role::Ignore);
                }
            }
            Lex::Failed => {}
        }
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && self.objects >> (self.depth - 1) & 1 == 1
    }

    /// What a value at the current position is to the scan.
    fn field_here(&self) -> Field {
        let d = usize::from(self.depth);
        if d == 0 {
            return Field::Root;
        }
        if d > ROLE_DEPTH {
            return Field::Other;
        }
        match self.roles[d - 1] {
            Role::Ignore => Field::Other,
            Role::Choices => Field::Elem,
            _ => self.fields[d - 1],
        }
    }

    fn start_value(&mut self, b: u8) {
        match b {
            b'{' | b'[' => {
                let object = b == b'{';
                let role = match (self.field_here(), object) {
                    (Field::Root, true) => Role::Top,
                    (Field::Usage, true) => Role::Usage,
                    (Field::Elem, true) => Role::Choice,
                    (Field::Message, true) => Role::Message,
                    (Field::Choices, false) => Role::Choices,
                    _ => Role::Ignore,
                };
                match role {
                    Role::Top => self.info = EventInfo::default(),
                    Role::Usage => self.usage = None,
                    Role::Choice => (self.text, self.msg) = (false, false),
                    Role::Message => {
                        (self.content, self.reasoning, self.tools) = (false, false, false)
                    }
                    Role::Choices => self.choices = 0,
                    Role::Ignore => {}
                }
                if self.depth >= MAX_DEPTH {
                    return self.fail();
                }
                let d = usize::from(self.depth);
                if object {
                    self.objects |= 1 << d;
                } else {
                    self.objects &= !(1 << d);
                }
                if d < ROLE_DEPTH {
                    self.roles[d] = role;
                    self.fields[d] = Field::Other;
                }
                self.depth += 1;
                self.lex = if object {
                    Lex::KeyOrClose
                } else {
                    Lex::ValueOrClose
                };
            }
            b'"' => self.start_string(false),
            b'-' | b'0'..=b'9' => {
                (self.neg, self.int_only, self.over, self.num) = (b == b'-', true, false, 0);
                self.lex = Lex::Num(match b {
                    b'-' => Num::Minus,
                    b'0' => Num::Zero,
                    _ => {
                        self.num = u64::from(b - b'0');
                        Num::Int
                    }
                });
            }
            b't' | b'f' | b'n' => {
                self.lit = match b {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                self.lit_pos = 1;
                self.lex = Lex::Lit;
            }
            _ => self.fail(),
        }
    }

    /// The container on the current level closes (`object`: with `}`); `nonempty`:
    /// it had a member.
    fn close(&mut self, object: bool, nonempty: bool) {
        if self.depth == 0 || self.top_is_object() != object {
            return self.fail();
        }
        let d = usize::from(self.depth);
        let role = if d <= ROLE_DEPTH {
            self.roles[d - 1]
        } else {
            Role::Ignore
        };
        self.depth -= 1;
        let kind = if object {
            Kind::Other
        } else {
            Kind::Seq(nonempty)
        };
        self.value_done(kind, role);
    }

    /// A value of `kind` ended (`closed`: the role of the container that just closed,
    /// if it was one); credit it to its field.
    fn value_done(&mut self, kind: Kind, closed: Role) {
        match self.field_here() {
            Field::Choices => {
                self.info.output_choices = if closed == Role::Choices {
                    self.choices
                } else {
                    0
                }
            }
            Field::Usage => {
                self.info.usage = if closed == Role::Usage {
                    self.usage
                } else {
                    None
                }
            }
            Field::Error => self.info.error = kind != Kind::Null,
            Field::Elem => {
                if closed == Role::Choice {
                    let out = u32::from(self.text || self.msg);
                    self.choices = self.choices.saturating_add(out);
                }
            }
            Field::Text => self.text = nonempty(kind),
            Field::Message => {
                self.msg = closed == Role::Message && (self.content || self.reasoning || self.tools)
            }
            Field::Content => self.content = nonempty(kind),
            Field::Reasoning => self.reasoning = nonempty(kind),
            Field::ToolCalls => self.tools = nonempty(kind),
            Field::CompletionTokens => {
                self.usage = match kind {
                    Kind::U64(v) => Some(v.min(u64::from(u32::MAX)) as u32),
                    _ => None,
                }
            }
            Field::Root | Field::Other => {}
        }
        self.lex = if self.depth == 0 {
            Lex::Done
        } else {
            Lex::After
        };
    }

    fn classify(&self, role: Role, key: &[u8]) -> Field {
        match (role, key) {
            (Role::Top, b"choices") => Field::Choices,
            (Role::Top, b"usage") => Field::Usage,
            (Role::Top, b"error") => Field::Error,
            (Role::Choice, b"text") => Field::Text,
            (Role::Choice, b"delta") if self.delta => Field::Message,
            (Role::Choice, b"message") if !self.delta => Field::Message,
            (Role::Message, b"content") => Field::Content,
            (Role::Message, b"reasoning_content") => Field::Reasoning,
            (Role::Message, b"tool_calls") => Field::ToolCalls,
            (Role::Usage, b"completion_tokens") => Field::CompletionTokens,
            _ => Field::Other,
        }
    }
}

#[cfg(test)]
#[path = "jscan_tests.rs"]
mod tests;
