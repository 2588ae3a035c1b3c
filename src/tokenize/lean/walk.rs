//! The walk itself (`tokenize::lean`): one text's pieces through the added-token
//! passes, the pre-tokenizer steps and the model, depth first over borrowed slices,
//! ids appended in order. Pure: no I/O, no allocation beyond a piece's own
//! transformed copy (`ByteLevel`'s bytes, `Metaspace`'s markers).
//!
//! A `WordLevel` word's lookup is issued when the word comes and answered
//! [`AHEAD`] words later ([`Pending`]): the table's line is prefetched meanwhile, so
//! the misses of a prompt's words overlap instead of coming one after the other. Every
//! other id waits for the pending ones ([`Walk::emit`]), so the order is the text's.

use super::dfa_split::cover;
use super::state::{Added, Lean};
use super::vocab::{Key, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::utils::SysRegex;
use tokenizers::{
    Model as _, ModelWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

/// NFC, NFD, NFKC or NFKD: normalizers that leave ASCII text as it is.
pub(super) fn is_unicode_form(n: &NormalizerWrapper) -> bool {
    matches!(
        n,
        NormalizerWrapper::NFC(_)
            | NormalizerWrapper::NFD(_)
            | NormalizerWrapper::NFKC(_)
            | NormalizerWrapper::NFKD(_)
    )
}

/// Splits `text` on `added` (leftmost-longest, as HF), calling `f` with each non-empty
/// piece and the id when it is an added token.
pub(super) fn split_added(
    added: Option<&Added>,
    text: &str,
    mut f: impl FnMut(&str, Option<u32>) -> Result<(), String>,
) -> Result<(), String> {
    let Some(a) = added else {
        return if text.is_empty() {
            Ok(())
        } else {
            f(text, None)
        };
    };
    let mut at = 0;
    for m in a.ac.find_iter(text) {
        if at < m.start() {
            f(&text[at..m.start()], None)?;
        }
        f(
            &text[m.start()..m.end()],
            Some(a.ids[m.pattern().as_usize()]),
        )?;
        at = m.end();
    }
    if at < text.len() {
        f(&text[at..], None)?;
    }
    Ok(())
}

/// [`cover`] with the matches of a fancy-regex `re`, as HF's `Pattern for &SysRegex`.
fn regex_pieces<'t>(
    re: &SysRegex,
    s: &'t str,
    f: impl FnMut(&'t str, bool) -> Result<(), String>,
) -> Result<(), String> {
    cover(s, re.find_iter(s).map(Ok), f)
}

/// `WordLevel` lookups kept pending: enough for the misses of a prompt's words to
/// overlap, few enough that their lines are still in L1 when they are answered.
const AHEAD: usize = 16;

/// Keys of the words whose `WordLevel` lookups are pending, oldest first (a ring).
/// Only `WordLevel` words wait here, and a walk has one model.
#[derive(Default)]
pub(super) struct Pending {
    keys: [Key; AHEAD],
    head: usize,
    len: usize,
}

impl Pending {
    /// Adds `k` last; when the ring was full, takes out and returns the oldest key.
    #[inline]
    fn push(&mut self, k: Key) -> Option<Key> {
        let oldest = if self.len == AHEAD { self.pop() } else { None };
        self.keys[(self.head + self.len) % AHEAD] = k;
        self.len += 1;
        oldest
    }

    /// Takes out the oldest key.
    #[inline]
    fn pop(&mut self) -> Option<Key> {
        if self.len == 0 {
            return None;
        }
        let k = self.keys[self.head];
        self.head = (self.head + 1) % AHEAD;
        self.len -= 1;
        Some(k)
    }
}

pub(super) struct Walk<'a, 'w> {
    pub(super) lean: &'a Lean,
    pub(super) steps: &'a [&'a PreTokenizerWrapper],
    pub(super) model: &'a ModelWrapper,
    pub(super) words: Option<&'a mut crate::tokenize::words::Words<'w>>,
    pub(super) out: &'a mut Vec<u32>,
    /// The piece being walked starts at the text's original start (HF's
    /// `offsets_original().0 == 0`, which `Metaspace`'s `First` scheme reads): its
    /// added-token piece started there and each step kept it at offset 0.
    pub(super) at_start: bool,
    /// Lookups not yet answered (see the module doc).
    pub(super) pending: Pending,
}

impl Walk<'_, '_> {
    /// Appends `id` after the pending lookups' ids.
    pub(super) fn emit(&mut self, id: u32) -> Result<(), String> {
        self.flush()?;
        self.out.push(id);
        Ok(())
    }

    /// Answers every pending lookup, in order.
    pub(super) fn flush(&mut self) -> Result<(), String> {
        let Some(v) = &self.lean.vocab else {
            return Ok(());
        };
        while let Some(k) = self.pending.pop() {
            self.answer(v, k)?;
        }
        Ok(())
    }

    /// Appends the id of the word of `k` (the unknown token's if it has none).
    #[inline]
    fn answer(&mut self, v: &Vocab, k: Key) -> Result<(), String> {
        let id = self.or_unk(v.find(k))?;
        self.out.push(id);
        Ok(())
    }

    /// A `WordLevel` word's id: its own, else the unknown token's.
    #[inline]
    fn or_unk(&self, id: Option<u32>) -> Result<u32, String> {
        id.or(self.lean.unk).ok_or_else(|| NO_UNK.to_owned())
    }

    /// A normalized piece between non-normalized added tokens: the normalized added
    /// tokens, then the pre-tokenizer and the model on what is between them.
    pub(super) fn normalized_piece(&mut self, s: &str) -> Result<(), String> {
        let added = self.lean.normalized.as_ref();
        split_added(added, s, |piece, id| match id {
            Some(id) => self.emit(id),
            None => self.child(0, s, piece),
        })
    }

    /// Step `i` on `piece`, a slice of `parent`: at the text's start only if
    /// `parent` is and `piece` starts where it does.
    fn child(&mut self, i: usize, parent: &str, piece: &str) -> Result<(), String> {
        let offset = (piece.as_ptr() as usize).wrapping_sub(parent.as_ptr() as usize);
        self.child_at(i, offset, piece)
    }

    /// Step `i` on a piece `offset` bytes into its parent (see [`Walk::child`]).
    fn child_at(&mut self, i: usize, offset: usize, piece: &str) -> Result<(), String> {
        let was = self.at_start;
        self.at_start = was && offset == 0;
        let r = self.step(i, piece);
        self.at_start = was;
        r
    }

    /// Pre-tokenizer step `i` on one non-empty piece (the model past the last step).
    fn step(&mut self, i: usize, s: &str) -> Result<(), String> {
        let Some(&p) = self.steps.get(i) else {
            return self.model_ids(s);
        };
        match p {
            PreTokenizerWrapper::WhitespaceSplit(_) if s.is_ascii() => {
                // ASCII text: `char::is_whitespace` on a byte, without decoding chars.
                let mut start = 0;
                for (at, &b) in s.as_bytes().iter().enumerate() {
                    if matches!(b, b'\t'..=b'\r' | b' ') {
                        if start < at {
                            self.child_at(i + 1, start, &s[start..at])?;
                        }
                        start = at + 1;
                    }
                }
                if start < s.len() {
                    self.child_at(i + 1, start, &s[start..])?;
                }
                Ok(())
            }
            PreTokenizerWrapper::WhitespaceSplit(_) => {
                for w in s.split(char::is_whitespace).filter(|w| !w.is_empty()) {
                    self.child(i + 1, s, w)?;
                }
                Ok(())
            }
            PreTokenizerWrapper::Whitespace(_) => {
                let re = &self.lean.ws_re;
                for m in re.find_iter(s) {
                    if !m.as_str().is_empty() {
                        self.child_at(i + 1, m.start(), m.as_str())?;
                    }
                }
                Ok(())
            }
            PreTokenizerWrapper::Split(sp) => self.split(i, sp, s),
            PreTokenizerWrapper::ByteLevel(bl) => self.byte_level(i, bl, s),
            PreTokenizerWrapper::Metaspace(m) => self.metaspace(i, m, s),
            _ => Err("unsupported pre-tokenizer step".into()),
        }
    }

    fn split(&mut self, i: usize, sp: &Split, s: &str) -> Result<(), String> {
        let keep_matches = sp.behavior == SplitDelimiterBehavior::Isolated;
        let lean = self.lean;
        let mut each = |piece: &str, is_match: bool| {
            let is_match = is_match != sp.invert;
            if piece.is_empty() || (is_match && !keep_matches) {
                return Ok(());
            }
            self.child(i + 1, s, piece)
        };
        match lean.split_dfa.get(i).and_then(Option::as_ref) {
            Some(d) => d.pieces(s, &mut each),
            None => regex_pieces(&sp.regex, s, &mut each),
        }
    }

    fn byte_level(&mut self, i: usize, bl: &ByteLevel, s: &str) -> Result<(), String> {
        let prefixed;
        let s = if bl.add_prefix_space && !s.starts_with(' ') {
            prefixed = format!(" {s}");
            prefixed.as_str()
        } else {
            s
        };
        if !bl.use_regex {
            return self.mapped(i, s);
        }
        let lean = self.lean;
        let mut each = |piece: &str, _| {
            if piece.is_empty() {
                return Ok(());
            }
            let was = self.at_start;
            self.at_start = was && std::ptr::eq(piece.as_ptr(), s.as_ptr());
            let r = self.mapped(i, piece);
            self.at_start = was;
            r
        };
        match &lean.byte_dfa {
            Some(d) => d.pieces(s, &mut each),
            None => regex_pieces(&lean.byte_re, s, &mut each),
        }
    }

    /// HF's `Metaspace`: spaces become the replacement char, which `Always` also puts
    /// first, and `First` only on the piece at the text's start; with `split`, the piece is
    /// cut before each replacement char that another char follows (HF's
    /// `MergedWithNext`: a replacement char followed by another, or last, stands alone).
    fn metaspace(&mut self, i: usize, m: &Metaspace, s: &str) -> Result<(), String> {
        let rep = m.get_replacement();
        let mut t = String::with_capacity(s.len() + 4);
        let prepend = match m.get_prepend_scheme() {
            PrependScheme::Always => true,
            PrependScheme::First => self.at_start,
            PrependScheme::Never => false,
        };
        if prepend && !s.starts_with([' ', rep]) {
            t.push(rep);
        }
        for c in s.chars() {
            t.push(if c == ' ' { rep } else { c });
        }
        if !m.get_split() {
            return self.step(i + 1, &t);
        }
        let mut start = 0;
        let mut chars = t.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            if c != rep {
                continue;
            }
            // (A last one stands alone too; the flush below emits it.)
            let next_is_rep = chars.peek().is_some_and(|&(_, n)| n == rep);
            // Everything before this replacement char is a piece of its own...
            if start < at {
                self.child_at(i + 1, start, &t[start..at])?;
            }
            start = at;
            // ...and a replacement char that cannot merge with what follows, too.
            if next_is_rep {
                let end = at + c.len_utf8();
                self.child_at(i + 1, at, &t[at..end])?;
                start = end;
            }
        }
        if start < t.len() {
            self.child_at(i + 1, start, &t[start..])?;
        }
        Ok(())
    }

    /// `piece` through GPT-2's byte table, then the next step.
    fn mapped(&mut self, i: usize, piece: &str) -> Result<(), String> {
        let mut m = String::with_capacity(piece.len() * 2);
        m.extend(piece.bytes().map(|b| self.lean.byte_char[b as usize]));
        self.step(i + 1, &m)
    }

    fn model_ids(&mut self, w: &str) -> Result<(), String> {
        match self.model {
            ModelWrapper::WordLevel(wl) => match &self.lean.vocab {
                Some(v) => match v.key(w) {
                    Some(k) => {
                        if let Some(oldest) = self.pending.push(k) {
                            self.answer(v, oldest)?;
                        }
                    }
                    None => {
                        let id = self.or_unk(v.get(w))?;
                        self.emit(id)?;
                    }
                },
                None => {
                    let id = self.or_unk(wl.token_to_id(w))?;
                    self.out.push(id);
                }
            },
            m => {
                let run = |w: &str| {
                    let tokens = m.tokenize(w).map_err(|e| e.to_string())?;
                    Ok::<_, String>(tokens.iter().map(|t| t.id).collect())
                };
                match self.words.as_deref_mut() {
                    Some(cache) => cache.ids(w, self.out, run)?,
                    None => self.out.extend(run(w)?),
                }
            }
        }
        Ok(())
    }
}

const NO_UNK: &str = "word not in the vocabulary and no unknown token";
