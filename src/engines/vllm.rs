//! Decoding of vLLM / SGLang `KVEventBatch` payloads (msgpack) into typed events.
//!
//! Accepted shapes (vLLM `vllm/distributed/kv_events.py`; SGLang follows it):
//! - envelope: `[ts, events, data_parallel_rank?]` or a map with `ts`, `events`,
//!   `data_parallel_rank` (unknown keys ignored);
//! - envelope: `[ts, events, data_parallel_rank?]` (vLLM) or `[ts, events,
//!   attn_dp_rank]` (SGLang), or a map with `ts`, `events` and either rank key;
//! - positional events (msgspec `array_like=True, tag=True, omit_defaults=True`, vLLM
//!   before 2026): `["BlockStored", block_hashes, parent_block_hash, token_ids,
//!   block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//!   kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership, session_id,
//!   lookahead_token_ids]`, `["BlockRemoved", block_hashes, medium, group_idx,
//!   locality, ownership]`, `["AllBlocksCleared", medium?]`; trailing fields may be
//!   omitted and extra trailing fields are ignored;
//! - map events (vLLM 0.33 and SGLang 0.5.23: `tag=True` structs without
//!   `array_like`): `{"type": "BlockStored", "block_hashes": ..., ...}` with named
//!   fields, defaults omitted, unknown fields ignored (SGLang's `cache_salt` is read
//!   here); the first occurrence of a repeated key wins.
//!
//! Decoding goes straight from the bytes into typed values ([`super::msgpack`]), one
//! event at a time ([`for_each_event`]), so memory is bounded by the largest single
//! event, never by a tree of the whole message: every array's count is checked against
//! the bytes that remain before anything is reserved for it.
//!
//! Guarantees: never panics on any byte string; sizes are bounded ([`MAX_EVENTS`],
//! [`MAX_HASHES`], [`MAX_TOKENS`], [`MAX_DIGEST`], nesting depth [`MAX_DEPTH`]); the
//! whole payload is checked to be well-formed msgpack (and the envelope valid) before
//! the first event is handed out, so a bad payload applies nothing; an event of unknown
//! type or a malformed event is skipped and counted, a malformed envelope is an error.

use super::msgpack::{Bad, Head, Rd};
use super::{Batch, EngineEvent, EngineHash, Stored};

/// Largest number of events in one batch. vLLM publishes one batch per scheduler step
/// (a few events per sequence that stored or freed blocks in that step: hundreds to a
/// few thousand); 65,536 leaves room while bounding per-batch work.
pub const MAX_EVENTS: usize = 1 << 16;
/// Largest number of block hashes in one event.
pub const MAX_HASHES: usize = 1 << 16;
/// Largest number of token ids in one event.
pub const MAX_TOKENS: usize = 1 << 24;
/// Longest byte-digest hash accepted.
pub const MAX_DIGEST: usize = 64;
/// Deepest msgpack nesting accepted.
pub const MAX_DEPTH: usize = 32;

/// A token buffer handed back ([`recycle`]) is kept for the next event up to this
/// many ids (1 MiB).
const SPARE_TOKENS: usize = 1 << 18;

thread_local! {
    /// The last applied event's token buffer: the next event's ids go into pages
    /// already mapped. A fresh buffer per event came from pages the allocator had
    /// returned to the kernel, which zeroed them again (3 % of the router's CPU on
    /// the token-id replay).
    static SPARE: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Hands an applied event's token buffer back to this thread's decoder.
pub fn recycle(ev: EngineEvent) {
    if let EngineEvent::Stored(s) = ev {
        if s.token_ids.capacity() <= SPARE_TOKENS {
            SPARE.set(s.token_ids);
        }
    }
}

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

impl From<Bad> for EventError {
    fn from(b: Bad) -> Self {
        EventError::Malformed(b.0)
    }
}

fn msgpack(b: Bad) -> DecodeError {
    DecodeError::Msgpack(b.0.to_owned())
}

/// The envelope of a batch and what became of its events.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Summary {
    pub ts: f64,
    pub dp_rank: Option<u32>,
    /// Events decoded and handed to the callback.
    pub events: usize,
    /// Events skipped: unknown type (newer engines) or malformed.
    pub skipped: usize,
    /// The batch was refused for its dp rank (nothing applied).
    pub refused: bool,
}

/// Decodes one payload, handing each decoded event to `f` in order.
pub fn for_each_event(payload: &[u8], f: impl FnMut(EngineEvent)) -> Result<Summary, DecodeError> {
    for_each_event_if(payload, |_| true, f)
}

