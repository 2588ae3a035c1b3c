//! What the lean path holds for one tokenizer ([`Lean`]): its added-token automata
//! ([`Added`]), compiled regexes, byte table and vocabulary. A leaf of `lean`: built
//! by [`Lean::new`] (`lean/mod.rs`), read by the walk (`walk`).

use super::dfa_split;
use super::vocab;
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokenizers::utils::SysRegex;

/// One pass of added tokens: the automaton and the id of each pattern.
pub(super) struct Added {
    pub(super) ac: AhoCorasick,
    pub(super) ids: Vec<u32>,
}

impl Added {
    pub(super) fn new(patterns: Vec<(String, u32)>) -> Option<Added> {
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
    pub(super) plain: Option<Added>,
    pub(super) normalized: Option<Added>,
    pub(super) byte_re: SysRegex,
    /// `byte_re` without the backtracking VM ([`dfa_split`]), when it has that form.
    pub(super) byte_dfa: Option<dfa_split::DfaSplit>,
    /// Per pre-tokenizer step (as [`steps`] lists them): a `Split` regex without the
    /// backtracking VM, when it has that form.
    pub(super) split_dfa: Vec<Option<dfa_split::DfaSplit>>,
    pub(super) ws_re: regex::Regex,
    /// GPT-2's byte → printable char table (`ByteLevel`).
    pub(super) byte_char: [char; 256],
    /// `WordLevel`'s unknown-token id, when it has one.
    pub(super) unk: Option<u32>,
    /// `WordLevel`'s vocabulary in a table of its own ([`vocab`]).
    pub(super) vocab: Option<vocab::Vocab>,
    /// Ids per word of a deterministic BPE (`tokenize::words`).
    pub(super) words: Option<crate::tokenize::words::WordCache>,
    pub(super) texts: AtomicU64,
    pub(super) off: AtomicBool,
    pub(super) mismatches: AtomicU64,
}

impl std::fmt::Debug for Lean {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lean")
            .field("off", &self.off.load(Ordering::Relaxed))
            .field("mismatches", &self.mismatches.load(Ordering::Relaxed))
            .finish()
    }
}
