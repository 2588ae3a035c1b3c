//! Codec throughput: framing + decoding of `Stored` events with 64 hashes (the event
//! ingest hot path) and of `Route` requests (the routing hot path).
//!
//! Each iteration decodes a stream of many back-to-back frames from a fresh copy of a
//! prebuilt `BytesMut` (the copy is made outside the timed part), so the numbers include
//! the frame splitter and the zero-copy list construction, like the runtime's read
//! loop. Each stream is measured twice, reported once in bytes/s and once in frames/s.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvroute::codec::{EventMsg, FrameDecoder, Prompt, RequestMsg, Route};
use kvroute::config::Mode;
use kvroute::types::Tier;

const FRAMES: usize = 1024;

fn stored_stream() -> (BytesMut, usize) {
    let mut out = BytesMut::new();
    for i in 0..FRAMES as u64 {
        let hashes: Vec<u64> = (0..64)
            .map(|j| (i << 8 | j).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        EventMsg::encode_stored(&mut out, i, Tier::Device, Some(i), &hashes);
    }
    let frame_len = out.len() / FRAMES;
    (out, frame_len)
}

fn route_stream() -> (BytesMut, usize) {
    let mut out = BytesMut::new();
    for i in 0..FRAMES as u64 {
        let hashes: Vec<u64> = (0..32).map(|j| j * 31 + i).collect();
        let route = Route {
            model: "llama-3-70b".into(),
            mode: Some(Mode::Kv),
            input_tokens: Some(32 * 128),
            expected_output_tokens: Some(256),
            tolerations: vec!["spot".into()],
            ..Route::new(i, format!("req-{i}"), Prompt::from_hashes(&hashes))
        };
        RequestMsg::Route(route).encode(&mut out);
    }
    let frame_len = out.len() / FRAMES;
    (out, frame_len)
}

/// Times `decode_all` over a fresh copy of `stream` (the copy is not timed).
fn bench_stream(
    c: &mut Criterion,
    name: String,
    throughput: Throughput,
    stream: &BytesMut,
    decode_all: fn(BytesMut) -> u64,
) {
    let mut g = c.benchmark_group("codec");
    g.throughput(throughput);
    g.bench_function(name, |b| {
        b.iter_batched(
            || stream.clone(),
            |buf| black_box(decode_all(buf)),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// Splits and decodes every `Stored` frame, touching the last hash of each.
fn decode_stored(mut buf: BytesMut) -> u64 {
    let mut dec = FrameDecoder::default();
    let mut sum = 0u64;
    while let Ok(Some(f)) = dec.decode(&mut buf) {
        if let Ok(EventMsg::Stored { hashes, .. }) = EventMsg::decode(&f) {
            sum = sum.wrapping_add(hashes.get(63).unwrap_or(0));
        }
    }
    sum
}

/// Splits and decodes every `Route` frame.
fn decode_route(mut buf: BytesMut) -> u64 {
    let mut dec = FrameDecoder::default();
    let mut n = 0u64;
    while let Ok(Some(f)) = dec.decode(&mut buf) {
        if let Ok(RequestMsg::Route(r)) = RequestMsg::decode(&f) {
            n += r.request_id.len() as u64;
        }
    }
    n
}

fn bench_stored(c: &mut Criterion) {
    let (stream, frame_len) = stored_stream();
    let bytes = Throughput::Bytes(stream.len() as u64);
    let name = format!("decode_stored_64_hashes/bytes/{FRAMES}x{frame_len}B");
    bench_stream(c, name, bytes, &stream, decode_stored);
    let frames = Throughput::Elements(FRAMES as u64);
    let name = format!("decode_stored_64_hashes/frames/{FRAMES}x{frame_len}B");
    bench_stream(c, name, frames, &stream, decode_stored);
}

fn bench_route(c: &mut Criterion) {
    let (stream, frame_len) = route_stream();
    let bytes = Throughput::Bytes(stream.len() as u64);
    let name = format!("decode_route_32_hashes/bytes/{FRAMES}x{frame_len}B");
    bench_stream(c, name, bytes, &stream, decode_route);
    let frames = Throughput::Elements(FRAMES as u64);
    let name = format!("decode_route_32_hashes/frames/{FRAMES}x{frame_len}B");
    bench_stream(c, name, frames, &stream, decode_route);
}

criterion_group!(benches, bench_stored, bench_route);
criterion_main!(benches);