/// [`for_each_event`], handing out the events only if `accept(batch's dp rank)`: a
/// refused batch (`Summary::refused`) applies nothing.
pub fn for_each_event_if(
    payload: &[u8],
    accept: impl FnOnce(Option<u32>) -> bool,
    mut f: impl FnMut(EngineEvent),
) -> Result<Summary, DecodeError> {
    let mut rd = Rd::new(payload);
    let (mut ts, mut events, mut rank) = (None, None, None);
    // The whole payload, checked to be well-formed msgpack with nothing after it.
    let validate = || {
        let mut all = Rd::new(payload);
        all.skip(MAX_DEPTH).map_err(msgpack)?;
        if all.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing)
        }
    };
    match rd.head().map_err(msgpack)? {
        Head::Array(n) => {
            // vLLM's form: spanning each element validates it (one level below the
            // envelope, as skipping the whole payload would) and finds it, in one pass.
            for i in 0..n {
                let v = rd.span(MAX_DEPTH - 1).map_err(msgpack)?;
                match i {
                    0 => ts = Some(v),
                    1 => events = Some(v),
                    2 => rank = Some(v),
                    _ => {}
                }
            }
            if !rd.is_empty() {
                return Err(DecodeError::Trailing);
            }
        }
        Head::Map(n) => {
            validate()?;
            for _ in 0..n {
                let k = rd.head().map_err(msgpack)?;
                let v = rd.span(MAX_DEPTH).map_err(msgpack)?;
                let slot = match k.as_str() {
                    Some("ts") => &mut ts,
                    Some("events") => &mut events,
                    Some("data_parallel_rank" | "attn_dp_rank") => &mut rank,
                    _ => continue,
                };
                slot.get_or_insert(v);
            }
        }
        _ => {
            validate()?;
            return Err(DecodeError::Envelope("neither array nor map"));
        }
    }
    let ts = match head(ts) {
        None | Some(Head::Nil) => 0.0,
        Some(t) => t
            .as_f64()
            .ok_or(DecodeError::Envelope("ts is not a number"))?,
    };
    let dp_rank = match head(rank) {
        None | Some(Head::Nil) => None,
        Some(r) => Some(
            r.as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .ok_or(DecodeError::Envelope("bad data_parallel_rank"))?,
        ),
    };
    let mut ev = Rd::new(events.unwrap_or(&[]));
    let n = match ev.head() {
        Ok(Head::Array(n)) => n,
        _ => return Err(DecodeError::Envelope("events is not an array")),
    };
    if n > MAX_EVENTS {
        return Err(DecodeError::Envelope("too many events in one batch"));
    }
    let mut s = Summary {
        ts,
        dp_rank,
        events: 0,
        skipped: 0,
        refused: false,
    };
    if !accept(dp_rank) {
        s.refused = true;
        return Ok(s);
    }
    for _ in 0..n {
        // The payload is known to be well-formed, so the event is decoded from the
        // batch's cursor (no separate pass to find its end); a skipped event is
        // stepped over from where it started.
        let start = ev;
        match decode_event(&mut ev) {
            Ok(e) => {
                s.events += 1;
                f(e);
            }
            Err(_) => {
                s.skipped += 1;
                ev = start;
                ev.skip(MAX_DEPTH).map_err(msgpack)?;
            }
        }
    }
    Ok(s)
}

fn head(v: Option<&[u8]>) -> Option<Head<'_>> {
    v.and_then(|v| Rd::new(v).head().ok())
}

/// Decodes one payload into a [`Batch`] holding every event (tests, tools; the ingest
/// path streams with [`for_each_event`]).
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut events = Vec::new();
    let s = for_each_event(payload, |e| events.push(e))?;
    Ok(Batch {
        ts: s.ts,
        events,
        dp_rank: s.dp_rank,
        skipped: s.skipped,
    })
}

/// Where a positional stored event's `token_ids` is among its fields ([`STORED`]).
const TOKEN_IDS_AT: usize = 2;

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
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
    // SGLang's, after its own fields: named only (its events are maps).
    "cache_salt",
];
const REMOVED: &[&str] = &[
    "block_hashes",
    "medium",
    "group_idx",
    "locality",
    "ownership",
];
const CLEARED: &[&str] = &["medium"];

/// The fields of one event as they are found (first occurrence wins).
#[derive(Default)]
struct Fields<'a> {
    seen: u32,
    vals: [Option<&'a [u8]>; 16],
}

impl<'a> Fields<'a> {
    fn put(&mut self, i: usize, v: &'a [u8]) {
        if i < self.vals.len() && self.seen & (1 << i) == 0 {
            self.seen |= 1 << i;
            // A nil is the same as an omitted field.
            if v != [0xc0] {
                self.vals[i] = Some(v);
            }
        }
    }

