//! Token ids by a lean walk of the tokenizer's own pipeline: the proxy's per-request
//! tokenization, on the critical path of every proxied request.
//!
//! Why: HF `tokenizers` keeps, for every piece of text it splits (each added-token
//! piece, each pre-tokenized word), a `NormalizedString`: a copy of the text, its
//! normalized form and a per-byte alignment vector (for offsets), and its models
//! return a `Token` with its own `String` per token. Routing needs the ids only. That
//! bookkeeping was 70–80 % of a prompt's tokenization (docs/PERFORMANCE.md, "Critical
//! path of a proxied request").
//!
//! What it runs: the same steps in the same order, with the tokenizer's own objects
//! wherever they decide anything:
//! 1. **Added tokens**, in HF's two passes: the non-normalized ones on the text, then
//!    the normalized ones on each normalized piece; leftmost-longest Aho-Corasick over
//!    the same patterns HF builds its tries from.
//! 2. **Normalizer**: the tokenizer's own, once per piece between added tokens (one
//!    `NormalizedString` per piece, not per word); an ASCII piece skips NFC, NFD, NFKC
//!    and NFKD, which leave ASCII as it is.
//! 3. **Pre-tokenizer**: `Sequence`, `Split` (the tokenizer's compiled regex, with
//!    `Isolated` or `Removed`), `ByteLevel`, `Metaspace`, `Whitespace` and
//!    `WhitespaceSplit`, walked
//!    depth first over borrowed slices (each of them splits one piece independently
//!    of the others, so depth first gives what HF's step-by-step pass gives).
//! 4. **Model**: a `WordLevel` vocabulary looked up in place; any other model's own
//!    `tokenize`, a deterministic BPE's (no dropout) through a per-thread cache of ids
//!    per word (`tokenize::words`).
//!
//! Exactness: [`Lean::new`] accepts a tokenizer only when every step is one of those,
//! no added token is `single_word`, `lstrip` or `rstrip` (and none is empty), special
//! tokens are split out (no `encode_special_tokens`), and its ids equal
//! `encode_fast`'s on a probe corpus (added tokens glued to words, whitespace runs,
//! punctuation, digits, Unicode). Anything else keeps the `ids::Fast` path. At run
//! time every [`CHECK_EVERY`]th text is tokenized both ways; a difference turns the
//! lean path off for that model for good, answers with HF's ids and is counted
//! (`kvroute_proxy_tokenize_lean_mismatches`).

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::utils::SysRegex;
use tokenizers::{
    Model as _, ModelWrapper, NormalizedString, Normalizer as _, NormalizerWrapper,
    PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

/// One text in this many is also tokenized by HF and compared.
pub(crate) const CHECK_EVERY: u64 = 4096;

/// HF's `ByteLevel` split (GPT-2's), compiled with the same engine as HF's.
const BYTE_LEVEL_RE: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// HF's `Whitespace` pre-tokenizer: the pieces are this regex's matches.
const WHITESPACE_RE: &str = r"\w+|[^\w\s]+";

/// Pre-tokenizer steps deeper than this are not walked (no real tokenizer nests so).
const MAX_STEPS: usize = 8;

/// One pass of added tokens: the automaton and the id of each pattern.
struct Added {
    ac: AhoCorasick,
    ids: Vec<u32>,
}

impl Added {
    fn new(patterns: Vec<(String, u32)>) -> Option<Added> {
        if patterns.is_empty() {
            return None;
        }
        let ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns.iter().map(|(p, _)| p.as_str()))
            .ok()?;
        Some(Added {
            ac,
            ids: patterns.into_iter().map(|(_, id)| id).collect(),
        })
    }
}

/// The lean path for one tokenizer (the one [`Lean::new`] was given).
pub(crate) struct Lean {
    plain: Option<Added>,
    normalized: Option<Added>,
    byte_re: SysRegex,
    ws_re: regex::Regex,
    /// GPT-2's byte → printable char table (`ByteLevel`).
    byte_char: [char; 256],
    /// `WordLevel`'s unknown-token id, when it has one.
    unk: Option<u32>,
    /// Ids per word of a deterministic BPE (`tokenize::words`).
    words: Option<super::words::WordCache>,
    texts: AtomicU64,
    off: AtomicBool,
    mismatches: AtomicU64,
}

impl std::fmt::Debug for Lean {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lean")
            .field("off", &self.off.load(Ordering::Relaxed))
            .field("mismatches", &self.mismatches.load(Ordering::Relaxed))
            .finish()
    }
}

/// GPT-2's table: printable bytes map to themselves, the others to U+0100 onwards.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        out[b as usize] = if printable(b) {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\u{FFFD}')
        };
    }
    out
}

