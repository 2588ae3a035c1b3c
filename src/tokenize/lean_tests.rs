//! The lean walk against HF's pipeline: every supported step, random texts, the
//! tokenizers it must refuse, and the run-time check that turns it off.

use super::lean::{Lean, CHECK_EVERY};
use tokenizers::models::bpe::BPE;
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::normalizers::{Lowercase, NFC};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// Llama 3's split (look-ahead included).
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn wordlevel() -> Tokenizer {
    super::testing::build_tokenizer(1000).unwrap()
}

/// WordLevel with a lowercasing normalizer and a *normalized* added token (HF's second
/// pass), no post-processor.
fn lowercase() -> Tokenizer {
    let mut tok = wordlevel();
    tok.with_normalizer(Some(Lowercase));
    tok.with_post_processor(None::<TemplateProcessing>);
    tok.add_tokens(&[AddedToken::from("Hello", false)]);
    tok
}

/// WordLevel behind HF's `Whitespace` pre-tokenizer, with NFC.
fn whitespace_nfc() -> Tokenizer {
    let mut tok = wordlevel();
    tok.with_pre_tokenizer(Some(Whitespace));
    tok.with_normalizer(Some(NFC));
    tok
}

/// WordLevel behind a `Split` on a plain string, delimiters removed, inverted or not.
fn split_removed(invert: bool) -> Tokenizer {
    let mut tok = wordlevel();
    let pattern = if invert {
        SplitPattern::Regex(r"[a-z0-9]+".into())
    } else {
        SplitPattern::String(" ".into())
    };
    let split = Split::new(pattern, SplitDelimiterBehavior::Removed, invert).unwrap();
    tok.with_pre_tokenizer(Some(split));
    tok
}

/// SentencePiece style: a word-level vocabulary of `▁`-prefixed and bare words behind
/// `Metaspace` with `scheme`, split or not.
fn metaspace(scheme: PrependScheme, split: bool) -> Tokenizer {
    let mut vocab: ahash::AHashMap<String, u32> = Default::default();
    for w in ["<unk>", "▁", "▁▁", "t1▁", "▁t1▁t2"] {
        let n = vocab.len() as u32;
        vocab.insert(w.to_string(), n);
    }
    for i in 0..50 {
        for w in [format!("t{i}"), format!("▁t{i}")] {
            let n = vocab.len() as u32;
            vocab.insert(w, n);
        }
    }
    let model = WordLevel::builder()
        .vocab(vocab)
        .unk_token("<unk>".into())
        .build()
        .unwrap();
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, split)));
    tok.add_special_tokens(&[AddedToken::from("<|im_end|>", true)]);
    tok
}

/// A small byte-level BPE (every byte a token, a few merges) behind `pre`.
fn bpe(pre: tokenizers::PreTokenizerWrapper) -> Tokenizer {
    let mut vocab: ahash::AHashMap<String, u32> = Default::default();
    for (i, c) in ByteLevel::alphabet().iter().enumerate() {
        vocab.insert(c.to_string(), i as u32);
    }
    let merges: Vec<(String, String)> =
        [("t", "1"), ("Ġ", "t"), ("Ġt", "1"), ("Ġ", "Ġ"), ("e", "l")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
    for (a, b) in &merges {
        let n = vocab.len() as u32;
        vocab.entry(format!("{a}{b}")).or_insert(n);
    }
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .unwrap();
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(pre));
    tok.add_special_tokens(&[
        AddedToken::from("<|im_end|>", true),
        AddedToken::from("<|begin_of_text|>", true),
    ]);
    tok
}

/// GPT-2 style: `ByteLevel` with its own regex and a prefix space.
fn gpt2() -> Tokenizer {
    bpe(ByteLevel::default().into())
}

