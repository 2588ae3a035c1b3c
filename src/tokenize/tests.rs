//! Unit tests of the tokenize module (built on the test tokenizer of `testing`).

use super::testing::{self, extra_id, text_of};
use super::*;
use serde_json::json;

fn dir_with(vocab: u32) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    testing::write_dir(d.path(), vocab).unwrap();
    d
}

fn load(vocab: u32) -> (tempfile::TempDir, Tokenizers) {
    let d = dir_with(vocab);
    let t = Tokenizers::load(&[("m".into(), d.path().to_path_buf())]).unwrap();
    (d, t)
}

#[test]
fn completions_string_adds_bos_and_maps_words_to_ids() {
    let (_d, t) = load(100);
    let body = json!({"model": "m", "prompt": "t5 t17 t3"});
    let ids = t
        .prompt_tokens(Endpoint::Completions, "m", &body)
        .unwrap()
        .unwrap();
    assert_eq!(ids, vec![extra_id(100, "<s>").unwrap(), 5, 17, 3]);
    let body = json!({"prompt": "t5 t17", "add_special_tokens": false});
    let ids = t
        .prompt_tokens(Endpoint::Completions, "m", &body)
        .unwrap()
        .unwrap();
    assert_eq!(ids, vec![5, 17]);
}

#[test]
fn chat_renders_the_template_without_adding_bos_twice() {
    let (_d, t) = load(100);
    let body = json!({"messages": [{"role": "user", "content": "t1 t2"}]});
    let ids = t
        .prompt_tokens(Endpoint::Chat, "m", &body)
        .unwrap()
        .unwrap();
    let e = |s| extra_id(100, s).unwrap();
    assert_eq!(
        ids,
        vec![
            e("<s>"),
            e("<|im_start|>"),
            e("user"),
            1,
            2,
            e("<|im_end|>"),
            e("<|im_start|>"),
            e("assistant")
        ]
    );
}
