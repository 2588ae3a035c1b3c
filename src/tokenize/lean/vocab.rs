//! A `WordLevel` vocabulary laid out for the lean walk's lookups: every word's bytes in
//! one arena, and a table of `(start, len, id)` entries hashed with `ahash`.
//!
//! Why: HF's `WordLevel` keeps its vocabulary as a `HashMap<String, u32>` with the
//! standard library's SipHash, and each key is its own heap allocation, so one lookup
//! is a SipHash of the word plus a pointer chase to a cache line of its own for the
//! compare. A proxied prompt is one lookup per word, tens of thousands per request:
//! that was most of the lean walk's time on a word-level tokenizer (docs/PERFORMANCE.md,
//! "Tokenization time"). Here the hash is ahash's, the table's entries are 12 bytes,
//! and the words sit next to each other (a 32k-word vocabulary is ~200 KB of text).
//!
//! Guarantees: the same answers as `WordLevel::token_to_id` — it is built from that
//! model's own vocabulary (`get_vocab`), word for word, and compares whole words byte
//! for byte. Built once per model at load; it is never changed afterwards. A
//! vocabulary whose text does not fit u32 offsets is not built (the walk keeps HF's
//! lookup).

use std::collections::HashMap;

/// One model's words and ids (see the module doc).
pub(crate) struct Vocab {
    arena: Box<[u8]>,
    table: hashbrown::HashTable<(u32, u32, u32)>,
    hasher: ahash::RandomState,
}

impl Vocab {
    /// The table of `words`, or None when their text passes u32 offsets.
    pub(crate) fn new(words: &HashMap<String, u32>) -> Option<Vocab> {
        let bytes: usize = words.keys().map(String::len).sum();
        u32::try_from(bytes).ok()?;
        let hasher = ahash::RandomState::new();
        let mut arena = Vec::with_capacity(bytes);
        let mut table = hashbrown::HashTable::with_capacity(words.len());
        // Sorted by id, so the arena's order (and so its locality) does not depend on
        // the HashMap's iteration order.
        let mut sorted: Vec<(&String, &u32)> = words.iter().collect();
        sorted.sort_unstable_by_key(|&(w, &id)| (id, w.as_str()));
        for (w, &id) in sorted {
            let start = u32::try_from(arena.len()).ok()?;
            let len = u32::try_from(w.len()).ok()?;
            arena.extend_from_slice(w.as_bytes());
            let h = hasher.hash_one(w.as_bytes());
            table.insert_unique(h, (start, len, id), |e: &(u32, u32, u32)| {
                hasher.hash_one(slice(&arena, *e))
            });
        }
        Some(Vocab {
            arena: arena.into_boxed_slice(),
            table,
            hasher,
        })
    }

    /// The id of `word`, as `WordLevel::token_to_id` gives it.
    #[inline]
    pub(crate) fn get(&self, word: &str) -> Option<u32> {
        let w = word.as_bytes();
        let h = self.hasher.hash_one(w);
        self.table
            .find(h, |e| slice(&self.arena, *e) == w)
            .map(|e| e.2)
    }
}

fn slice(arena: &[u8], (start, len, _): (u32, u32, u32)) -> &[u8] {
    let s = start as usize;
    arena.get(s..s + len as usize).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokenizers::Model as _;

    fn model() -> tokenizers::models::wordlevel::WordLevel {
        let tok = crate::tokenize::testing::build_tokenizer(2000).unwrap();
        match tok.get_model() {
            tokenizers::ModelWrapper::WordLevel(wl) => wl.clone(),
            _ => unreachable!("the test tokenizer is word-level"),
        }
    }

    #[test]
    fn every_word_and_some_others_answer_as_the_model_does() {
        let wl = model();
        let v = Vocab::new(&wl.get_vocab()).unwrap();
        for (w, id) in wl.get_vocab() {
            assert_eq!(v.get(&w), Some(id), "{w}");
        }
        for w in [
            "", "t", "t2000", "t1 ", " t1", "T1", "t01", "<unk", "<unk>x", "é",
        ] {
            assert_eq!(v.get(w), wl.token_to_id(w), "{w:?}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_words_answer_as_the_model_does(w in "(t[0-9]{0,5}|<[a-z_|/]{1,8}>?|\\PC{0,6})") {
            let wl = model();
            let v = Vocab::new(&wl.get_vocab()).unwrap();
            prop_assert_eq!(v.get(&w), wl.token_to_id(&w));
        }
    }
}
