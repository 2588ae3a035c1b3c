//! The router's work per proxied request before it routes, step by step, against the
//! prompt's length (1k, 4k, 16k, 64k tokens; token ids and text): reading the client
//! body (`proxy::request::parse`, in place) against what it replaced (a
//! `serde_json::Value` tree of the whole body), the prompt's token ids
//! (`proxy::prompt`: read in place, or from the tree; text through the test
//! tokenizer), and the block hashes (`RouteRequest::prepare_with`, block size 16).
//! Bodies are built as `kvroute-sim replay` builds them. `cargo bench --bench request`;
//! `examples/request_steps.rs` runs the same steps under callgrind.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvroute::engine::RouteRequest;
use kvroute::proxy::prompt;
use kvroute::proxy::request::{self, Endpoint};
use serde_json::Value;

#[path = "support/request_body.rs"]
mod request_body;
use request_body::body;

/// The tree path the proxy had: the whole body as a `Value`, then the ids from it.
fn tree_ids(raw: &[u8]) -> Option<Vec<u32>> {
    let v: Value = serde_json::from_slice(raw).ok()?;
    let items = v.get("prompt")?.as_array()?;
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn steps(c: &mut Criterion) {
    let tok = kvroute::tokenize::testing::in_memory("sim-model", 32_000).expect("tokenizer");
    let tok = tok.with_max_prompt_tokens(1 << 20);
    let mut g = c.benchmark_group("request");
    for n in [1 << 10, 4 << 10, 16 << 10, 64 << 10] {
        let k = format!("{}k", n >> 10);
        g.throughput(Throughput::Elements(n as u64));
        let ids = body(n, true);
        g.bench_function(format!("ids/tree/{k}"), |b| {
            b.iter(|| black_box(tree_ids(black_box(&ids))))
        });
        g.bench_function(format!("ids/in_place/{k}"), |b| {
            b.iter(|| {
                let c = request::parse(black_box(&ids)).expect("body");
                black_box(prompt::token_ids(Endpoint::Completions, &c.model, &c.body))
            })
        });
        let text = body(n, false);
        g.bench_function(format!("text/tree/{k}"), |b| {
            b.iter(|| {
                let v: Value = serde_json::from_slice(black_box(&text)).expect("body");
                let e = kvroute::tokenize::Endpoint::Completions;
                black_box(tok.prompt_tokens(e, "sim-model", &v))
            })
        });
        g.bench_function(format!("text/in_place/{k}"), |b| {
            b.iter(|| {
                let c = request::parse(black_box(&text)).expect("body");
                let t = Some(&tok);
                black_box(prompt::prompt_tokens(
                    t,
                    Endpoint::Completions,
                    &c.model,
                    &c.body,
                ))
            })
        });
        let c = request::parse(&ids).expect("body");
        let toks = prompt::token_ids(Endpoint::Completions, "", &c.body)
            .expect("ids")
            .expect("ids");
        let rr = RouteRequest {
            request_id: "px=bench".into(),
            tokens: Some(toks),
            ..Default::default()
        };
        g.bench_function(format!("hash/{k}"), |b| {
            b.iter(|| black_box(rr.prepare_with(16, 0, 1 << 20)))
        });
    }
    g.finish();
}

criterion_group!(benches, steps);
criterion_main!(benches);
