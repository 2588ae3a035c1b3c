//! Tokenization time per request (`kvroute::tokenize`), for sizing the proxy's cores:
//! `cargo run --release --no-default-features --example tokenize_time [-- NAME=DIR ...]`.
//!
//! Times `prompt_tokens` on the test tokenizer (WordLevel, `kvroute-sim tokenizer`) and
//! on any HF tokenizer directories given (e.g. the byte-level BPE that
//! tests/py/hf_tokenizer.py writes): completions prompts and 4-turn chats of 1k, 8k and
//! 32k words, median of repeated runs. Each tokenizer twice, alternately: by the lean
//! walk of its pipeline (the default where it is exact) and by HF's pipeline
//! (`--tokenize-lean false`), with the ratio.

use kvroute::tokenize::{testing, Endpoint, Tokenizers};
use serde_json::json;
use std::time::Instant;

fn median_us(mut f: impl FnMut() -> usize) -> (f64, usize) {
    let mut times = Vec::new();
    let mut n = 0;
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed().as_secs_f64() < 1.0 && times.len() < 200) {
        let t = Instant::now();
        n = f();
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], n)
}

fn main() {
    let test = || testing::in_memory("m", testing::DEFAULT_VOCAB).expect("test tokenizer");
    let mut sets: Vec<(String, Tokenizers, Tokenizers, bool)> = vec![(
        "test (WordLevel)".into(),
        test(),
        test().with_lean(false),
        true,
    )];
    for arg in std::env::args().skip(1) {
        let (name, dir) = arg.split_once('=').expect("NAME=DIR");
        let load = || Tokenizers::load(&[("m".into(), dir.into())]).expect("load");
        sets.push((name.into(), load(), load().with_lean(false), false));
    }
    println!("| tokenizer | request | words | tokens | lean µs | HF pipeline µs | HF / lean | lean µs / 1k tokens |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, lean, hf, ids_words) in &sets {
        assert!(
            lean.is_lean("m"),
            "{name}: the lean walk does not cover this tokenizer"
        );
        for words in [1_000usize, 8_000, 32_000] {
            let list: Vec<String> = if *ids_words {
                (0..words as u32)
                    .map(|i| format!("t{}", i * 7 % 32_000))
                    .collect()
            } else {
                let base = [
                    "The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog.",
                    "Zürich", "café", "12345",
                ];
                (0..words)
                    .map(|i| base[i % base.len()].to_string())
                    .collect()
            };
            let text = list.join(" ");
            let q = words / 4;
            let part = |i: usize| list[i * q..(i + 1) * q].join(" ");
            let comp = json!({"model": "m", "prompt": text});
            let chat = json!({"model": "m", "messages": [
                {"role": "system", "content": part(0)},
                {"role": "user", "content": part(1)},
                {"role": "assistant", "content": part(2)},
                {"role": "user", "content": part(3)},
            ]});
            for (label, ep, body) in [
                ("completions", Endpoint::Completions, &comp),
                ("chat", Endpoint::Chat, &chat),
            ] {
                let run = |t: &Tokenizers| {
                    median_us(|| {
                        t.prompt_tokens(ep, "m", body)
                            .ok()
                            .flatten()
                            .map_or(0, |v| v.len())
                    })
                };
                let (mut l, mut h) = (Vec::new(), Vec::new());
                let mut n = 0;
                for _ in 0..3 {
                    let (us, k) = run(lean);
                    l.push(us);
                    let (us, k2) = run(hf);
                    h.push(us);
                    assert_eq!(k, k2, "the two paths gave different token counts");
                    n = k;
                }
                l.sort_by(f64::total_cmp);
                h.sort_by(f64::total_cmp);
                let (l, h) = (l[1], h[1]);
                println!(
                    "| {name} | {label} | {words} | {n} | {l:.0} | {h:.0} | {:.1}× | {:.0} |",
                    h / l,
                    l * 1000.0 / n.max(1) as f64
                );
            }
        }
    }
}
