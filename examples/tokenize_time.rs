//! Tokenization time per request (`kvroute::tokenize`), for sizing the proxy's cores:
//! `cargo run --release --no-default-features --example tokenize_time [-- NAME=DIR ...]`.
//!
//! Times `prompt_tokens` on the test tokenizer (WordLevel, `kvroute-sim tokenizer`) and
//! on any HF tokenizer directories given (e.g. the byte-level BPE that
//! tests/py/hf_tokenizer.py writes): completions prompts and 4-turn chats of 1k, 8k and
//! 32k words, median of repeated runs.

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
    let mut sets: Vec<(String, Tokenizers, bool)> = vec![(
        "test (WordLevel)".into(),
        testing::in_memory("m", testing::DEFAULT_VOCAB).expect("test tokenizer"),
        true,
    )];
    for arg in std::env::args().skip(1) {
        let (name, dir) = arg.split_once('=').expect("NAME=DIR");
        let t = Tokenizers::load(&[("m".into(), dir.into())]).expect("load");
        sets.push((name.into(), t, false));
    }
    println!("| tokenizer | request | words | tokens | median µs | µs / 1k tokens |");
    println!("|---|---|---|---|---|---|");
    for (name, t, ids_words) in &sets {
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
                let (us, n) = median_us(|| {
                    t.prompt_tokens(ep, "m", body)
                        .ok()
                        .flatten()
                        .map_or(0, |v| v.len())
                });
                println!(
                    "| {name} | {label} | {words} | {n} | {us:.0} | {:.0} |",
                    us * 1000.0 / n.max(1) as f64
                );
            }
        }
    }
}
