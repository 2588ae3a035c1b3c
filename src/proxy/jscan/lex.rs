//! The lexical half of the scan ([`super::Scan`]): strings (escapes, surrogate pairs,
//! UTF-8, the keys compared with the names looked for), numbers and the JSON
//! grammar's rules for them, each checked as serde_json checks them.

use super::{Kind, Lex, Num, Role, Scan, KEY_MAX, ROLE_DEPTH};

impl Scan {
    pub(super) fn start_string(&mut self, key: bool) {
        self.in_key = key;
        self.str_any = false;
        self.key_len = 0;
        self.lex = Lex::Str;
    }

    /// One decoded character of a key (`None`: not ASCII).
    pub(super) fn key_char(&mut self, c: Option<u8>) {
        if !self.in_key || self.key_len == u8::MAX {
            return;
        }
        match c {
            Some(c) if usize::from(self.key_len) < KEY_MAX => {
                self.key[usize::from(self.key_len)] = c;
                self.key_len += 1;
            }
            _ => self.key_len = u8::MAX,
        }
    }

    /// A run of plain ASCII characters of a key (`plain::skip_plain`): as many calls
    /// of [`Scan::key_char`].
    pub(super) fn key_run(&mut self, run: &[u8]) {
        if self.key_len == u8::MAX {
            return;
        }
        let n = usize::from(self.key_len);
        match self.key.get_mut(n..n + run.len()) {
            Some(dst) => {
                dst.copy_from_slice(run);
                self.key_len += run.len() as u8;
            }
            None => self.key_len = u8::MAX,
        }
    }

    pub(super) fn string_byte(&mut self, b: u8) {
        match b {
            b'"' => self.end_string(),
            b'\\' => self.lex = Lex::Esc,
            0..=0x1f => self.fail(),
            0x20..=0x7f => {
                self.str_any = true;
                self.key_char(Some(b));
            }
            _ => {
                let (need, lo, hi) = match b {
                    0xc2..=0xdf => (1, 0x80, 0xbf),
                    0xe0 => (2, 0xa0, 0xbf),
                    0xed => (2, 0x80, 0x9f),
                    0xe1..=0xef => (2, 0x80, 0xbf),
                    0xf0 => (3, 0x90, 0xbf),
                    0xf1..=0xf3 => (3, 0x80, 0xbf),
                    0xf4 => (3, 0x80, 0x8f),
                    _ => return self.fail(),
                };
                (self.utf8_need, self.utf8_lo, self.utf8_hi) = (need, lo, hi);
                self.str_any = true;
                self.key_char(None);
                self.lex = Lex::Utf8;
            }
        }
    }

    pub(super) fn escape(&mut self, b: u8) {
        let c = match b {
            b'"' | b'\\' | b'/' => b,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                (self.hex_n, self.hex, self.low) = (0, 0, false);
                self.lex = Lex::Hex;
                return;
            }
            _ => return self.fail(),
        };
        self.str_any = true;
        self.key_char(Some(c));
        self.lex = Lex::Str;
    }

    pub(super) fn hex_digit(&mut self, b: u8) {
        let Some(v) = char::from(b).to_digit(16) else {
            return self.fail();
        };
        self.hex = self.hex << 4 | v as u16;
        self.hex_n += 1;
        if self.hex_n < 4 {
            return;
        }
        let n = self.hex;
        let trailing = (0xdc00..=0xdfff).contains(&n);
        self.str_any = true;
        if self.low {
            // The second half of a pair must be a trailing surrogate.
            if !trailing {
                return self.fail();
            }
            self.low = false;
            self.key_char(None);
            self.lex = Lex::Str;
        } else if trailing {
            self.fail();
        } else if (0xd800..=0xdbff).contains(&n) {
            self.low = true;
            self.lex = Lex::LowEsc;
        } else {
            self.key_char(u8::try_from(n).ok().filter(u8::is_ascii));
            self.lex = Lex::Str;
        }
    }

    pub(super) fn end_string(&mut self) {
        if !self.in_key {
            return self.value_done(Kind::Str(self.str_any), Role::Ignore);
        }
        self.in_key = false;
        let d = usize::from(self.depth);
        if (1..=ROLE_DEPTH).contains(&d) {
            let key = match self.key_len {
                u8::MAX => &[][..],
                n => &self.key[..usize::from(n)],
            };
            self.fields[d - 1] = self.classify(self.roles[d - 1], key);
        }
        self.lex = Lex::Colon;
    }

    pub(super) fn number_byte(&mut self, n: Num, b: u8) {
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, _) if digit => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::E,
            (Num::Int, _) if digit => Num::Int,
            (Num::Dot | Num::Frac, _) if digit => Num::Frac,
            (Num::E, b'+' | b'-') => Num::ESign,
            (Num::E | Num::ESign | Num::Exp, _) if digit => Num::Exp,
            (Num::Zero | Num::Int | Num::Frac | Num::Exp, _) => {
                // The number ended at the byte before: read this one after it.
                self.end_number();
                return self.byte(b);
            }
            _ => return self.fail(),
        };
        if next == Num::Int {
            let d = u64::from(b - b'0');
            match self.num.checked_mul(10).and_then(|v| v.checked_add(d)) {
                Some(v) => self.num = v,
                None => self.over = true,
            }
        }
        if matches!(next, Num::Dot | Num::E) {
            self.int_only = false;
        }
        self.lex = Lex::Num(next);
    }

    pub(super) fn end_number(&mut self) {
        let kind = if !self.neg && self.int_only && !self.over {
            Kind::U64(self.num)
        } else {
            Kind::Other
        };
        self.value_done(kind, Role::Ignore);
    }
}
