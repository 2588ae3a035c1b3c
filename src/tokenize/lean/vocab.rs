//! A `WordLevel` vocabulary laid out for the lean walk's lookups: an open-addressed
//! table of 16-byte slots that hold a short word's bytes themselves, so one lookup
//! reads one cache line.
//!
//! Why: HF's `WordLevel` keeps its vocabulary as a `HashMap<String, u32>` with the
//! standard library's SipHash, and each key is its own heap allocation, so one lookup
//! is a SipHash of the word plus a pointer chase to a cache line of its own for the
//! compare. A proxied prompt is one lookup per word, tens of thousands per request.
//! A first table of ours (`(start, len, id)` entries in a `hashbrown` table over an
//! arena of the words) took SipHash and the allocations away, but each lookup still
//! read three scattered lines (the control bytes, the entry, the word in the arena):
//! a profile put two thirds of the walk's time on those loads (docs/PERFORMANCE.md,
//! "Tokenization"). Here a word of at most [`INLINE`] bytes — nearly every word of a
//! vocabulary — is compared inside its slot as two integers, and linear probing keeps
//! a collision's next slot on the same line most of the time.
//!
//! Layout of a slot: `lo` and the low three bytes of `hi` are the word's first 11
//! bytes (zero padded); the top byte of `hi` is the tag: the word's length (0..=11),
//! [`LONG`] for a longer word (then `lo` is its `(start, len)` in the arena and `hi`'s
//! low three bytes are hash bits, checked before the arena is read), or [`FREE`].
//! A query's key is built the same way, so an inline word matches exactly when both
//! integers are equal, and never matches a free or long slot (their tags exceed 11).
//!
//! Guarantees: the same answers as `WordLevel::token_to_id` — the table is built from
//! that model's own vocabulary (`get_vocab`), word for word, and a match compares the
//! whole word. Built once per model at load and never changed afterwards; at most
//! half its slots are used, so every probe ends at a match or a free slot. The hash is
//! fixed (not seeded): lookups cannot change the table, so the probe lengths a client
//! can meet are the ones the vocabulary itself makes. A vocabulary whose text does not
//! fit u32 offsets is not built (the walk keeps HF's lookup).

use std::collections::HashMap;

/// Longest word kept in its slot.
pub(crate) const INLINE: usize = 11;
/// Tag of a slot whose word is in the arena.
const LONG: u8 = 0xFE;
/// Tag of an unused slot.
const FREE: u8 = 0xFF;

/// One slot (see the module doc); 16-byte aligned, so it never straddles a line.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Slot {
    lo: u64,
    hi: u32,
    id: u32,
}

impl Slot {
    fn is_free(&self) -> bool {
        self.hi >> 24 == u32::from(FREE)
    }
}

const EMPTY: Slot = Slot {
    lo: 0,
    hi: (FREE as u32) << 24,
    id: 0,
};

/// A short word's slot integers and home slot: what a deferred lookup keeps
/// ([`Vocab::key`], [`Vocab::find`]); it holds no borrow of the word.
#[derive(Clone, Copy, Default)]
pub(crate) struct Key {
    lo: u64,
    hi: u32,
    home: usize,
}

/// One model's words and ids (see the module doc).
pub(crate) struct Vocab {
    slots: Box<[Slot]>,
    /// `slots.len() - 1` (the length is a power of two).
    mask: usize,
    /// The words longer than [`INLINE`] bytes.
    arena: Box<[u8]>,
}

impl Vocab {
    /// The table of `words`, or None when their text passes u32 offsets.
    pub(crate) fn new(words: &HashMap<String, u32>) -> Option<Vocab> {
        let long: usize = words.keys().map(String::len).filter(|&n| n > INLINE).sum();
        u32::try_from(long).ok()?;
        let cap = words
            .len()
            .saturating_mul(2)
            .max(16)
            .checked_next_power_of_two()?;
        let mut v = Vocab {
            slots: vec![EMPTY; cap].into_boxed_slice(),
            mask: cap - 1,
            arena: Box::default(),
        };
        let mut arena = Vec::with_capacity(long);
        // Sorted by id, so the arena's order does not depend on the HashMap's.
        let mut sorted: Vec<(&String, &u32)> = words.iter().collect();
        sorted.sort_unstable_by_key(|&(w, &id)| (id, w.as_str()));
        for (w, &id) in sorted {
            let w = w.as_bytes();
            let (h, slot) = match inline_key(w) {
                Some((lo, hi)) => (mix(lo, hi), Slot { lo, hi, id }),
                None => {
                    let h = hash_long(w);
                    let start = u64::from(u32::try_from(arena.len()).ok()?);
                    let len = u64::from(u32::try_from(w.len()).ok()?);
                    arena.extend_from_slice(w);
                    let hi = long_hi(h);
                    (
                        h,
                        Slot {
                            lo: start | len << 32,
                            hi,
                            id,
                        },
                    )
                }
            };
            let mut i = h as usize & v.mask;
            loop {
                let s = &mut v.slots[i];
                if s.is_free() {
                    *s = slot;
                    break;
                }
                i = (i + 1) & v.mask;
            }
        }
        v.arena = arena.into_boxed_slice();
        Some(v)
    }

