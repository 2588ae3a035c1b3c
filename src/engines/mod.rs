//! Adapters for the KV-cache events that real inference engines publish (vLLM, SGLang).
//!
//! Everything here is sans-I/O and pure: the ZMQ runtime (`service::zmq_ingest`) only
//! moves frames in and index changes out.
//! - [`vllm`]: msgpack `KVEventBatch` payloads, in both encodings (positional
//!   `array_like` structs with a leading tag, and maps with a `"type"` key), into typed
//!   [`EngineEvent`]s. Unknown fields and unknown event types are ignored; bad input is an
//!   error value, never a panic.
//! - [`adapter`]: recomputes kvroute's own sequence hashes (DESIGN §1) from each
//!   event's `token_ids` and keeps the engine-hash → kvroute-hash map (bounded by the
//!   worker's capacity) so removals resolve.
//! - [`config`]: the `[[engines]]` / `--engine` endpoint settings.
//! - [`stream`]: the per-endpoint sequence state machine (gaps, replay, restarts) and the
//!   parsing of ZMQ multipart frames.
//!
//! ## Salting (LoRA and extra keys)
//! Blocks cached under a LoRA adapter or with extra keys (multimodal hashes, cache salt)
//! must never match plain prompts, so their kvroute hashes are salted:
//! - LoRA: when an event starts a prompt (`parent_block_hash` is nil) and names a LoRA
//!   (`lora_name`, else the decimal `lora_id`, else the endpoint's configured `lora`),
//!   the first block is chained from `lora_salt(name)` = XXH3-64(seed 1337) over
//!   `b"kvroute/lora\0" ‖ utf8(name)` instead of from nothing:
//!   `seq[0] = chain(lora_salt(name), local[0])`. Later blocks chain as usual, so the
//!   salt propagates. [`salted_sequence_hashes`] computes the same for a frontend.
//! - Extra keys: when `extra_keys` is an array with one entry per stored block, block
//!   i's local hash becomes XXH3-64(seed 1337) over `le(local[i]) ‖ msgpack(extra_keys[i])`
//!   for each non-nil entry; any other non-nil `extra_keys` value salts the event's
//!   first block the same way with the whole value. `msgpack(..)` is the bytes as the
//!   engine sent them (msgspec writes the shortest encoding of every value).

pub mod adapter;
pub mod config;
pub mod msgpack;
pub mod notes;
pub mod stream;
pub mod vllm;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_stream;

use crate::hash::SEED;
use crate::types::Tier;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// An engine's own block hash: an integer (u64; negative Python ints are taken as their
/// two's complement) or a byte digest (e.g. 32-byte sha256).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EngineHash {
    Int(u64),
    Bytes(Box<[u8]>),
}

/// One KV-cache event of an engine, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    Stored(Stored),
    Removed {
        block_hashes: Vec<EngineHash>,
        medium: Option<String>,
    },
    AllCleared {
        medium: Option<String>,
    },
}

/// `BlockStored`: blocks in prefix order, continuing after `parent`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Stored {
    pub block_hashes: Vec<EngineHash>,
    pub parent: Option<EngineHash>,
    /// Tokens of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    pub block_size: Option<u32>,
    pub lora_id: Option<i64>,
    pub medium: Option<String>,
    pub lora_name: Option<String>,
    /// Raw `extra_keys` value, its msgpack bytes as sent (see the module docs for how
    /// it salts hashes).
    pub extra_keys: Option<Box<[u8]>>,
}

/// A decoded `KVEventBatch`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<EngineEvent>,
    pub dp_rank: Option<u32>,
    /// Events skipped: unknown type (newer engines) or malformed.
    pub skipped: usize,
}

/// Cache tier of an event's `medium` ("GPU"/"CPU"/"DISK", case-insensitive; absent or
/// unknown → device).
pub fn medium_tier(medium: Option<&str>) -> Tier {
    match medium {
        Some(m) if m.eq_ignore_ascii_case("cpu") => Tier::Host,
        Some(m) if m.eq_ignore_ascii_case("disk") => Tier::Disk,
        _ => Tier::Device,
    }
}

/// The chain start of a prompt cached under LoRA adapter `name` (module docs).
pub fn lora_salt(name: &str) -> u64 {
    let mut b = Vec::with_capacity(13 + name.len());
    b.extend_from_slice(b"kvroute/lora\0");
    b.extend_from_slice(name.as_bytes());
    xxh3_64_with_seed(&b, SEED)
}

/// A block's local hash salted with extra keys (`extra`: their msgpack encoding, as
/// the engine sent it; msgspec always writes the shortest form).
pub fn salt_local(local: u64, extra: &[u8]) -> u64 {
    let mut b = Vec::with_capacity(8 + extra.len());
    b.extend_from_slice(&local.to_le_bytes());
    b.extend_from_slice(extra);
    xxh3_64_with_seed(&b, SEED)
}

/// Sequence hashes of a prompt's complete blocks as the adapter computes them for blocks
/// cached under LoRA `lora` (None = plain DESIGN §1 hashes). For frontends that route
/// LoRA requests by precomputed hashes.
pub fn salted_sequence_hashes(tokens: &[u32], block_size: usize, lora: Option<&str>) -> Vec<u64> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    crate::hash::sequence_hashes_after(lora.map(lora_salt), tokens, block_size, &mut out);
    out
}
