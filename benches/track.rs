//! Reading a non-streamed JSON answer for the lifecycle (`proxy::track`): the
//! constant-memory scan (`proxy::jscan`, fed in 16 KiB chunks as the answer streams
//! through) against what it replaced, serde_json's one-pass read (`proxy::event::read`)
//! of the whole answer once buffered. Two answers: 2 KiB (a typical completion) and
//! 1 MiB (a long one, mostly string content), reported in bytes/s.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvroute::proxy::event;
use kvroute::proxy::track::Tracker;

fn answer(text_bytes: usize) -> Vec<u8> {
    let text: String = "The quick brown fox jumps over the lazy dog. "
        .chars()
        .cycle()
        .take(text_bytes)
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 512, "total_tokens": 612}
    }))
    .unwrap_or_default()
}

fn json_answers(c: &mut Criterion) {
    let mut g = c.benchmark_group("json_answer");
    for (name, size) in [("2KiB", 2 << 10), ("1MiB", 1 << 20)] {
        let a = answer(size);
        g.throughput(Throughput::Bytes(a.len() as u64));
        g.bench_function(format!("scan_{name}"), |b| {
            b.iter(|| {
                let mut t = Tracker::new(false);
                for chunk in a.chunks(16 << 10) {
                    t.feed(black_box(chunk));
                }
                black_box(t.finish());
                black_box(t.tokens())
            })
        });
        g.bench_function(format!("buffered_read_{name}"), |b| {
            b.iter(|| {
                let mut buf = Vec::new();
                for chunk in a.chunks(16 << 10) {
                    buf.extend_from_slice(black_box(chunk));
                }
                black_box(event::read(&buf, false))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, json_answers);
criterion_main!(benches);