    /// The id of `word`, as `WordLevel::token_to_id` gives it.
    #[inline]
    pub(crate) fn get(&self, word: &str) -> Option<u32> {
        match self.key(word) {
            Some(k) => self.find(k),
            None => self.get_long(word.as_bytes()),
        }
    }

    /// The lookup key of `word`, its slot's line prefetched, so that [`Vocab::find`]
    /// issued a few words later finds the line in cache (a prompt's words are
    /// independent lookups: their misses can overlap). None for a word longer than
    /// [`INLINE`] bytes (look it up with [`Vocab::get`]).
    #[inline]
    pub(crate) fn key(&self, word: &str) -> Option<Key> {
        let (lo, hi) = inline_key(word.as_bytes())?;
        let home = mix(lo, hi) as usize & self.mask;
        crate::mem::prefetch(self.slots.as_ptr().wrapping_add(home));
        Some(Key { lo, hi, home })
    }

    /// The id of the word `k` was made from (by this table's [`Vocab::key`]).
    #[inline]
    pub(crate) fn find(&self, k: Key) -> Option<u32> {
        self.probe(k.home, |s| s.lo == k.lo && s.hi == k.hi)
    }

    /// [`Vocab::get`] for a word longer than [`INLINE`] bytes.
    #[cold]
    fn get_long(&self, w: &[u8]) -> Option<u32> {
        let h = hash_long(w);
        let hi = long_hi(h);
        self.probe(h as usize & self.mask, |s| {
            let start = (s.lo & u64::from(u32::MAX)) as usize;
            let len = (s.lo >> 32) as usize;
            s.hi == hi && self.arena.get(start..start + len) == Some(w)
        })
    }