    fn get(&self, names: &[&str], name: &str) -> Option<Head<'a>> {
        self.raw(names, name).and_then(|v| Rd::new(v).head().ok())
    }

    fn raw(&self, names: &[&str], name: &str) -> Option<&'a [u8]> {
        let i = names.iter().position(|n| *n == name)?;
        self.vals[i]
    }
}

/// Decodes the event at `rd`; on success `rd` has moved past exactly that value.
fn decode_event(rd: &mut Rd<'_>) -> Result<EngineEvent, EventError> {
    let mut f = Fields::default();
    let mut read_ids = None;
    let names = match rd.head()? {
        Head::Array(n) => {
            if n == 0 {
                return Err(EventError::Malformed("positional event without a tag"));
            }
            let names = match rd.head()? {
                Head::Str(t) => names_of(t)?,
                _ => return Err(EventError::Malformed("positional event without a tag")),
            };
            // A stored event's token ids are read where they lie, not stepped over
            // and read again: they are most of its bytes.
            let ids_at = match std::ptr::eq(names, STORED) {
                true => TOKEN_IDS_AT,
                false => usize::MAX,
            };
            for i in 0..n - 1 {
                if i == ids_at {
                    read_ids = Some(tokens_at(rd)?);
                    continue;
                }
                let v = rd.span(MAX_DEPTH)?;
                f.put(i, v);
            }
            names
        }
        Head::Map(n) => {
            // First pass: the type tag, wherever it is.
            let mut scan = *rd;
            let mut tag = None;
            for _ in 0..n {
                let k = scan.head()?;
                let v = scan.span(MAX_DEPTH)?;
                if tag.is_none() && k.as_str() == Some("type") {
                    tag = Some(match Rd::new(v).head()? {
                        Head::Str(t) => t,
                        _ => return Err(EventError::Malformed("map event without a type")),
                    });
                }
            }
            let names = names_of(tag.ok_or(EventError::Malformed("map event without a type"))?)?;
            for _ in 0..n {
                let k = rd.head()?;
                let v = rd.span(MAX_DEPTH)?;
                if let Some(i) = k.as_str().and_then(|k| names.iter().position(|n| *n == k)) {
                    f.put(i, v);
                }
            }
            names
        }
        _ => return Err(EventError::Malformed("event is neither array nor map")),
    };
    let medium = match f.get(names, "medium") {
        None => None,
        Some(m) => Some(
            m.as_str()
                .ok_or(EventError::Malformed("medium is not a string"))?
                .to_owned(),
        ),
    };
    if std::ptr::eq(names, CLEARED) {
        return Ok(EngineEvent::AllCleared { medium });
    }
    let block_hashes = hashes(f.raw(names, "block_hashes"))?;
    let group = match f.get(names, "group_idx") {
        None => None,
        Some(g) => Some(
            g.as_u64()
                .and_then(|g| u32::try_from(g).ok())
                .ok_or(EventError::Malformed("bad group_idx"))?,
        ),
    };
    let locality = string(&f, names, "locality")?;
    if std::ptr::eq(names, REMOVED) {
        return Ok(EngineEvent::Removed {
            block_hashes,
            medium,
            group,
            locality,
        });
    }
    let parent = match f.raw(names, "parent_block_hash") {
        None => None,
        Some(v) => Some(hash(Rd::new(v).head()?)?),
    };
    let token_ids = match read_ids {
        Some(ids) => ids,
        None => tokens(f.raw(names, "token_ids"))?,
    };
    let block_size = match f.get(names, "block_size") {
        None => None,
        Some(b) => Some(
            b.as_u64()
                .and_then(|b| u32::try_from(b).ok())
                .ok_or(EventError::Malformed("bad block_size"))?,
        ),
    };
    let lora_id = match f.get(names, "lora_id") {
        None => None,
        Some(l) => Some(l.as_i64().ok_or(EventError::Malformed("bad lora_id"))?),
    };
    let sliding_window = match f.get(names, "kv_cache_spec_sliding_window") {
        None => None,
        Some(w) => Some(
            w.as_u64()
                .and_then(|w| u32::try_from(w).ok())
                .ok_or(EventError::Malformed("bad kv_cache_spec_sliding_window"))?,
        ),
    };
    let lookahead = match f.raw(names, "lookahead_token_ids") {
        None => None,
        Some(v) => Some(lookahead(v, block_hashes.len())?),
    };
    Ok(EngineEvent::Stored(Stored {
        block_hashes,
        parent,
        token_ids,
        block_size,
        lora_id,
        medium,
        lora_name: string(&f, names, "lora_name")?,
        extra_keys: f.raw(names, "extra_keys").map(Box::from),
        group,
        spec_kind: string(&f, names, "kv_cache_spec_kind")?,
        sliding_window,
        locality,
        cache_salt: string(&f, names, "cache_salt")?,
        lookahead,
    }))
}