/// The steps of a pre-tokenizer, `Sequence`s flattened; None if one is not supported.
fn steps(
    pre: Option<&PreTokenizerWrapper>,
) -> Option<smallvec::SmallVec<[&PreTokenizerWrapper; 4]>> {
    fn push<'a>(
        p: &'a PreTokenizerWrapper,
        out: &mut smallvec::SmallVec<[&'a PreTokenizerWrapper; 4]>,
    ) -> Option<()> {
        match p {
            PreTokenizerWrapper::Sequence(s) => {
                for q in s.as_ref() {
                    push(q, out)?;
                }
            }
            PreTokenizerWrapper::Split(s) => {
                if !matches!(
                    s.behavior,
                    SplitDelimiterBehavior::Isolated | SplitDelimiterBehavior::Removed
                ) {
                    return None;
                }
                out.push(p);
            }
            PreTokenizerWrapper::ByteLevel(_)
            | PreTokenizerWrapper::Metaspace(_)
            | PreTokenizerWrapper::Whitespace(_)
            | PreTokenizerWrapper::WhitespaceSplit(_) => out.push(p),
            _ => return None,
        }
        (out.len() <= MAX_STEPS).then_some(())
    }
    let mut out = smallvec::SmallVec::new();
    if let Some(p) = pre {
        push(p, &mut out)?;
    }
    Some(out)
}

/// Probe texts: the pieces glued in many orders (a fixed pseudo-random walk) plus
/// every added token's content next to words and spaces.
fn probes(tok: &Tokenizer) -> Vec<String> {
    const PIECES: &[&str] = &[
        "t1",
        "t42",
        "t999",
        "Hello",
        "world",
        "x",
        "it's",
        "I'll",
        "don't",
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        " \n ",
        ",",
        ".",
        "!?",
        "...",
        "(",
        ")",
        "{\"a\": 1}",
        "0",
        "123",
        "4567",
        "3.14",
        "é",
        "ÉCOLE",
        "naïve",
        "日本語",
        "한국어",
        "Привет",
        "\u{200b}",
        "\u{301}",
        "😀",
        "a\u{301}",
        "ﬁ",
        "_",
        "-",
        "--",
        "'",
        "'s",
        "Ġ",
        "▁",
    ];
    let mut specials: Vec<String> = tok
        .get_added_tokens_decoder()
        .values()
        .map(|t| t.content.clone())
        .collect();
    specials.sort();
    let mut out = vec![String::new()];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..96 {
        let mut s = String::new();
        let len = 1 + round % 40;
        for _ in 0..len {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let k = (x >> 33) as usize;
            if !specials.is_empty() && k.is_multiple_of(7) {
                let sp = &specials[(k / 7) % specials.len()];
                // Whole, or cut short (a partial match must not be taken).
                let cut = if k.is_multiple_of(3) {
                    sp.len() / 2
                } else {
                    sp.len()
                };
                match sp.get(..cut) {
                    Some(part) => s.push_str(part),
                    None => s.push_str(sp),
                }
            } else {
                s.push_str(PIECES[k % PIECES.len()]);
            }
        }
        out.push(s);
    }
    for sp in &specials {
        out.push(sp.clone());
        // An added token before and between vocabulary words (pieces that do not
        // start the text: `Metaspace`'s `First`).
        out.push(format!("{sp}t1 t2"));
        out.push(format!("t1 t2{sp}t3"));
        out.push(format!(" {sp} t1{sp}{sp}\n{sp}Hello "));
    }
    out
}

impl Lean {
    /// The lean path for `tok`, or None when it could differ from `encode_fast`.
    pub(crate) fn new(tok: &Tokenizer) -> Option<Lean> {
        if tok.get_encode_special_tokens() {
            return None;
        }
        steps(tok.get_pre_tokenizer())?;
        let mut plain = Vec::new();
        let mut normalized = Vec::new();
        for (&id, t) in tok.get_added_tokens_decoder().iter() {
            if t.single_word || t.lstrip || t.rstrip || t.content.is_empty() {
                return None;
            }
            if tok.token_to_id(&t.content) != Some(id) {
                return None;
            }
            if t.normalized {
                let mut n = NormalizedString::from(t.content.as_str());
                if let Some(norm) = tok.get_normalizer() {
                    norm.normalize(&mut n).ok()?;
                }
                if n.get().is_empty() {
                    return None;
                }
                normalized.push((n.get().to_string(), id));
            } else {
                plain.push((t.content.clone(), id));
            }
        }
        let unk = match tok.get_model() {
            ModelWrapper::WordLevel(wl) => wl.token_to_id(&wl.unk_token),
            _ => None,
        };
        let words = match tok.get_model() {
            ModelWrapper::BPE(b) if b.dropout.is_none() => Some(super::words::WordCache::new()),
            _ => None,
        };
        let lean = Lean {
            plain: Added::new(plain),
            normalized: Added::new(normalized),
            byte_re: SysRegex::new(BYTE_LEVEL_RE).ok()?,
            ws_re: regex::Regex::new(WHITESPACE_RE).ok()?,
            byte_char: byte_chars(),
            unk,
            words,
            texts: AtomicU64::new(0),
            off: AtomicBool::new(false),
            mismatches: AtomicU64::new(0),
        };
        for text in probes(tok) {
            let want = tok.encode_fast(text.as_str(), false).ok()?;
            let mut got = Vec::new();
            lean.ids(tok, &text, &mut got).ok()?;
            if got != want.get_ids() {
                return None;
            }
        }
        Some(lean)
    }