/// Llama 3 style: NFC, `Split` on its regex, then `ByteLevel` without a regex.
fn llama3() -> Tokenizer {
    let split = Split::new(
        SplitPattern::Regex(LLAMA3.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    let bl = ByteLevel::new(false, true, false);
    let mut tok = bpe(Sequence::new(vec![split.into(), bl.into()]).into());
    tok.with_normalizer(Some(NFC));
    tok
}

fn all() -> Vec<(&'static str, Tokenizer)> {
    vec![
        ("wordlevel", wordlevel()),
        ("lowercase", lowercase()),
        ("whitespace_nfc", whitespace_nfc()),
        ("split_removed", split_removed(false)),
        ("split_removed_inverted", split_removed(true)),
        ("gpt2", gpt2()),
        ("llama3", llama3()),
        ("metaspace_always", metaspace(PrependScheme::Always, true)),
        ("metaspace_never", metaspace(PrependScheme::Never, true)),
        ("metaspace_unsplit", metaspace(PrependScheme::Always, false)),
    ]
}

/// Pieces random texts are made of: vocabulary and unknown words, special and added
/// tokens (whole, cut, glued to words), whitespace runs, punctuation, digits, Unicode
/// (combining marks that NFC composes, scripts, emoji).
const PIECES: &[&str] = &[
    "t1",
    "t42",
    "t999",
    "t1000",
    "x",
    "Hello",
    "HELLO",
    "hello",
    "it's",
    "I'LL",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n",
    ",",
    "!?",
    "...",
    "0",
    "12345",
    "3.14",
    "é",
    "e\u{301}",
    "日本",
    "\u{200b}",
    "ÉCOLE",
    "😀",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<|im_",
    "<unk>",
    "<|begin_of_text|>",
    "t7<s>",
    "Ġt1",
    "_",
    "-",
];

fn ids(tok: &Tokenizer, lean: &Lean, text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    lean.ids(tok, text, &mut out).unwrap();
    out
}

#[test]
fn every_supported_pipeline_takes_the_lean_walk_and_gives_hfs_ids() {
    let mut long = String::new();
    for i in 0..2000u32 {
        long.push_str(&format!("t{} ", (i * 7919) % 1100));
        if i % 97 == 0 {
            long.push_str("<|im_end|>Hello,\n");
        }
    }
    for (name, tok) in all() {
        let lean = Lean::new(&tok).unwrap_or_else(|| panic!("{name}: no lean walk"));
        for text in ["", " ", "t1 t2", " Hello HELLO hello ", long.as_str()] {
            let want = tok.encode_fast(text, false).unwrap();
            assert_eq!(ids(&tok, &lean, text), want.get_ids(), "{name}: {text:?}");
        }
    }
}

/// Every pipeline with its lean walk, built once (building one runs its probes).
static BUILT: std::sync::LazyLock<Vec<(&'static str, Tokenizer, Lean)>> =
    std::sync::LazyLock::new(|| {
        all()
            .into_iter()
            .map(|(name, tok)| {
                let lean = Lean::new(&tok).unwrap();
                (name, tok, lean)
            })
            .collect()
    });

proptest::proptest! {
    #[test]
    fn random_texts_give_hfs_ids(picks in proptest::collection::vec(0..PIECES.len(), 0..48)) {
        let text: String = picks.iter().map(|&i| PIECES[i]).collect();
        for (name, tok, lean) in BUILT.iter() {
            let (tok, lean) = (tok, lean);
            let want = tok.encode_fast(text.as_str(), false).unwrap();
            proptest::prop_assert_eq!(ids(tok, lean, &text), want.get_ids().to_vec(), "{}", name);
        }
    }
}

#[test]
fn pipelines_it_does_not_cover_keep_the_hf_path() {
    // A pre-tokenizer step it does not walk.
    let tok = metaspace(PrependScheme::First, true);
    assert!(Lean::new(&tok).is_none());
    // A split behaviour it does not walk.
    let mut tok = wordlevel();
    let split = Split::new(" ", SplitDelimiterBehavior::MergedWithPrevious, false).unwrap();
    tok.with_pre_tokenizer(Some(split));
    assert!(Lean::new(&tok).is_none());
    // An added token that strips the spaces beside it.
    let mut tok = wordlevel();
    tok.add_special_tokens(&[AddedToken::from("<mask>", true).lstrip(true)]);
    assert!(Lean::new(&tok).is_none());
    // Special tokens encoded as text.
    let mut tok = wordlevel();
    tok.set_encode_special_tokens(true);
    assert!(Lean::new(&tok).is_none());
}

#[test]
fn a_sampled_difference_turns_the_lean_walk_off_and_answers_with_hfs_ids() {
    // A model whose lean walk was made for another tokenizer (its added tokens have
    // other ids): the walk is wrong on texts with them, which only the run-time check
    // can see. Every CHECK_EVERY-th text is compared.
    let tok = wordlevel();
    let other = {
        let mut t = super::testing::build_tokenizer(900).unwrap();
        t.with_post_processor(None::<TemplateProcessing>);
        t
    };
    let mut m = super::Model::new(tok, None);
    m.lean = Lean::new(&other);
    assert!(m.is_lean());
    let text = "t1 <|im_end|> t2";
    let right = m.tok.encode_fast(text, false).unwrap().get_ids().to_vec();
    let mut wrong_seen = 0;
    for _ in 0..CHECK_EVERY {
        let got = super::encode(&m, text, false, 1000).unwrap();
        if got != right {
            wrong_seen += 1;
        }
    }
    // All but the sampled one came from the wrong walk; the sampled one is HF's.
    assert_eq!(wrong_seen, CHECK_EVERY - 1);
    assert!(!m.is_lean());
    assert_eq!(m.lean.as_ref().unwrap().mismatches(), 1);
    assert_eq!(super::encode(&m, text, false, 1000).unwrap(), right);
}
