//! Tokenizer pipelines made of every step the lean walk (`tokenize::lean`) covers,
//! built in memory: for the walk's differential tests and the `tokenize_lean` fuzz
//! target, which compare its ids with HF's pipeline on the same texts.
//!
//! Each is small (a handful of words or merges) but real: the steps, regexes and
//! special tokens are those of the tokenizer families they stand for.

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
    super::fixture::build_tokenizer(1000).expect("a vocabulary of 1,000 words is valid")
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
    let split = Split::new(pattern, SplitDelimiterBehavior::Removed, invert)
        .expect("a fixed test pipeline builds");
    tok.with_pre_tokenizer(Some(split));
    tok
}

/// SentencePiece style: a word-level vocabulary of `▁`-prefixed and bare words behind
/// `Metaspace` with `scheme`, split or not.
pub fn metaspace(scheme: PrependScheme, split: bool) -> Tokenizer {
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
        .expect("a fixed test pipeline builds");
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, split)));
    tok.add_special_tokens(&[AddedToken::from("<|im_end|>", true)]);
    tok
}

/// `WhitespaceSplit` before a `First` `Metaspace`: only the first word of the text
/// (not of each piece) gets the marker.
fn words_then_metaspace_first() -> Tokenizer {
    let mut tok = metaspace(PrependScheme::First, false);
    let seq = Sequence::new(vec![
        tokenizers::pre_tokenizers::whitespace::WhitespaceSplit.into(),
        Metaspace::new('▁', PrependScheme::First, false).into(),
    ]);
    tok.with_pre_tokenizer(Some(seq));
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
        .expect("a fixed test pipeline builds");
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(pre));
    tok.add_special_tokens(&[
        AddedToken::from("<|im_end|>", true),
        AddedToken::from("<|begin_of_text|>", true),
    ]);
    tok
}

/// GPT-2 style: `ByteLevel` with its own regex and a prefix space.
pub fn gpt2() -> Tokenizer {
    bpe(ByteLevel::default().into())
}

/// Llama 3 style: NFC, `Split` on its regex, then `ByteLevel` without a regex.
fn llama3() -> Tokenizer {
    let split = Split::new(
        SplitPattern::Regex(LLAMA3.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .expect("a fixed test pipeline builds");
    let bl = ByteLevel::new(false, true, false);
    let mut tok = bpe(Sequence::new(vec![split.into(), bl.into()]).into());
    tok.with_normalizer(Some(NFC));
    tok
}

/// Every pipeline, by name.
pub fn all() -> Vec<(&'static str, Tokenizer)> {
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
        ("metaspace_first", metaspace(PrependScheme::First, true)),
        (
            "metaspace_first_unsplit",
            metaspace(PrependScheme::First, false),
        ),
        ("words_then_metaspace_first", words_then_metaspace_first()),
    ]
}

/// Pieces that probe and test texts are glued from: vocabulary and unknown words,
/// special and added tokens (whole, cut, glued to words), markers of other
/// tokenizer families (`Ġ`, `▁`), whitespace runs, punctuation, digits, Unicode
/// (combining marks that NFC composes, scripts, emoji, zero-width).
pub const PIECES: &[&str] = &[
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
    "world",
    "I'll",
    "don't",
    "   ",
    " \n ",
    ".",
    "(",
    ")",
    "{\"a\": 1}",
    "123",
    "4567",
    "naïve",
    "日本語",
    "한국어",
    "Привет",
    "\u{301}",
    "a\u{301}",
    "ﬁ",
    "--",
    "'",
    "'s",
    "Ġ",
    "▁",
    "\u{b}",
    "\u{c}",
    "t5\u{b}t6\u{c}",
    "\u{a0}",
    "t8\u{3000}t9",
];
