//! The lean walk against HF's pipeline: every supported step, random texts, the
//! tokenizers it must refuse, and the run-time check that turns it off.

use super::lean::{Lean, CHECK_EVERY};
use super::pipelines::{all, PIECES};
use tokenizers::pre_tokenizers::split::Split;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

fn wordlevel() -> Tokenizer {
    super::fixture::build_tokenizer(1000).unwrap()
}

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

/// `Metaspace`'s `First` marks only what starts the text: not a piece after an
/// added token, not a later word of an earlier split (HF reads the piece's
/// original offset; the walk carries it along).
#[test]
fn metaspace_first_marks_only_the_start_of_the_text() {
    let marked = |tok: &Tokenizer, w: &str| tok.token_to_id(&format!("▁{w}")).unwrap();
    let bare = |tok: &Tokenizer, w: &str| tok.token_to_id(w).unwrap();
    for (name, tok) in all() {
        if !name.contains("first") {
            continue;
        }
        let lean = Lean::new(&tok).unwrap();
        for text in [
            "t1 t2",
            "<|im_end|>t1 t2",
            "t1<|im_end|>t2",
            " t1",
            "t1  t2 ",
        ] {
            let want = tok.encode_fast(text, false).unwrap();
            assert_eq!(ids(&tok, &lean, text), want.get_ids(), "{name}: {text:?}");
        }
        let got = ids(&tok, &lean, "<|im_end|>t1");
        assert_eq!(got[1], bare(&tok, "t1"), "{name}");
        assert_eq!(ids(&tok, &lean, "t1")[0], marked(&tok, "t1"), "{name}");
    }
}

#[test]
fn pipelines_it_does_not_cover_keep_the_hf_path() {
    // A pre-tokenizer step it does not walk.
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
        let mut t = super::fixture::build_tokenizer(900).unwrap();
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
        let got = super::model::encode(&m, text, false, 1000).unwrap();
        if got != right {
            wrong_seen += 1;
        }
    }
    // All but the sampled one came from the wrong walk; the sampled one is HF's.
    assert_eq!(wrong_seen, CHECK_EVERY - 1);
    assert!(!m.is_lean());
    assert_eq!(m.lean.as_ref().unwrap().mismatches(), 1);
    assert_eq!(super::model::encode(&m, text, false, 1000).unwrap(), right);
}