/// A string field (absent or nil: `None`).
fn string(
    f: &Fields<'_>,
    names: &[&str],
    name: &'static str,
) -> Result<Option<String>, EventError> {
    match f.get(names, name) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_owned()))
            .ok_or(EventError::Malformed("a string field is not a string")),
    }
}

/// `lookahead_token_ids`: one token list per block (`blocks` of them), at most
/// [`MAX_TOKENS`] tokens in all.
fn lookahead(v: &[u8], blocks: usize) -> Result<Vec<Vec<u32>>, EventError> {
    let mut rd = Rd::new(v);
    match rd.head()? {
        Head::Array(n) if n == blocks => {}
        _ => {
            return Err(EventError::Malformed(
                "lookahead_token_ids is not one list per block",
            ))
        }
    }
    let mut out = Vec::with_capacity(blocks);
    let mut total = 0usize;
    for _ in 0..blocks {
        let n = match rd.head()? {
            Head::Array(n) => n,
            _ => return Err(EventError::Malformed("lookahead entry is not a list")),
        };
        total += n;
        if total > MAX_TOKENS {
            return Err(EventError::Malformed("too many lookahead token ids"));
        }
        let mut toks = Vec::with_capacity(n);
        for _ in 0..n {
            toks.push(
                rd.u32()
                    .ok_or(EventError::Malformed("bad lookahead token id"))?,
            );
        }
        out.push(toks);
    }
    Ok(out)
}

fn names_of(tag: &[u8]) -> Result<&'static [&'static str], EventError> {
    match tag {
        b"BlockStored" => Ok(STORED),
        b"BlockRemoved" => Ok(REMOVED),
        b"AllBlocksCleared" => Ok(CLEARED),
        _ => Err(EventError::UnknownType),
    }
}

/// One engine hash: an integer (negative ones as their two's complement) or a digest.
fn hash(h: Head<'_>) -> Result<EngineHash, EventError> {
    match h {
        Head::Uint(u) => Ok(EngineHash::Int(u)),
        Head::Int(i) => Ok(EngineHash::Int(i as u64)),
        Head::Bin(b) if !b.is_empty() && b.len() <= MAX_DIGEST => Ok(EngineHash::Bytes(b.into())),
        _ => Err(EventError::Malformed("hash is neither int nor bytes")),
    }
}

fn hashes(v: Option<&[u8]>) -> Result<Vec<EngineHash>, EventError> {
    let mut rd = Rd::new(v.unwrap_or(&[]));
    let n = match rd.head() {
        Ok(Head::Array(n)) => n,
        _ => return Err(EventError::Malformed("block_hashes is not an array")),
    };
    if n > MAX_HASHES {
        return Err(EventError::Malformed("too many block hashes"));
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(hash(rd.head()?)?);
    }
    Ok(out)
}

fn tokens(v: Option<&[u8]>) -> Result<Vec<u32>, EventError> {
    match v {
        Some(v) => tokens_at(&mut Rd::new(v)),
        None => Ok(Vec::new()),
    }
}

/// The token ids at `rd` (nil: none), moving past them.
fn tokens_at(rd: &mut Rd<'_>) -> Result<Vec<u32>, EventError> {
    let n = match rd.head()? {
        Head::Nil => return Ok(Vec::new()),
        Head::Array(n) => n,
        _ => return Err(EventError::Malformed("token_ids is not an array")),
    };
    if n > MAX_TOKENS {
        return Err(EventError::Malformed("too many token ids"));
    }
    let mut out = SPARE.take();
    out.clear();
    out.reserve(n);
    for _ in 0..n {
        out.push(rd.u32().ok_or(EventError::Malformed("bad token id"))?);
    }
    Ok(out)
}

/// The items of a raw `extra_keys` value if it is an array of exactly `n` entries
/// (per-block keys), each as its msgpack bytes.
pub fn per_block_keys(raw: &[u8], n: usize) -> Option<impl Iterator<Item = &[u8]>> {
    let mut rd = Rd::new(raw);
    match rd.head() {
        Ok(Head::Array(len)) if len == n => {}
        _ => return None,
    }
    Some((0..n).map_while(move |_| rd.span(MAX_DEPTH).ok()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_ids_are_where_the_fused_read_looks() {
        assert_eq!(super::STORED[super::TOKEN_IDS_AT], "token_ids");
    }
}
