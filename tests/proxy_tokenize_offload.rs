//! `tokenize_inline_max_bytes` through the real binary: request bodies above it are
//! tokenized on the core's blocking thread, and routing is the same either way (the
//! same token ids, so a shared prefix still goes back to the worker that cached it);
//! counted in `kvroute_proxy_tokenized_off_core_total`. Flag, env and TOML. A prompt
//! of token ids is only read, and stays on the core up to 16 times the bound.

mod common;

use common::proxy::{post, register, FakeWorker};
use common::tokenizer::TestTokenizer;
use common::Server;
use serde_json::{json, Value};
use std::sync::{Mutex, MutexGuard};

/// One test at a time: one sets an environment variable for the router it spawns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Fields drop in order: the router and workers stop before the tokenizer directory
/// goes.
struct Setup {
    s: Server,
    tok: kvroute::tokenize::Tokenizers,
    _ws: Vec<FakeWorker>,
    _dir: TestTokenizer,
}

fn start(extra: &[&str]) -> Option<Setup> {
    if !common::python_has("json", "python3") {
        return None;
    }
    let dir = TestTokenizer::new(5000);
    let tok_flag = dir.flag();
    let mut flags = vec!["--block-size", "4", "--tokenizer", &tok_flag];
    flags.extend_from_slice(extra);
    let s = Server::start(2, &flags);
    let tok = dir.load();
    let ws: Vec<FakeWorker> = (0..3)
        .map(|i| FakeWorker::start(&format!("w{i}"), &[]))
        .collect();
    for w in &ws {
        register(&s, &w.id, "m", "aggregated", &w.url());
    }
    Some(Setup {
        s,
        tok,
        _ws: ws,
        _dir: dir,
    })
}

/// One round of "prompt, its blocks stored on the chosen worker, a longer prompt
/// sharing it": the longer one must go to the same worker. `prefix`: token ids of the
/// first prompt's blocks to store.
fn prefix_round(st: &Setup, first: Value, prefix: &[u32], second: Value, round: u32) {
    let a = post(&st.s, "/v1/completions", &first.to_string(), &[]);
    assert_eq!(a.status, 200, "{a:?}");
    let w = a.header("x-kvroute-worker").unwrap().to_string();
    let mut hashes = Vec::new();
    kvroute::hash::sequence_hashes_after(None, prefix, 4, &mut hashes);
    let before = st.s.cached(&w);
    st.s.store(&w, "device", &hashes);
    st.s.wait_until("blocks indexed", |s| {
        s.cached(&w) >= before + hashes.len() as u64
    });
    let b = post(&st.s, "/v1/completions", &second.to_string(), &[]);
    assert_eq!(b.status, 200);
    assert_eq!(
        b.header("x-kvroute-worker"),
        Some(w.as_str()),
        "round {round}"
    );
}

/// Two [`prefix_round`]s with text prompts of `words` words.
fn prefix_rounds(st: &Setup, words: u32) {
    for round in 0..2u32 {
        let text: String = (0..words)
            .map(|i| format!("t{} ", (round * 7 + i) % 4000))
            .collect();
        let first = json!({"model": "m", "prompt": text, "max_tokens": 2});
        let ids = st
            .tok
            .prompt_tokens(kvroute::tokenize::Endpoint::Completions, "m", &first)
            .unwrap()
            .unwrap();
        let second =
            json!({"model": "m", "prompt": format!("{text}t1 t2 t3 t4 t5"), "max_tokens": 2});
        prefix_round(st, first, &ids, second, round);
    }
}

/// Two [`prefix_round`]s with prompts of `n` token ids (~5 bytes each in the body),
/// storing the first 1,000 blocks.
fn id_rounds(st: &Setup, n: u32) {
    for round in 0..2u32 {
        // Another prefix per call and per round (none of them cached yet).
        let ids: Vec<u32> = (0..n).map(|i| 1000 + (round * 7 + n + i) % 3999).collect();
        let longer: Vec<u32> = ids.iter().copied().chain(1..6).collect();
        let first = json!({"model": "m", "prompt": ids, "max_tokens": 2});
        let second = json!({"model": "m", "prompt": longer, "max_tokens": 2});
        prefix_round(st, first, &ids[..4000], second, round);
    }
}

fn off_core(s: &Server) -> f64 {
    s.metric("kvroute_proxy_tokenized_off_core_total")
}

