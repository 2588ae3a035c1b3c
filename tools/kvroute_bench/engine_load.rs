//! The engine load of `kvroute-bench` (`--engines N --engine-rate R`, with `--spawn`):
//! N simulated vLLM engines, each a ZMTP PUB socket ([`kvroute::zmtp::Publisher`]) that
//! the spawned router subscribes to through `--engine worker_id=…,endpoint=…`, so a
//! soak covers the ZMQ door as well as the binary and HTTP ones.
//!
//! Each engine publishes vLLM `KVEventBatch` messages (positional msgpack, the encoding
//! of `vllm/distributed/kv_events.py`): `BlockStored` of `BLOCKS_PER_BATCH` blocks with
//! their token ids, and `BlockRemoved` of its oldest batch once it holds
//! `ENGINE_BLOCKS`, so its index share stays bounded. Every `GARBAGE_EVERY`-th message
//! is a malformed payload (the router must count and skip it, and keep the stream).
//! Sequence numbers are contiguous, so the router sees no gap.
//!
//! Bounded: every loop stops at the shared stop flag; a publisher never blocks longer
//! than its per-peer write timeout.

use crate::Args;
use kvroute::zmtp::Publisher;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Blocks per `BlockStored` event.
const BLOCKS_PER_BATCH: usize = 16;
/// Blocks one engine keeps indexed.
const ENGINE_BLOCKS: usize = 8_192;
/// One malformed payload per this many messages.
const GARBAGE_EVERY: u64 = 200;

/// The engines' PUB sockets, bound before the router starts.
pub struct Engines {
    pubs: Vec<Publisher>,
}

impl Engines {
    /// Binds `n` publishers on free loopback ports.
    pub fn bind(n: usize) -> std::io::Result<Engines> {
        let pubs = (0..n)
            .map(|_| Publisher::bind("127.0.0.1:0"))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Engines { pubs })
    }

    /// `--engine` flags for the spawned router.
    pub fn router_flags(&self) -> Vec<String> {
        self.pubs
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                [
                    "--engine".to_string(),
                    format!(
                        "worker_id=bench-e{i},endpoint={},capacity_blocks={}",
                        p.endpoint(),
                        ENGINE_BLOCKS * 2
                    ),
                ]
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.pubs.len()
    }

    pub fn get(&self, i: usize) -> Option<&Publisher> {
        self.pubs.get(i)
    }
}

/// What one engine published.
#[derive(Default)]
pub struct EngineResult {
    /// Block events (stored + removed blocks) published.
    pub block_events: u64,
    /// Malformed payloads published on purpose.
    pub garbage: u64,
    /// Messages no subscriber received (the router's connection was down).
    pub unsent: u64,
}

fn mix(x: u64) -> u64 {
    kvroute::index::mix(x ^ 0x4545_4545)
}

/// msgpack of one `KVEventBatch` `[ts, [event], null]` holding one event.
fn batch(event: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = Vec::new();
    let _ = rmp::encode::write_array_len(&mut b, 3);
    let _ = rmp::encode::write_f64(&mut b, 0.0);
    let _ = rmp::encode::write_array_len(&mut b, 1);
    event(&mut b);
    let _ = rmp::encode::write_nil(&mut b);
    b
}

fn write_hashes(b: &mut Vec<u8>, hashes: &[u64]) {
    let _ = rmp::encode::write_array_len(b, hashes.len() as u32);
    for &h in hashes {
        // vLLM's int hashes are i64 on the wire; keep them positive and in range.
        let _ = rmp::encode::write_uint(b, h >> 1);
    }
}

/// `["BlockStored", hashes, parent, token_ids, block_size, null, "GPU"]`.
fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], block_size: u32) -> Vec<u8> {
    batch(|b| {
        let _ = rmp::encode::write_array_len(b, 7);
        let _ = rmp::encode::write_str(b, "BlockStored");
        write_hashes(b, hashes);
        match parent {
            Some(p) => {
                let _ = rmp::encode::write_uint(b, p >> 1);
            }
            None => {
                let _ = rmp::encode::write_nil(b);
            }
        }
        let _ = rmp::encode::write_array_len(b, tokens.len() as u32);
        for &t in tokens {
            let _ = rmp::encode::write_uint(b, u64::from(t));
        }
        let _ = rmp::encode::write_uint(b, u64::from(block_size));
        let _ = rmp::encode::write_nil(b);
        let _ = rmp::encode::write_str(b, "GPU");
    })
}

