//! Codec throughput: framing + decoding of `Stored` events with 64 hashes (the event
//! ingest hot path) and of `Route` requests (the routing hot path); decoding of vLLM's
//! msgpack `KVEventBatch` payloads (the ZMQ ingest path, `engines::vllm`); sealing and
//! opening a replica's event record (`cluster::auth`, HMAC-SHA256 over each record a
//! replica publishes or applies).
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

/// One vLLM `KVEventBatch` as the engine publishes it after a scheduler step:
/// `[ts, events, dp_rank]` with 32 positional `BlockStored` events of 4 blocks each
/// (u64 hashes, 128 token ids per block below 50,000, as a real vocabulary gives).
fn vllm_payload() -> (Vec<u8>, u64) {
    use rmp::encode as e;
    const EVENTS: u64 = 32;
    const BLOCKS: u64 = 4;
    let mut out = Vec::new();
    let w = &mut out;
    let ok = "writing to a Vec cannot fail";
    e::write_array_len(w, 3).expect(ok);
    e::write_f64(w, 1.0).expect(ok);
    e::write_array_len(w, EVENTS as u32).expect(ok);
    for i in 0..EVENTS {
        e::write_array_len(w, 7).expect(ok);
        e::write_str(w, "BlockStored").expect(ok);
        e::write_array_len(w, BLOCKS as u32).expect(ok);
        for b in 0..BLOCKS {
            e::write_u64(w, (i << 8 | b).wrapping_mul(0x9e37_79b9_7f4a_7c15)).expect(ok);
        }
        e::write_u64(w, i.wrapping_mul(0x2545_f491_4f6c_dd1d)).expect(ok);
        e::write_array_len(w, (BLOCKS * 128) as u32).expect(ok);
        for t in 0..BLOCKS * 128 {
            e::write_uint(w, (i * 7_919 + t * 104_729) % 50_000).expect(ok);
        }
        e::write_uint(w, 128).expect(ok);
        e::write_nil(w).expect(ok);
        e::write_str(w, "GPU").expect(ok);
    }
    e::write_uint(w, 0).expect(ok);
    (out, EVENTS * BLOCKS)
}

fn bench_vllm(c: &mut Criterion) {
    let (payload, blocks) = vllm_payload();
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(blocks));
    let name = format!("vllm_batch_32_stored/blocks/{}B", payload.len());
    g.bench_function(name, |b| {
        b.iter(|| {
            let mut n = 0usize;
            let r = kvroute::engines::vllm::for_each_event(black_box(&payload), |ev| {
                n += usize::from(matches!(ev, kvroute::engines::EngineEvent::Stored(_)));
            });
            black_box((r.is_ok(), n))
        })
    });
    g.finish();
}

fn bench_cluster_seal(c: &mut Criterion) {
    use kvroute::cluster::auth::{Kind, Sealer};
    use kvroute::cluster::wire::{EventRecord, RecOp};
    let sealer = Sealer::new(b"0123456789abcdef0123456789abcdef", "prod");
    let mut g = c.benchmark_group("cluster_seal");
    for n in [64usize, 4096] {
        let rec = EventRecord {
            origin: "replica-1/18f6cc10254f0a38".into(),
            worker: "worker-17".into(),
            seq: 1,
            ops: vec![RecOp::Stored {
                tier: Tier::Device,
                hashes: (0..n as u64).map(|h| h.wrapping_mul(0x9e37_79b9)).collect(),
            }],
        }
        .encode();
        let sealed = sealer.seal(Kind::Record, b"", rec.clone());
        g.throughput(Throughput::Bytes(rec.len() as u64));
        g.bench_function(format!("seal_record_{n}_hashes"), |b| {
            b.iter_batched(
                || rec.clone(),
                |r| black_box(sealer.seal(Kind::Record, b"", r)),
                BatchSize::SmallInput,
            )
        });
        g.bench_function(format!("open_record_{n}_hashes"), |b| {
            b.iter(|| black_box(sealer.open(Kind::Record, b"", &sealed).is_ok()))
        });
    }
    g.finish();
}

/// The engine adapter (`engines::adapter`): a 32-block prompt of 128-token blocks
/// stored in two KV cache groups (full attention + sliding window) and two tiers, then
/// removed, per iteration: hashing, reference counts and the groups rule per block.
fn bench_adapter(c: &mut Criterion) {
    use kvroute::engines::adapter::Adapter;
    use kvroute::engines::{EngineEvent, EngineHash, Stored};
    const BLOCKS: u64 = 32;
    let tokens: Vec<u32> = (0..BLOCKS as u32 * 128).map(|t| t * 7 % 50_000).collect();
    let hashes: Vec<EngineHash> = (1..=BLOCKS).map(EngineHash::Int).collect();
    let mut events = Vec::new();
    for medium in ["GPU", "CPU"] {
        for (g, kind) in [(0, "full_attention"), (1, "sliding_window")] {
            events.push(EngineEvent::Stored(Stored {
                block_hashes: hashes.clone(),
                token_ids: tokens.clone(),
                block_size: Some(128),
                medium: Some(medium.into()),
                group: Some(g),
                spec_kind: Some(kind.into()),
                ..Default::default()
            }));
        }
    }
    for medium in ["GPU", "CPU"] {
        for g in [1, 0] {
            events.push(EngineEvent::Removed {
                block_hashes: hashes.clone(),
                medium: Some(medium.into()),
                group: Some(g),
                locality: None,
            });
        }
    }
    let mut a = Adapter::new(128, 1 << 16, None);
    let mut out = Vec::new();
    let mut g = c.benchmark_group("engines");
    g.throughput(Throughput::Elements(BLOCKS * 8));
    g.bench_function("adapter_2_groups_2_tiers_store_remove/block_events", |b| {
        b.iter(|| {
            out.clear();
            for ev in &events {
                a.apply(black_box(ev), &mut out);
            }
            black_box(out.len())
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_stored,
    bench_route,
    bench_vllm,
    bench_cluster_seal,
    bench_adapter
);
criterion_main!(benches);
