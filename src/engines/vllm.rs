//! Decoding of vLLM / SGLang `KVEventBatch` payloads (msgpack) into [`Batch`].
//!
//! Accepted shapes (vLLM `vllm/distributed/kv_events.py`; SGLang follows it):
//! - envelope: `[ts, events, data_parallel_rank?]` or a map with `ts`, `events`,
//!   `data_parallel_rank` (unknown keys ignored);
//! - positional events (msgspec `array_like=True, tag=True, omit_defaults=True`):
//!   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//!   medium, lora_name, extra_keys, group_idx, ...]`, `["BlockRemoved", block_hashes,
//!   medium, group_idx?]`, `["AllBlocksCleared", medium?]`; trailing fields may be
//!   omitted and extra trailing fields are ignored;
//! - map events: `{"type": "BlockStored", "block_hashes": ..., ...}` with named fields,
//!   defaults omitted, unknown fields (e.g. `locality`) ignored.
//!
//! Guarantees: never panics on any byte string; sizes are bounded ([`MAX_HASHES`],
//! [`MAX_TOKENS`], nesting depth); an event of unknown type or a malformed event is
//! skipped and counted in [`Batch::skipped`], a malformed envelope is an error.

use super::{Batch, EngineEvent, EngineHash, Stored};
use rmpv::Value;

/// Largest number of block hashes in one event.
pub const MAX_HASHES: usize = 1 << 16;
/// Largest number of token ids in one event.
pub const MAX_TOKENS: usize = 1 << 24;
/// Longest byte-digest hash accepted.
pub const MAX_DIGEST: usize = 64;
/// Deepest msgpack nesting accepted.
pub const MAX_DEPTH: usize = 32;

/// Why a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not msgpack: {0}")]
    Msgpack(String),
    #[error("trailing bytes after the batch")]
    Trailing,
    #[error("bad batch envelope: {0}")]
    Envelope(&'static str),
}

/// Why one event was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventError {
    UnknownType,
    Malformed(&'static str),
}

/// Decodes one payload.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut rd = payload;
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::Trailing);
    }
    let (ts, events, rank) = match &v {
        Value::Array(a) => (a.first(), a.get(1), a.get(2)),
        Value::Map(m) => (
            field(m, "ts"),
            field(m, "events"),
            field(m, "data_parallel_rank"),
        ),
        _ => return Err(DecodeError::Envelope("neither array nor map")),
    };
    let ts = match ts {
        None | Some(Value::Nil) => 0.0,
        Some(t) => t
            .as_f64()
            .ok_or(DecodeError::Envelope("ts is not a number"))?,
    };
    let events = events
        .and_then(Value::as_array)
        .ok_or(DecodeError::Envelope("events is not an array"))?;
    let dp_rank = match rank {
        None | Some(Value::Nil) => None,
        Some(r) => Some(
            r.as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .ok_or(DecodeError::Envelope("bad data_parallel_rank"))?,
        ),
    };
    let mut batch = Batch {
        ts,
        events: Vec::with_capacity(events.len()),
        dp_rank,
        skipped: 0,
    };
    for e in events {
        match decode_event(e) {
            Ok(ev) => batch.events.push(ev),
            Err(_) => batch.skipped += 1,
        }
    }
    Ok(batch)
}

fn field<'a>(m: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    m.iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// Named fields of an event, whichever encoding it came in.
struct Fields<'a> {
    positional: Option<&'a [Value]>,
    named: Option<&'a [(Value, Value)]>,
    names: &'static [&'static str],
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        let v = if let Some(p) = self.positional {
            let i = self.names.iter().position(|n| *n == name)?;
            p.get(i)
        } else {
            field(self.named?, name)
        };
        v.filter(|v| !v.is_nil())
    }
}

const STORED: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
];
const REMOVED: &[&str] = &["block_hashes", "medium", "group_idx"];
const CLEARED: &[&str] = &["medium"];

/// Decodes one event value.
pub fn decode_event(v: &Value) -> Result<EngineEvent, EventError> {
    let (tag, positional, named) = match v {
        Value::Array(a) => {
            let tag = a
                .first()
                .and_then(Value::as_str)
                .ok_or(EventError::Malformed("positional event without a tag"))?;
            (tag, Some(&a[1..]), None)
        }
        Value::Map(m) => {
            let tag = field(m, "type")
                .and_then(Value::as_str)
                .ok_or(EventError::Malformed("map event without a type"))?;
            (tag, None, Some(m.as_slice()))
        }
        _ => return Err(EventError::Malformed("event is neither array nor map")),
    };
    let names = match tag {
        "BlockStored" => STORED,
        "BlockRemoved" => REMOVED,
        "AllBlocksCleared" => CLEARED,
        _ => return Err(EventError::UnknownType),
    };
    let f = Fields {
        positional,
        named,
        names,
    };
    let medium = match f.get("medium") {
        None => None,
        Some(m) => Some(
            m.as_str()
                .ok_or(EventError::Malformed("medium is not a string"))?
                .to_owned(),
        ),
    };
    match tag {
        "BlockStored" => {
            let block_hashes = hashes(f.get("block_hashes"))?;
            let parent = f.get("parent_block_hash").map(hash).transpose()?;
            let token_ids = tokens(f.get("token_ids"))?;
            let block_size = match f.get("block_size") {
                None => None,
                Some(b) => Some(
                    b.as_u64()
                        .and_then(|b| u32::try_from(b).ok())
                        .ok_or(EventError::Malformed("bad block_size"))?,
                ),
            };
            let lora_id = match f.get("lora_id") {
                None => None,
                Some(l) => Some(l.as_i64().ok_or(EventError::Malformed("bad lora_id"))?),
            };
            let lora_name = match f.get("lora_name") {
                None => None,
                Some(n) => Some(
                    n.as_str()
                        .ok_or(EventError::Malformed("lora_name is not a string"))?
                        .to_owned(),
                ),
            };
            Ok(EngineEvent::Stored(Stored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_id,
                medium,
                lora_name,
                extra_keys: f.get("extra_keys").cloned(),
            }))
        }
        "BlockRemoved" => Ok(EngineEvent::Removed {
            block_hashes: hashes(f.get("block_hashes"))?,
            medium,
        }),
        _ => Ok(EngineEvent::AllCleared { medium }),
    }
}

/// One engine hash: an integer or a byte digest.
pub fn hash(v: &Value) -> Result<EngineHash, EventError> {
    match v {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|x| x as u64))
            .map(EngineHash::Int)
            .ok_or(EventError::Malformed("bad integer hash")),
        Value::Binary(b) if !b.is_empty() && b.len() <= MAX_DIGEST => {
            Ok(EngineHash::Bytes(b.clone().into_boxed_slice()))
        }
        _ => Err(EventError::Malformed("hash is neither int nor bytes")),
    }
}

fn hashes(v: Option<&Value>) -> Result<Vec<EngineHash>, EventError> {
    let a = v
        .and_then(Value::as_array)
        .ok_or(EventError::Malformed("block_hashes is not an array"))?;
    if a.len() > MAX_HASHES {
        return Err(EventError::Malformed("too many block hashes"));
    }
    a.iter().map(hash).collect()
}

fn tokens(v: Option<&Value>) -> Result<Vec<u32>, EventError> {
    let Some(v) = v else { return Ok(Vec::new()) };
    let a = v
        .as_array()
        .ok_or(EventError::Malformed("token_ids is not an array"))?;
    if a.len() > MAX_TOKENS {
        return Err(EventError::Malformed("too many token ids"));
    }
    a.iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or(EventError::Malformed("bad token id"))
        })
        .collect()
}