/// `["BlockRemoved", hashes, "GPU"]`.
fn removed(hashes: &[u64]) -> Vec<u8> {
    batch(|b| {
        let _ = rmp::encode::write_array_len(b, 3);
        let _ = rmp::encode::write_str(b, "BlockRemoved");
        write_hashes(b, hashes);
        let _ = rmp::encode::write_str(b, "GPU");
    })
}

/// Runs engine `e` until `stop`, paced to its share of `--engine-rate`.
pub fn publish(
    args: &Args,
    p: &Publisher,
    e: usize,
    block_size: u32,
    stop: &AtomicBool,
    sent: &AtomicU64,
) -> EngineResult {
    let mut out = EngineResult::default();
    if !p.wait_subscribers(1, Duration::from_secs(20)) {
        return out;
    }
    let per_engine = args.engine_rate as f64 / args.engines.max(1) as f64;
    let started = Instant::now();
    let mut seq = 0u64;
    let mut live: VecDeque<Vec<u64>> = VecDeque::new();
    let mut n = 0u64;
    let mut send = |payload: &[u8], out: &mut EngineResult| {
        let delivered = p.send(&[&b""[..], &seq.to_be_bytes()[..], payload]);
        if delivered == 0 {
            out.unsent += 1;
        }
        seq += 1;
    };
    while !stop.load(Ordering::Relaxed) {
        let tokens: Vec<u32> = (0..BLOCKS_PER_BATCH as u64 * u64::from(block_size))
            .map(|t| (mix(((e as u64) << 48) ^ (n << 20) ^ t) % 50_000) as u32)
            .collect();
        let hashes: Vec<u64> = (0..BLOCKS_PER_BATCH as u64)
            .map(|b| mix(((e as u64) << 48) ^ (n << 20) ^ b))
            .collect();
        n += 1;
        send(&stored(&hashes, None, &tokens, block_size), &mut out);
        out.block_events += hashes.len() as u64;
        sent.fetch_add(hashes.len() as u64, Ordering::Relaxed);
        live.push_back(hashes);
        if live.len() * BLOCKS_PER_BATCH > ENGINE_BLOCKS {
            if let Some(old) = live.pop_front() {
                send(&removed(&old), &mut out);
                out.block_events += old.len() as u64;
                sent.fetch_add(old.len() as u64, Ordering::Relaxed);
            }
        }
        if n.is_multiple_of(GARBAGE_EVERY) {
            send(b"\xc1 not msgpack", &mut out);
            out.garbage += 1;
        }
        if per_engine > 0.0 {
            let due = Duration::from_secs_f64(out.block_events as f64 / per_engine);
            let el = started.elapsed();
            if due > el {
                std::thread::sleep((due - el).min(Duration::from_millis(200)));
            }
        }
    }
    out
}

/// What the router says of the engines, from its `/metrics`: the
/// `kvroute_engine_stream_total` counters summed by kind over the `bench-e*` workers
/// (e.g. `batches`, `bad_payload`, `gap_cleared`), so a soak shows that the events
/// arrived and that the garbage was counted, not just that it was sent.
pub fn router_view(http: &str) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(resp) = ureq::get(&format!("http://{http}/metrics"))
        .timeout(Duration::from_secs(10))
        .call()
    else {
        return out;
    };
    let Ok(text) = resp.into_string() else {
        return out;
    };
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("kvroute_engine_stream_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        if !labels.contains("worker=\"bench-e") {
            continue;
        }
        let kind = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("kind=\""))
            .map(|k| k.trim_end_matches('"').to_string());
        if let (Some(kind), Ok(v)) = (kind, value.trim().parse::<f64>()) {
            *out.entry(kind).or_insert(0) += v as u64;
        }
    }
    out
}