    /// The id in the first slot from `i` on that `hit` accepts; None at a free slot.
    #[inline(always)]
    fn probe(&self, mut i: usize, hit: impl Fn(&Slot) -> bool) -> Option<u32> {
        loop {
            let s = self.slots.get(i)?;
            if hit(s) {
                return Some(s.id);
            }
            if s.is_free() {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Slots probed to find each word, summed (tests: the hash spreads the words).
    #[cfg(test)]
    fn probes(&self, words: &HashMap<String, u32>) -> usize {
        words
            .keys()
            .map(|w| {
                let w = w.as_bytes();
                let (h, lo, hi) = match inline_key(w) {
                    Some((lo, hi)) => (mix(lo, hi), lo, hi),
                    None => (hash_long(w), u64::MAX, long_hi(hash_long(w))),
                };
                let mut i = h as usize & self.mask;
                let mut n = 1;
                while !(self.slots[i].hi == hi && (lo == u64::MAX || self.slots[i].lo == lo)) {
                    i = (i + 1) & self.mask;
                    n += 1;
                }
                n
            })
            .sum()
    }
}

/// The slot integers of a word of at most [`INLINE`] bytes (None for a longer one).
#[inline]
fn inline_key(w: &[u8]) -> Option<(u64, u32)> {
    let n = w.len();
    if n > INLINE {
        return None;
    }
    let (lo, rest) = match w.split_at_checked(8) {
        Some((head, rest)) => (le_upto8(head), le_upto8(rest)),
        None => (le_upto8(w), 0),
    };
    Some((lo, rest as u32 | (n as u32) << 24))
}

/// The bytes of `w` (at most 8) as a little-endian integer, zero above them: two
/// overlapping loads instead of a byte-wise copy (the copy's narrow stores, read back
/// as one wide load, stalled store-to-load forwarding).
#[inline(always)]
fn le_upto8(w: &[u8]) -> u64 {
    let n = w.len();
    match w {
        [] => 0,
        [a0, a1, a2, a3, ..] => {
            let first = u32::from_le_bytes([*a0, *a1, *a2, *a3]);
            let last = match w.get(n.saturating_sub(4)..) {
                Some(&[b0, b1, b2, b3]) => u32::from_le_bytes([b0, b1, b2, b3]),
                _ => 0,
            };
            u64::from(first) | u64::from(last) << (8 * (n - 4))
        }
        [a0, ..] => {
            let mid = w.get(n / 2).copied().unwrap_or(0);
            let last = w.get(n - 1).copied().unwrap_or(0);
            u64::from(*a0) | u64::from(mid) << (8 * (n / 2)) | u64::from(last) << (8 * (n - 1))
        }
    }
}

/// `hi` of a long word's slot: the [`LONG`] tag over 24 bits of its hash.
fn long_hi(h: u64) -> u32 {
    (u32::from(LONG) << 24) | ((h >> 40) as u32 & 0x00FF_FFFF)
}

/// The hash of an inline key: a multiply-and-fold (the constants are the fractional
/// digits of pi and e; any odd constants with mixed bits would do).
#[inline]
fn mix(lo: u64, hi: u32) -> u64 {
    let x = lo.wrapping_mul(0x243F_6A88_85A3_08D3) ^ u64::from(hi);
    let p = u128::from(x ^ 0x1319_8A2E_0370_7344) * 0xB7E1_5162_8AED_2A6B_u128;
    (p as u64) ^ ((p >> 64) as u64)
}

/// The hash of a longer word: its bytes folded 8 at a time through [`mix`].
fn hash_long(w: &[u8]) -> u64 {
    let mut h = w.len() as u64;
    for c in w.chunks(8) {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        h = mix(h ^ u64::from_le_bytes(b), 0xFE00_0000);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokenizers::Model as _;

    fn model() -> tokenizers::models::wordlevel::WordLevel {
        let tok = crate::tokenize::fixture::build_tokenizer(2000).unwrap();
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

    /// Words at and around the inline limit, an empty word, words that differ only in
    /// trailing zero bytes or in their last byte, and long words that share a prefix.
    fn edge_vocab() -> HashMap<String, u32> {
        let mut words = vec![
            String::new(),
            "\0".into(),
            "a".into(),
            "a\0".into(),
            "é".into(),
            "日本語".into(),
        ];
        for n in [INLINE - 1, INLINE, INLINE + 1, 16, 40] {
            words.push("x".repeat(n));
            words.push(format!("{}y", "x".repeat(n - 1)));
        }
        words.push(format!("{}\0", "x".repeat(INLINE - 1)));
        words
            .into_iter()
            .enumerate()
            .map(|(i, w)| (w, i as u32 * 3))
            .collect()
    }

    #[test]
    fn words_at_the_inline_limit_and_long_words_answer_exactly() {
        let words = edge_vocab();
        let v = Vocab::new(&words).unwrap();
        for (w, &id) in &words {
            assert_eq!(v.get(w), Some(id), "{w:?}");
        }
        for w in [
            "\0\0",
            "b",
            "x".repeat(INLINE - 2).as_str(),
            format!("{}z", "x".repeat(INLINE)).as_str(),
            "x".repeat(41).as_str(),
            "x".repeat(39).as_str(),
            format!("{}\0", "x".repeat(INLINE)).as_str(),
        ] {
            assert_eq!(v.get(w), None, "{w:?}");
        }
        // An empty vocabulary answers nothing (and every probe ends).
        let v = Vocab::new(&HashMap::new()).unwrap();
        assert_eq!(v.get(""), None);
        assert_eq!(v.get(&"q".repeat(30)), None);
    }

    #[test]
    fn short_words_load_as_their_zero_padded_bytes() {
        for n in 0..=INLINE + 1 {
            let w: Vec<u8> = (1..=n as u8).map(|b| b.wrapping_mul(37) | 1).collect();
            let mut b = [0u8; 12];
            let got = inline_key(&w);
            if n > INLINE {
                assert_eq!(got, None);
                continue;
            }
            b[..n].copy_from_slice(&w);
            b[INLINE] = n as u8;
            let lo = u64::from_le_bytes(b[..8].try_into().unwrap());
            let hi = u32::from_le_bytes(b[8..].try_into().unwrap());
            assert_eq!(got, Some((lo, hi)), "{n} bytes");
        }
    }

    #[test]
    fn the_hash_spreads_a_large_vocabulary() {
        // 32k words like the simulated fleet's; linear probing at load 1/2 averages
        // 1.5 slots per hit when the hash spreads the keys.
        let tok = crate::tokenize::fixture::build_tokenizer(32_000).unwrap();
        let words = tok.get_vocab(false);
        let v = Vocab::new(&words).unwrap();
        let avg = v.probes(&words) as f64 / words.len() as f64;
        assert!(avg < 2.0, "{avg} slots per lookup");
        for (w, &id) in &words {
            assert_eq!(v.get(w), Some(id));
        }
    }

    proptest! {
        #[test]
        fn arbitrary_words_answer_as_the_model_does(w in "(t[0-9]{0,5}|<[a-z_|/]{1,8}>?|\\PC{0,14})") {
            let wl = model();
            let v = Vocab::new(&wl.get_vocab()).unwrap();
            prop_assert_eq!(v.get(&w), wl.token_to_id(&w));
        }

        #[test]
        fn arbitrary_vocabularies_answer_as_a_map(
            words in proptest::collection::hash_map("\\PC{0,20}", any::<u32>(), 0..200),
            probe in "\\PC{0,20}",
        ) {
            let v = Vocab::new(&words).unwrap();
            for (w, &id) in &words {
                prop_assert_eq!(v.get(w), Some(id));
            }
            prop_assert_eq!(v.get(&probe), words.get(&probe).copied());
        }
    }
}
