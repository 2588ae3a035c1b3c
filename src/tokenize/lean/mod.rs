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
//! 3. **Pre-tokenizer**: `Sequence`, `Split` (with `Isolated` or `Removed`),
//!    `ByteLevel`, `Metaspace`, `Whitespace` and `WhitespaceSplit`, walked depth first
//!    over borrowed slices (each of them splits one piece independently of the
//!    others, so depth first gives what HF's step-by-step pass gives). A split regex
//!    runs as the tokenizer compiled it, except the GPT-2 / Llama-3 / Qwen-2 patterns,
//!    which [`dfa_split`] runs on the `regex` crate's automata without the
//!    backtracking VM their one look-ahead needs.
//! 4. **Model**: a `WordLevel` vocabulary looked up in a table of its own
//!    ([`vocab`]: a short word inside its slot, one cache line per lookup, the
//!    lookups prefetched a few words ahead); any other model's own
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

mod dfa_split;
mod state;
mod vocab;
mod walk;

use super::pipelines::PIECES;
use state::Added;
pub(crate) use state::Lean;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokenizers::pre_tokenizers::split::SplitPattern;
use tokenizers::utils::SysRegex;
use tokenizers::{
    Model as _, ModelWrapper, NormalizedString, Normalizer as _, PreTokenizerWrapper,
    SplitDelimiterBehavior, Tokenizer,
};
use walk::{is_unicode_form, split_added, Walk};

/// One text in this many is also tokenized by HF and compared.
pub(crate) const CHECK_EVERY: u64 = 4096;

/// HF's `ByteLevel` split (GPT-2's), compiled with the same engine as HF's.
const BYTE_LEVEL_RE: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// HF's `Whitespace` pre-tokenizer: the pieces are this regex's matches.
const WHITESPACE_RE: &str = r"\w+|[^\w\s]+";

/// Pre-tokenizer steps deeper than this are not walked (no real tokenizer nests so).
const MAX_STEPS: usize = 8;

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
        let steps = steps(tok.get_pre_tokenizer())?;
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
        let (unk, vocab) = match tok.get_model() {
            ModelWrapper::WordLevel(wl) => (
                wl.token_to_id(&wl.unk_token),
                vocab::Vocab::new(&wl.get_vocab()),
            ),
            _ => (None, None),
        };
        let words = match tok.get_model() {
            ModelWrapper::BPE(b) if b.dropout.is_none() => {
                Some(crate::tokenize::words::WordCache::new())
            }
            _ => None,
        };
        let lean = Lean {
            plain: Added::new(plain),
            normalized: Added::new(normalized),
            byte_re: SysRegex::new(BYTE_LEVEL_RE).ok()?,
            byte_dfa: dfa_split::DfaSplit::new(BYTE_LEVEL_RE),
            split_dfa: steps
                .iter()
                .map(|p| match p {
                    PreTokenizerWrapper::Split(sp) => match &sp.pattern {
                        SplitPattern::Regex(r) => dfa_split::DfaSplit::new(r),
                        SplitPattern::String(_) => None,
                    },
                    _ => None,
                })
                .collect(),
            ws_re: regex::Regex::new(WHITESPACE_RE).ok()?,
            byte_char: byte_chars(),
            unk,
            vocab,
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
        words: Option<&mut crate::tokenize::words::Words<'_>>,
    ) -> Result<(), String> {
        let steps = steps(tok.get_pre_tokenizer()).ok_or("unsupported pre-tokenizer")?;
        let mut w = Walk {
            lean: self,
            steps: &steps,
            model: tok.get_model(),
            words,
            out,
            at_start: false,
            pending: Default::default(),
        };
        let norm = tok.get_normalizer();
        split_added(self.plain.as_ref(), text, |piece, id| {
            if let Some(id) = id {
                return w.emit(id);
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
        })?;
        w.flush()
    }
}
