//! kvroute's sequence hashes of one `BlockStored`'s complete blocks, salted as the
//! `engines` module docs define: chain start from the LoRA and the cache salt, the
//! LoRA name and cache salt taken out of vLLM's per-block `extra_keys`, the remaining
//! entries salting each block's local hash, and the lookahead tokens mixed in.
//!
//! Pure; never panics; reads only what the decoder already bounded.

use super::msgpack::{Head, Rd};
use super::vllm::{per_block_keys, MAX_DEPTH};
use super::{chain_start, lookahead_local, salt_local, Stored};
use crate::hash::{chain, local_block_hash};

/// Why a stored event cannot be hashed as routing requests are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its lookahead differs from the router's `lookahead_tokens` (the length of each
    /// block's `lookahead_token_ids`, 0 when absent).
    Lookahead { engine: usize },
}

/// The sequence hashes of the first `complete` blocks of `s` (block size `bs`),
/// continuing after `parent` (`None`: the event starts a prompt). `default_lora`: the
/// name for a `lora_id` without `lora_name`. `lookahead`: the router's
/// `lookahead_tokens`.
pub fn stored_hashes(
    s: &Stored,
    bs: usize,
    complete: usize,
    parent: Option<u64>,
    default_lora: Option<&str>,
    lookahead: usize,
) -> Result<Vec<u64>, Refused> {
    let engine_la = s
        .lookahead
        .as_ref()
        .and_then(|l| l.first())
        .map_or(0, Vec::len);
    if engine_la != lookahead
        || s.lookahead
            .as_ref()
            .is_some_and(|l| l.iter().any(|t| t.len() != lookahead))
    {
        return Err(Refused::Lookahead { engine: engine_la });
    }
    let n = s.block_hashes.len();
    let lora_id = s.lora_id.map(|i| i.to_string());
    let lora = s.lora_name.as_deref().or(match s.lora_id {
        Some(_) => default_lora.or(lora_id.as_deref()),
        None => None,
    });
    // Per-block extra keys (vLLM), or one value salting the first block.
    let mut per_block: Vec<Option<&[u8]>> = Vec::new();
    let mut whole = None;
    if let Some(raw) = s.extra_keys.as_deref() {
        match per_block_keys(raw, n) {
            Some(it) => per_block.extend(it.map(|k| (k != [0xc0]).then_some(k))),
            None => whole = Some(raw),
        }
    }
    let mut salt = s.cache_salt.clone();
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(complete.min(per_block.len()));
    for (i, k) in per_block.iter().take(complete).enumerate() {
        let want_salt = i == 0 && parent.is_none() && salt.is_none();
        let (rest, found) = match k {
            Some(k) => split_entry(k, s.lora_name.as_deref(), want_salt),
            None => (Vec::new(), None),
        };
        if found.is_some() {
            salt = found;
        }
        keys.push(rest);
    }
    let mut prev = match parent {
        Some(p) => Some(p),
        None => chain_start(lora, salt.as_deref()),
    };
    let mut out = Vec::with_capacity(complete);
    for i in 0..complete {
        let mut local = local_block_hash(&s.token_ids[i * bs..(i + 1) * bs]);
        match (keys.get(i), whole) {
            (Some(k), _) if !k.is_empty() => local = salt_local(local, k),
            (_, Some(w)) if i == 0 => local = salt_local(local, w),
            _ => {}
        }
        if lookahead > 0 {
            if let Some(next) = s.lookahead.as_ref().and_then(|l| l.get(i)) {
                local = lookahead_local(local, next);
            }
        }
        let seq = match prev {
            None => local,
            Some(p) => chain(p, local),
        };
        out.push(seq);
        prev = Some(seq);
    }
    Ok(out)
}

/// One block's extra-keys entry: its items without the LoRA name (the first item when
/// it equals `lora`) and, when `want_salt`, without the first string item after it
/// (the cache salt, returned). The remaining items' bytes, concatenated, salt the
/// block. An entry that is not an array salts the block whole.
fn split_entry(entry: &[u8], lora: Option<&str>, want_salt: bool) -> (Vec<u8>, Option<String>) {
    let mut rd = Rd::new(entry);
    let n = match rd.head() {
        Ok(Head::Array(n)) => n,
        _ => return (entry.to_vec(), None),
    };
    let mut rest = Vec::new();
    let mut salt = None;
    for i in 0..n {
        let Ok(item) = rd.span(MAX_DEPTH) else {
            return (entry.to_vec(), None);
        };
        let text = match Rd::new(item).head() {
            Ok(Head::Str(t)) => std::str::from_utf8(t).ok(),
            _ => None,
        };
        if i == 0 && lora.is_some() && text == lora {
            continue;
        }
        if want_salt && salt.is_none() {
            if let Some(t) = text {
                salt = Some(t.to_owned());
                continue;
            }
        }
        rest.extend_from_slice(item);
    }
    (rest, salt)
}