    /// Whether the lean path is still on (a run-time difference turns it off).
    pub(crate) fn on(&self) -> bool {
        !self.off.load(Ordering::Relaxed)
    }

    /// Whether this text is one of the sampled ones to compare with HF's.
    pub(crate) fn sample(&self) -> bool {
        self.texts.fetch_add(1, Ordering::Relaxed) % CHECK_EVERY == CHECK_EVERY - 1
    }

    /// A sampled text gave other ids than HF's: off for good, counted.
    pub(crate) fn differed(&self) {
        self.off.store(true, Ordering::Relaxed);
        self.mismatches.fetch_add(1, Ordering::Relaxed);
    }

    /// Sampled texts whose ids differed from HF's (at most one turns it off, but
    /// concurrent samples may count more).
    pub(crate) fn mismatches(&self) -> u64 {
        self.mismatches.load(Ordering::Relaxed)
    }

    /// Appends the ids of `text` without special tokens (what the pipeline gives
    /// before the post-processor) to `out`.
    pub(crate) fn ids(
        &self,
        tok: &Tokenizer,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), String> {
        match &self.words {
            Some(c) => c.with(|words| self.walk(tok, text, out, words)),
            None => self.walk(tok, text, out, None),
        }
    }

    fn walk(
        &self,
        tok: &Tokenizer,
        text: &str,
        out: &mut Vec<u32>,
        words: Option<&mut super::words::Words<'_>>,
    ) -> Result<(), String> {
        let steps = steps(tok.get_pre_tokenizer()).ok_or("unsupported pre-tokenizer")?;
        let mut w = Walk {
            lean: self,
            steps: &steps,
            model: tok.get_model(),
            words,
            out,
            at_start: false,
        };
        let norm = tok.get_normalizer();
        split_added(self.plain.as_ref(), text, |piece, id| {
            if let Some(id) = id {
                w.out.push(id);
                return Ok(());
            }
            // A normalized piece keeps its start's original offset (HF aligns what a
            // normalizer prepends with the first char).
            w.at_start = std::ptr::eq(piece.as_ptr(), text.as_ptr());
            match norm {
                None => w.normalized_piece(piece),
                // ASCII is invariant under every Unicode normalization form.
                Some(n) if piece.is_ascii() && is_unicode_form(n) => w.normalized_piece(piece),
                Some(n) => {
                    let mut ns = NormalizedString::from(piece);
                    n.normalize(&mut ns).map_err(|e| e.to_string())?;
                    w.normalized_piece(ns.get())
                }
            }
        })
    }
}

/// NFC, NFD, NFKC or NFKD: normalizers that leave ASCII text as it is.
fn is_unicode_form(n: &NormalizerWrapper) -> bool {
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
fn split_added(
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

/// Pieces of `s` between and at the matches of `re`, as HF's `Pattern for &SysRegex`
/// gives them: `(piece, is_match)`, covering `s` in order.
fn regex_pieces<'t>(
    re: &SysRegex,
    s: &'t str,
    mut f: impl FnMut(&'t str, bool) -> Result<(), String>,
) -> Result<(), String> {
    let mut prev = 0;
    for (start, end) in re.find_iter(s) {
        if prev != start {
            f(&s[prev..start], false)?;
        }
        f(&s[start..end], true)?;
        prev = end;
    }
    if prev != s.len() {
        f(&s[prev..], false)?;
    }
    Ok(())
}

struct Walk<'a, 'w> {
    lean: &'a Lean,
    steps: &'a [&'a PreTokenizerWrapper],
    model: &'a ModelWrapper,
    words: Option<&'a mut super::words::Words<'w>>,
    out: &'a mut Vec<u32>,
    /// The piece being walked starts at the text's original start (HF's
    /// `offsets_original().0 == 0`, which `Metaspace`'s `First` scheme reads): its
    /// added-token piece started there and each step kept it at offset 0.
    at_start: bool,
}

impl Walk<'_, '_> {
    /// A normalized piece between non-normalized added tokens: the normalized added
    /// tokens, then the pre-tokenizer and the model on what is between them.
    fn normalized_piece(&mut self, s: &str) -> Result<(), String> {
        let added = self.lean.normalized.as_ref();
        split_added(added, s, |piece, id| match id {
            Some(id) => {
                self.out.push(id);
                Ok(())
            }
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
        regex_pieces(&sp.regex, s, |piece, is_match| {
            let is_match = is_match != sp.invert;
            if piece.is_empty() || (is_match && !keep_matches) {
                return Ok(());
            }
            self.child(i + 1, s, piece)
        })
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
        let re = &self.lean.byte_re;
        regex_pieces(re, s, |piece, _| {
            if piece.is_empty() {
                return Ok(());
            }
            let was = self.at_start;
            self.at_start = was && std::ptr::eq(piece.as_ptr(), s.as_ptr());
            let r = self.mapped(i, piece);
            self.at_start = was;
            r
        })
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
            ModelWrapper::WordLevel(wl) => {
                let id = wl
                    .token_to_id(w)
                    .or(self.lean.unk)
                    .ok_or("word not in the vocabulary and no unknown token")?;
                self.out.push(id);
            }
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
