//! A per-thread cache of a model's ids per pre-tokenized word, for the lean walk
//! (`tokenize::lean`) of BPE tokenizers.
//!
//! Why: a BPE model's `tokenize` returns a `Token` with its own `String` per token,
//! even when the word is in HF's own cache (which it reaches through a lock and by
//! cloning the cached word). Text repeats its words, so most words of a prompt were
//! seen before: one hash lookup gives their ids.
//!
//! Guarantees: the cached ids are the model's own output for that word (a model is
//! only given a cache when it is deterministic: BPE without dropout), so a hit gives
//! what a call would. Bounded: at most [`MAX_WORDS`] words of at most
//! [`MAX_WORD_BYTES`] bytes per thread and model (a full cache is emptied and refills
//! with the words in use). Per thread, so no lock and no shared cache line: each core
//! and each core's blocking thread keeps its own.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Most words kept per thread and model.
pub(crate) const MAX_WORDS: usize = 1 << 15;
/// Longer words are not cached (rare; they are tokenized every time).
pub(crate) const MAX_WORD_BYTES: usize = 64;

type Ids = smallvec::SmallVec<[u32; 6]>;
type Map = ahash::AHashMap<Box<str>, Ids>;

thread_local! {
    /// Cache id → that model's words on this thread.
    static CACHES: RefCell<ahash::AHashMap<u64, Map>> = RefCell::new(Default::default());
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One model's cache (its per-thread maps are found by `id`).
#[derive(Debug)]
pub(crate) struct WordCache {
    id: u64,
}

impl WordCache {
    pub(crate) fn new() -> WordCache {
        WordCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Runs `f` with this thread's words of this model (None if the thread's caches
    /// are in use further up the stack, which tokenizing never does).
    pub(crate) fn with<R>(&self, f: impl FnOnce(Option<&mut Words<'_>>) -> R) -> R {
        CACHES.with(|c| match c.try_borrow_mut() {
            Ok(mut all) => {
                let map = all.entry(self.id).or_default();
                f(Some(&mut Words(map)))
            }
            Err(_) => f(None),
        })
    }
}

/// This thread's words of one model.
pub(crate) struct Words<'a>(&'a mut Map);

impl Words<'_> {
    /// Appends the ids of `word` to `out`: the cached ones, or `compute`'s (kept).
    pub(crate) fn ids<E>(
        &mut self,
        word: &str,
        out: &mut Vec<u32>,
        compute: impl FnOnce(&str) -> Result<Ids, E>,
    ) -> Result<(), E> {
        if let Some(ids) = self.0.get(word) {
            out.extend_from_slice(ids);
            return Ok(());
        }
        let ids = compute(word)?;
        out.extend_from_slice(&ids);
        if word.len() <= MAX_WORD_BYTES {
            if self.0.len() >= MAX_WORDS {
                self.0.clear();
            }
            self.0.insert(word.into(), ids);
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_word_gives_the_computed_ids_and_the_cache_stays_bounded() {
        let c = WordCache::new();
        let mut calls = 0;
        let mut out = Vec::new();
        c.with(|w| {
            let w = w.unwrap();
            for _ in 0..3 {
                w.ids("hello", &mut out, |_| {
                    calls += 1;
                    Ok::<_, ()>(Ids::from_slice(&[7, 8]))
                })
                .unwrap();
            }
        });
        assert_eq!(out, [7, 8, 7, 8, 7, 8]);
        assert_eq!(calls, 1);
        // Long words are computed every time; errors are passed on, nothing kept.
        let long = "x".repeat(MAX_WORD_BYTES + 1);
        c.with(|w| {
            let w = w.unwrap();
            let mut calls = 0;
            for _ in 0..2 {
                w.ids(&long, &mut out, |_| {
                    calls += 1;
                    Ok::<_, ()>(Ids::from_slice(&[1]))
                })
                .unwrap();
            }
            assert_eq!(calls, 2);
            assert!(w.ids("bad", &mut out, |_| Err("no")).is_err());
            assert_eq!(w.len(), 1);
            for i in 0..MAX_WORDS + 10 {
                w.ids(&format!("w{i}"), &mut out, |_| Ok::<_, ()>(Ids::new()))
                    .unwrap();
            }
            assert!(w.len() <= MAX_WORDS);
        });
        // Another model's cache is another map.
        let d = WordCache::new();
        d.with(|w| assert_eq!(w.unwrap().len(), 0));
    }
}