#[test]
fn every_prompt_off_the_core_routes_the_same() {
    let _one = serial();
    let Some(st) = start(&["--proxy-tokenize-inline-max-bytes", "0"]) else {
        return;
    };
    prefix_rounds(&st, 60);
    assert_eq!(off_core(&st.s), 4.0, "all four requests off the core");
    assert_eq!(st.s.metric("kvroute_proxy_untokenized_total"), 0.0);
}

#[test]
fn by_default_only_long_bodies_leave_the_core() {
    let _one = serial();
    let Some(st) = start(&[]) else {
        return;
    };
    prefix_rounds(&st, 60); // ~400-byte bodies
    assert_eq!(off_core(&st.s), 0.0, "short bodies stay on the core");
    prefix_rounds(&st, 3000); // ~20 KB bodies, over the default 8,192
    assert_eq!(off_core(&st.s), 4.0, "long bodies leave it");
    // The thread that tokenized them runs below the executors (`service::runtime::blocking`):
    // some thread of the router now has a higher nice value than the process had.
    let nices = thread_nices(st.s.pid());
    let base = nices.iter().copied().min().unwrap_or(0);
    assert!(
        nices.iter().any(|&n| n >= base.max(10)),
        "a blocking thread at nice >= 10: {nices:?}"
    );
}

#[test]
fn a_prompt_of_token_ids_stays_on_the_core_up_to_sixteen_times_the_bound() {
    let _one = serial();
    let Some(st) = start(&[]) else {
        return;
    };
    id_rounds(&st, 4000); // ~20 KB bodies: over 8,192, under 16 x 8,192
    assert_eq!(off_core(&st.s), 0.0, "ids are only read: on the core");
    id_rounds(&st, 30_000); // ~150 KB bodies, over 16 x 8,192
    assert_eq!(off_core(&st.s), 4.0, "longer lists leave it");
}

/// Nice value of every thread of process `pid` (field 19 of `/proc/PID/task/TID/stat`).
fn thread_nices(pid: u32) -> Vec<i64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|st| {
            // After the command name's closing parenthesis: state is field 3, nice 19.
            let rest = &st[st.rfind(')')? + 2..];
            rest.split_whitespace().nth(16)?.parse().ok()
        })
        .collect()
}

#[test]
fn the_knob_reads_from_env_and_toml() {
    let _one = serial();
    std::env::set_var("KVROUTE_PROXY_TOKENIZE_INLINE_MAX_BYTES", "0");
    let st = start(&[]);
    std::env::remove_var("KVROUTE_PROXY_TOKENIZE_INLINE_MAX_BYTES");
    let Some(st) = st else {
        return;
    };
    prefix_rounds(&st, 30);
    assert_eq!(off_core(&st.s), 4.0, "env");
    drop(st);
    let toml =
        std::env::temp_dir().join(format!("kvroute-tok-offload-{}.toml", std::process::id()));
    std::fs::write(&toml, "[proxy]\ntokenize_inline_max_bytes = 0\n").unwrap();
    let t = toml.to_string_lossy().to_string();
    let st = start(&["--config", &t]).unwrap();
    prefix_rounds(&st, 30);
    assert_eq!(off_core(&st.s), 4.0, "TOML");
    let _ = std::fs::remove_file(&toml);
}

fn answer_waits(s: &Server, kind: &str) -> f64 {
    s.metric(&format!("kvroute_answer_waits_total{{kind=\"{kind}\"}}"))
}

#[test]
fn a_prompt_tokenized_on_the_core_is_announced_to_the_other_core() {
    let _one = serial();
    // A bound of a second: every announced query arrives well within it, even on a
    // loaded machine, so none expires.
    let Some(st) = start(&["--answer-spin-us", "1000000"]) else {
        return;
    };
    prefix_rounds(&st, 60); // four short bodies, tokenized on the core
    st.s.wait_until("announcements counted", |s| {
        answer_waits(s, "expected") == 4.0
    });
    assert_eq!(answer_waits(&st.s, "expect_expired"), 0.0);
    // A long body is tokenized off the core, which takes long enough that the other
    // core would spin for nothing: not announced.
    prefix_rounds(&st, 3000);
    assert_eq!(off_core(&st.s), 4.0);
    assert_eq!(answer_waits(&st.s, "expected"), 4.0);
    drop(st);
    // No answer spin, no announcement.
    let st = start(&["--answer-spin-us", "0"]).unwrap();
    prefix_rounds(&st, 60);
    assert_eq!(answer_waits(&st.s, "expected"), 0.0);
}
