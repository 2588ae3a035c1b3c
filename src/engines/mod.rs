//! Adapters for the KV-cache events that real inference engines publish (vLLM, SGLang).
//!
//! Everything here is sans-I/O and pure: the ZMQ runtime (`service::ingest::zmq`) only
//! moves frames in and index changes out.
//! - [`vllm`]: msgpack `KVEventBatch` payloads, in both encodings (positional
//!   `array_like` structs with a leading tag, and maps with a `"type"` key), into typed
//!   [`EngineEvent`]s. Unknown fields and unknown event types are ignored; bad input is an
//!   error value, never a panic.
//! - [`adapter`]: recomputes kvroute's own sequence hashes (DESIGN §1) from each
//!   event's `token_ids` and keeps the engine-hash → kvroute-hash map (bounded by the
//!   worker's capacity) so removals resolve.
//! - [`output`]: what the adapter hands out: index changes and its counters.
//! - [`config`]: the `[[engines]]` / `--engine` endpoint settings.
//! - [`stream`]: the per-endpoint sequence state machine (gaps, replay, restarts) and the
//!   parsing of ZMQ multipart frames.
//! - [`groups`]: the KV cache groups of hybrid models (full attention beside sliding
//!   window or mamba) and which blocks make a reusable prefix.
//!
//! docs/ENGINES.md is the reference: engine versions checked, media, fields, shapes.
//!
//! ## Media and tiers
//! [`medium_tier`] maps every medium vLLM 0.33 and SGLang 0.5.23 define to a tier:
//! vLLM `GPU` / `CPU` / `STORAGE`, SGLang `GPU` / `CPU_PINNED` / `DISK` / `EXTERNAL`.
//! `locality: "REMOTE"` (remote or shared storage) and `EXTERNAL` (a shared pool such
//! as Mooncake) are credited as `disk`, the least optimistic tier; an unknown medium
//! is `None`, and the adapter credits it to the configured
//! `engine_unknown_medium_tier` (`host` or `disk`, default `disk`; never device).
//!
//! ## Salting (LoRA, cache salt, extra keys, lookahead)
//! Blocks cached under a LoRA adapter, a `cache_salt` or with extra keys (multimodal
//! hashes) must never match other prompts, so their kvroute hashes are salted:
//! - chain start: when an event starts a prompt (`parent_block_hash` is nil), its first
//!   block is chained from [`chain_start`]`(lora, cache_salt)` instead of from nothing:
//!   `seq[0] = chain(start, local[0])`. `lora` is `lora_name`, else the decimal
//!   `lora_id` (the endpoint's configured `lora` first); `cache_salt` is SGLang's event
//!   field, or the string entry of block 0's vLLM `extra_keys`. Later blocks chain as
//!   usual, so the salt propagates. A frontend computes the same start from the
//!   request's LoRA and `cache_salt` ([`salted_sequence_hashes`]); an empty salt is
//!   no salt, as in vLLM.
//! - extra keys (vLLM, one entry per block, untagged: the LoRA name when `lora_name` is
//!   set, `(mm_identifier, offset)` pairs, the cache salt, prompt-embedding digests):
//!   the LoRA name is dropped (it is in the chain start), the cache salt of block 0 is
//!   taken into the chain start, and whatever remains salts the block's local hash:
//!   XXH3-64(seed 1337) over `le(local[i]) ‖ msgpack(entry)...`, the entries' bytes as
//!   the engine sent them. A value that is not one entry per block salts the event's
//!   first block with the whole value.
//! - lookahead (`lookahead_token_ids`, the L tokens after each block that its engine
//!   hash covers): [`lookahead_local`] mixes them into the block's local hash, and the
//!   router hashes a request's block i with its own next L tokens (`lookahead_tokens`),
//!   so a block counts only when the request continues as the cached one did.

pub mod adapter;
pub mod config;
pub mod groups;
pub mod hashing;
pub mod msgpack;
pub mod notes;
pub mod output;
pub mod stream;
pub mod vllm;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_engines;
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
        /// KV cache group (vLLM `group_idx`); none = group 0.
        group: Option<u32>,
        locality: Option<String>,
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
    /// KV cache group (vLLM `group_idx`); none = group 0.
    pub group: Option<u32>,
    /// vLLM `kv_cache_spec_kind` of the group (`full_attention`, `sliding_window`, ...).
    pub spec_kind: Option<String>,
    /// vLLM `kv_cache_spec_sliding_window`, in tokens.
    pub sliding_window: Option<u32>,
    /// `LOCAL` or `REMOTE` relative to the publisher.
    pub locality: Option<String>,
    /// SGLang's `cache_salt` of the request that stored the blocks.
    pub cache_salt: Option<String>,
    /// vLLM `lookahead_token_ids`: per block, the tokens after it that its hash covers.
    pub lookahead: Option<Vec<Vec<u32>>>,
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

