//! One step of the proxy's work on a request body, run once under callgrind for its
//! instruction count (repeatable on a loaded machine, unlike wall-clock):
//!
//! ```text
//! cargo build --release --example request_steps
//! valgrind --tool=callgrind --toggle-collect='request_steps::measured*' \
//!     target/release/examples/request_steps STEP WAY TOKENS
//! ```
//!
//! STEP: `parse` (the body read and dropped), `ids` (the prompt's token ids from a
//! parsed body), `text` (a text prompt through the test tokenizer), `hash` (the block
//! hashes, block size 16), `all` (parse + strip + ids or text + drop, as the proxy
//! does them; `all-text` for a text prompt). WAY: `tree` (the previous path: the whole
//! body as a `serde_json::Value`, kept here as it was) or `place` (the body read in
//! place: `proxy::request::Body`). TOKENS: the prompt's length. Bodies are built as
//! `kvroute-sim replay` builds them. `tools/request_steps.sh` runs the whole table.
//! The bytes allocated by the counted step (a counting allocator) are printed too.

use bytes::Bytes;
use kvroute::engine::RouteRequest;
use kvroute::proxy::request::{self, Endpoint};
use kvroute::proxy::{prompt, strip};
use kvroute::tokenize::Tokenizers;
use serde_json::Value;
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The system allocator, counting the bytes asked for while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATED.fetch_add(l.size(), Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATED.fetch_add(new, Ordering::Relaxed);
        }
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[path = "../benches/support/request_body.rs"]
mod request_body;
use request_body::body;

/// The previous path, as it was: the body as a tree, its fields read from it.
mod tree {
    use serde_json::Value;

    pub fn parse(bytes: &[u8]) -> Option<(Value, String, bool, Option<u32>)> {
        let body: Value = serde_json::from_slice(bytes).ok()?;
        let obj = body.as_object()?;
        let model = obj.get("model")?.as_str()?.to_string();
        let stream = obj.get("stream")?.as_bool()?;
        let max = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .filter_map(|k| obj.get(*k))
            .find_map(Value::as_u64)
            .map(|n| n.min(u64::from(u32::MAX)) as u32);
        Some((body, model, stream, max))
    }

    pub fn strip(body: &mut Value) -> usize {
        let Some(obj) = body.as_object_mut() else {
            return 0;
        };
        let mut n = 0;
        for (name, _) in super::strip::TOP {
            n += usize::from(obj.shift_remove(name).is_some());
        }
        if let Some(Value::Object(x)) = obj.get_mut("vllm_xargs") {
            for name in super::strip::XARGS {
                n += usize::from(x.shift_remove(name).is_some());
            }
        }
        n
    }

    pub fn ids(body: &Value) -> Option<Vec<u32>> {
        let items = body.get("prompt")?.as_array()?;
        items
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    }
}

enum Way {
    Tree,
    Place,
}

fn run(step: &str, way: &Way, raw: &Bytes, tok: &Tokenizers, rr: &RouteRequest) -> usize {
    let c = Endpoint::Completions;
    match (step, way) {
        ("parse", Way::Tree) => tree::parse(raw).map_or(0, |t| t.1.len()),
        ("parse", Way::Place) => request::parse(raw).map_or(0, |c| c.model.len()),
        ("ids", Way::Tree) => {
            let v: Value = serde_json::from_slice(raw).unwrap_or_default();
            let n = measured_part(|| tree::ids(&v).map_or(0, |i| i.len()));
            drop(v);
            n
        }
        ("ids", Way::Place) => {
            let b = request::parse(raw).ok();
            let body = b.map(|b| b.body).unwrap_or_default();
            measured_part(|| {
                prompt::token_ids(c, "", &body).map_or(0, |i| i.map_or(0, |i| i.len()))
            })
        }
        ("text", Way::Tree) => {
            let v: Value = serde_json::from_slice(raw).unwrap_or_default();
            let e = kvroute::tokenize::Endpoint::Completions;
            measured_part(|| {
                tok.prompt_tokens(e, "sim-model", &v)
                    .map_or(0, |t| t.map_or(0, |t| t.len()))
            })
        }
        ("text", Way::Place) => {
            let body = request::parse(raw).map(|b| b.body).unwrap_or_default();
            measured_part(|| {
                prompt::prompt_tokens(Some(tok), c, "sim-model", &body)
                    .map_or(0, |t| t.map_or(0, |t| t.len()))
            })
        }
        ("hash", _) => measured_part(|| {
            rr.prepare_with(16, 0, 1 << 20)
                .map_or(0, |p| p.hashes.len())
        }),
        ("all" | "all-text", Way::Tree) => {
            let Some((mut v, model, ..)) = tree::parse(raw) else {
                return 0;
            };
            let e = kvroute::tokenize::Endpoint::Completions;
            tree::strip(&mut v);
            let n = tok
                .prompt_tokens(e, &model, &v)
                .map_or(0, |t| t.map_or(0, |t| t.len()));
            drop(v);
            n
        }
        ("all" | "all-text", Way::Place) => {
            let Ok(mut creq) = request::parse(raw) else {
                return 0;
            };
            creq.body.strip();
            let t = prompt::prompt_tokens_quick(Some(tok), c, &creq.model, &creq.body);
            let n = t.map_or(0, |t| t.map_or(0, |t| t.map_or(0, |t| t.len())));
            drop(creq);
            n
        }
        _ => panic!("unknown step {step}"),
    }
}

thread_local! {
    static PART: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Steps that need a parsed body count only their own part (`measured_part`).
fn measured_part(f: impl FnOnce() -> usize) -> usize {
    if PART.with(|p| p.get()) {
        measured_inner(f)
    } else {
        f()
    }
}

#[inline(never)]
fn measured_inner(f: impl FnOnce() -> usize) -> usize {
    COUNTING.store(true, Ordering::Relaxed);
    let n = black_box(f());
    COUNTING.store(false, Ordering::Relaxed);
    n
}

#[inline(never)]
fn measured(step: &str, way: &Way, raw: &Bytes, tok: &Tokenizers, rr: &RouteRequest) -> usize {
    COUNTING.store(true, Ordering::Relaxed);
    let n = black_box(run(step, way, raw, tok, rr));
    COUNTING.store(false, Ordering::Relaxed);
    n
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: request_steps parse|ids|text|hash|all|all-text tree|place TOKENS";
    let (Some(step), Some(way), Some(n)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let way = match way.as_str() {
        "tree" => Way::Tree,
        "place" => Way::Place,
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let n: usize = n.parse().unwrap_or(1024);
    let tok = kvroute::tokenize::testing::in_memory("sim-model", 32_000)
        .expect("test tokenizer")
        .with_max_prompt_tokens(1 << 20);
    let text = matches!(step.as_str(), "text" | "all-text");
    let raw = body(n, !text);
    let toks = tree::ids(&serde_json::from_slice(&body(n, true)).unwrap_or_default());
    let rr = RouteRequest {
        request_id: "px=bench".into(),
        tokens: toks,
        ..Default::default()
    };
    // Once to warm (lazy statics, allocator pages), then once counted.
    run(step, &way, &raw, &tok, &rr);
    let split = matches!(step.as_str(), "ids" | "text" | "hash");
    PART.with(|p| p.set(split));
    let out = if split {
        run(step, &way, &raw, &tok, &rr)
    } else {
        measured(step, &way, &raw, &tok, &rr)
    };
    let bytes = ALLOCATED.load(Ordering::Relaxed);
    println!("{step} {n} -> {out} tokens, {bytes} bytes allocated");
}
