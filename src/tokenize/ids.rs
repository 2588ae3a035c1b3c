//! Token ids of a text without building a `tokenizers::Encoding`: the proxy's
//! per-request tokenization, on the critical path of every proxied request.
//!
//! `Tokenizer::encode_fast` runs the pipeline (added tokens → normalizer →
//! pre-tokenizer → model) and then builds a full `Encoding` (ids, type ids, token
//! strings, words, offsets, masks) and runs the post-processor over it, which copies it
//! again. Routing needs the ids only. [`Fast`] runs the same pipeline through the
//! crate's public steps and reads the ids straight off the tokenized splits; the
//! special tokens the post-processor adds to a single sequence are measured once at
//! load (a constant prefix and suffix) instead of being added per request.
//!
//! Exactness: [`Fast::new`] accepts a tokenizer only when the shortcut gives what
//! `encode_fast` gives — no truncation, no padding, and a post-processor whose output
//! for a single sequence is the sequence between a fixed prefix and suffix, checked
//! with three probe sequences of different lengths and contents. Anything else (a
//! tokenizer with padding or truncation configured, a post-processor that does
//! something else) keeps `encode_fast` (`Fast::new` returns None). The unit tests
//! compare both paths on every test tokenizer.

use tokenizers::{
    Encoding, Model as _, OffsetReferential, OffsetType, PostProcessor as _, PreTokenizer as _,
    Tokenizer,
};

/// The ids-only path for one tokenizer: the special tokens its post-processor puts
/// around a single sequence when special tokens are added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fast {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

/// A probe encoding of `ids` (type 0, no words, zero offsets), as the pipeline makes
/// them with `OffsetType::None`.
fn probe(ids: &[u32]) -> Encoding {
    let n = ids.len();
    Encoding::new(
        ids.to_vec(),
        vec![0; n],
        vec![String::new(); n],
        vec![None; n],
        vec![(0, 0); n],
        vec![0; n],
        vec![1; n],
        Vec::new(),
        Default::default(),
    )
}

impl Fast {
    /// The shortcut for `tok`, or None when it could differ from `encode_fast`.
    pub(crate) fn new(tok: &Tokenizer) -> Option<Fast> {
        if tok.get_truncation().is_some() || tok.get_padding().is_some() {
            return None;
        }
        let Some(pp) = tok.get_post_processor() else {
            return Some(Fast {
                prefix: Vec::new(),
                suffix: Vec::new(),
            });
        };
        // Without special tokens a post-processor must leave the ids alone.
        let probes: [&[u32]; 3] = [&[], &[u32::MAX - 7], &[u32::MAX - 3, u32::MAX - 5, 11]];
        for p in probes {
            let out = pp.process(probe(p), None, false).ok()?;
            if out.get_ids() != p {
                return None;
            }
        }
        // With them: one prefix and suffix for every probe.
        let mut found: Option<Fast> = None;
        for p in probes {
            let out = pp.process(probe(p), None, true).ok()?;
            let ids = out.get_ids();
            let at = if p.is_empty() {
                // Where an empty sequence sits is told by the others; take it as all
                // prefix here and compare the concatenation below.
                ids.len()
            } else {
                ids.windows(p.len()).position(|w| w == p)?
            };
            let f = Fast {
                prefix: ids[..at].to_vec(),
                suffix: ids[at + p.len()..].to_vec(),
            };
            match &found {
                None if p.is_empty() => {}
                None => found = Some(f),
                Some(g) if *g == f => {}
                Some(_) => return None,
            }
        }
        let f = found?;
        // The empty probe: prefix then suffix.
        let out = pp.process(probe(&[]), None, true).ok()?;
        let both: Vec<u32> = f.prefix.iter().chain(&f.suffix).copied().collect();
        (out.get_ids() == both.as_slice()).then_some(f)
    }

    /// The ids `body` appends for a text of `len` bytes, between the special tokens
    /// the post-processor puts around a single sequence when `add_special`.
    pub(crate) fn wrap<E>(
        &self,
        len: usize,
        add_special: bool,
        body: impl FnOnce(&mut Vec<u32>) -> Result<(), E>,
    ) -> Result<Vec<u32>, E> {
        let mut ids = Vec::with_capacity(len / 4 + 8);
        if add_special {
            ids.extend_from_slice(&self.prefix);
        }
        body(&mut ids)?;
        if add_special {
            ids.extend_from_slice(&self.suffix);
        }
        Ok(ids)
    }