/// Cache tier of an event's `medium` and `locality` (module docs), case-insensitive:
/// absent or `GPU` → device; `CPU` (vLLM), `CPU_PINNED` (SGLang) → host; `STORAGE`
/// (vLLM), `DISK`, `EXTERNAL` (SGLang) → disk; `locality: "REMOTE"` → disk whatever
/// the medium. `None`: a medium neither engine defines.
pub fn medium_tier(medium: Option<&str>, locality: Option<&str>) -> Option<Tier> {
    if locality.is_some_and(|l| l.eq_ignore_ascii_case("remote")) {
        return Some(Tier::Disk);
    }
    let Some(m) = medium else {
        return Some(Tier::Device);
    };
    const MEDIA: [(&str, Tier); 7] = [
        ("gpu", Tier::Device),
        ("cpu", Tier::Host),
        ("cpu_pinned", Tier::Host),
        ("storage", Tier::Disk),
        ("disk", Tier::Disk),
        ("external", Tier::Disk),
        ("ssd", Tier::Disk),
    ];
    MEDIA
        .iter()
        .find(|(name, _)| m.eq_ignore_ascii_case(name))
        .map(|&(_, t)| t)
}

/// The chain start of a prompt cached under LoRA adapter `name` (module docs).
pub fn lora_salt(name: &str) -> u64 {
    let mut b = Vec::with_capacity(13 + name.len());
    b.extend_from_slice(b"kvroute/lora\0");
    b.extend_from_slice(name.as_bytes());
    xxh3_64_with_seed(&b, SEED)
}

/// The chain start of a prompt cached under LoRA `lora` and `cache_salt` (module
/// docs); `None` for neither. With a LoRA only it is [`lora_salt`]; a salt is mixed in
/// as XXH3-64(seed 1337) over `b"kvroute/cache_salt\0" ‖ le(lora start or 0) ‖ flag ‖
/// utf8(salt)` (flag 1 with a LoRA, 0 without). An empty salt is no salt.
pub fn chain_start(lora: Option<&str>, cache_salt: Option<&str>) -> Option<u64> {
    let start = lora.map(lora_salt);
    match cache_salt.filter(|s| !s.is_empty()) {
        None => start,
        Some(salt) => {
            let mut b = Vec::with_capacity(28 + salt.len());
            b.extend_from_slice(b"kvroute/cache_salt\0");
            b.extend_from_slice(&start.unwrap_or(0).to_le_bytes());
            b.push(u8::from(start.is_some()));
            b.extend_from_slice(salt.as_bytes());
            Some(xxh3_64_with_seed(&b, SEED))
        }
    }
}

/// A block's local hash with the `next` tokens its engine hash also covers
/// (`lookahead_token_ids`): XXH3-64(seed 1337) over `b"kvroute/lookahead\0" ‖
/// le(local) ‖ le_u32(next...)`.
pub fn lookahead_local(local: u64, next: &[u32]) -> u64 {
    let mut b = Vec::with_capacity(26 + 4 * next.len());
    b.extend_from_slice(b"kvroute/lookahead\0");
    b.extend_from_slice(&local.to_le_bytes());
    for t in next {
        b.extend_from_slice(&t.to_le_bytes());
    }
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
    prompt_hashes(tokens, block_size, chain_start(lora, None), 0, &mut out);
    out
}

/// Sequence hashes of a prompt as the router hashes requests and the adapter hashes
/// events (module docs): chained from `start` ([`chain_start`]), each block's local
/// hash mixed with the `lookahead` tokens after it ([`lookahead_local`]) when
/// `lookahead > 0`, in which case a block is hashed only when that many tokens follow
/// it (as the engine does).
pub fn prompt_hashes(
    tokens: &[u32],
    block_size: usize,
    start: Option<u64>,
    lookahead: usize,
    out: &mut Vec<u64>,
) {
    if lookahead == 0 {
        crate::hash::sequence_hashes_after(start, tokens, block_size, out);
        return;
    }
    if block_size == 0 {
        return;
    }
    let mut prev = start;
    let mut at = 0;
    while at + block_size + lookahead <= tokens.len() {
        let end = at + block_size;
        let local = lookahead_local(
            crate::hash::local_block_hash(&tokens[at..end]),
            &tokens[end..end + lookahead],
        );
        let s = match prev {
            None => local,
            Some(p) => crate::hash::chain(p, local),
        };
        out.push(s);
        prev = Some(s);
        at = end;
    }
}