    /// The ids `tok.encode_fast(text, add_special)` would give (`tok` is the tokenizer
    /// this was made for).
    pub(crate) fn ids(
        &self,
        tok: &Tokenizer,
        text: &str,
        add_special: bool,
    ) -> tokenizers::Result<Vec<u32>> {
        let mut pre = tok
            .get_added_vocabulary()
            .extract_and_normalize(tok.get_normalizer(), text);
        if let Some(pt) = tok.get_pre_tokenizer() {
            pt.pre_tokenize(&mut pre)?;
        }
        let model = tok.get_model();
        pre.tokenize(|n| model.tokenize(n.get()))?;
        self.wrap(text.len(), add_special, |ids| {
            for (_, _, tokens) in pre.get_splits(OffsetReferential::Original, OffsetType::None) {
                match tokens {
                    Some(t) => ids.extend(t.iter().map(|t| t.id)),
                    None => return Err("a split was not tokenized".into()),
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::normalizers::{Lowercase, NFC};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::{PaddingParams, TruncationParams};

    /// Texts that exercise added tokens, whitespace runs, unknown words, Unicode,
    /// and the empty string.
    const TEXTS: &[&str] = &[
        "",
        " ",
        "t1 t2 t3",
        "  t5\tt6\n\nt7  ",
        "<s>t1 <|im_start|>user\nt9<|im_end|> t2</s>",
        "unknown wörds t3 日本 t4 ÉCOLE",
        "t0<|im_start|><|im_start|>t1",
    ];

    fn same(tok: &Tokenizer) {
        let fast = Fast::new(tok).expect("the shortcut applies");
        let mut long = String::new();
        for i in 0..3000u32 {
            long.push_str(&format!("t{} ", (i * 7919) % 1000));
            if i % 97 == 0 {
                long.push_str("<|im_end|>");
            }
        }
        for text in TEXTS.iter().copied().chain([long.as_str()]) {
            for add in [false, true] {
                let want = tok.encode_fast(text, add).unwrap().get_ids().to_vec();
                let got = fast.ids(tok, text, add).unwrap();
                assert_eq!(got, want, "text {text:?} add_special {add}");
            }
        }
    }

    #[test]
    fn the_test_tokenizer_gives_the_same_ids() {
        same(&crate::tokenize::fixture::build_tokenizer(1000).unwrap());
    }

    #[test]
    fn prefix_suffix_normalizer_and_no_post_processor_give_the_same_ids() {
        let mut tok = crate::tokenize::fixture::build_tokenizer(1000).unwrap();
        let cls = tok.token_to_id("<|im_start|>").unwrap();
        let sep = tok.token_to_id("<|im_end|>").unwrap();
        let post = TemplateProcessing::builder()
            .try_single("[CLS] $A [SEP] [SEP]")
            .unwrap()
            .special_tokens(vec![("[CLS]".to_string(), cls), ("[SEP]".to_string(), sep)])
            .build()
            .unwrap();
        tok.with_post_processor(Some(post));
        tok.with_normalizer(Some(Lowercase));
        same(&tok);
        assert_eq!(
            Fast::new(&tok).unwrap(),
            Fast {
                prefix: vec![cls],
                suffix: vec![sep, sep]
            }
        );
        tok.with_post_processor(None::<TemplateProcessing>);
        tok.with_normalizer(Some(NFC));
        same(&tok);
    }

    /// GPT-2 style (`tokenize::pipelines`) with its `ByteLevel` post-processor.
    fn byte_level_bpe() -> Tokenizer {
        let mut tok = crate::tokenize::pipelines::gpt2();
        tok.with_post_processor(Some(ByteLevel::default()));
        tok
    }

    #[test]
    fn byte_level_bpe_gives_the_same_ids() {
        same(&byte_level_bpe());
    }

    use crate::tokenize::pipelines::PIECES;

    proptest::proptest! {
        #[test]
        fn random_texts_give_the_same_ids(picks in proptest::collection::vec(0..PIECES.len(), 0..60)) {
            let text: String = picks.iter().map(|&i| PIECES[i]).collect();
            let wl = crate::tokenize::fixture::build_tokenizer(1000).unwrap();
            let mut lower = crate::tokenize::fixture::build_tokenizer(1000).unwrap();
            lower.with_normalizer(Some(Lowercase));
            lower.with_post_processor(None::<TemplateProcessing>);
            for tok in [&wl, &lower, &byte_level_bpe()] {
                let fast = Fast::new(tok).unwrap();
                for add in [false, true] {
                    let want = tok.encode_fast(text.as_str(), add).unwrap().get_ids().to_vec();
                    proptest::prop_assert_eq!(fast.ids(tok, &text, add).unwrap(), want);
                }
            }
        }
    }

    #[test]
    fn padding_or_truncation_keeps_the_full_path() {
        let mut tok = crate::tokenize::fixture::build_tokenizer(100).unwrap();
        tok.with_padding(Some(PaddingParams::default()));
        assert!(Fast::new(&tok).is_none());
        tok.with_padding(None);
        tok.with_truncation(Some(TruncationParams::default()))
            .unwrap();
        assert!(Fast::new(&tok).is_none());
        tok.with_truncation(None).unwrap();
        assert!(Fast::new(&tok).is_some());
    }
}
