//! The in-flight requests section of a snapshot (format version 2) and the
//! bounds-checked reader the whole decoder uses. Pure: bytes in, values out.
//!
//! Per request (little-endian): id (u16 length + UTF-8), u32 decode worker (index into
//! the snapshot's workers), u32 prefill worker (`u32::MAX` = none), u32 input tokens,
//! u32 cached tokens, u32 prompt blocks, u8 flags (1 in prefill, 2 has OSL, 4 has first
//! token, 8 has re-route inputs, 16 routed by the writing router's own proxy; other
//! bits are corrupt), u32 output tokens, u64 age
//! µs, then if flagged: u32 OSL, u64 first-token age µs, u32 length + JSON
//! `{"filters", "mode"}`; last u32 hash count + the hashes as u64.

use super::error::{bad, SnapshotError};
use crate::config::Mode;
use crate::load::CarriedRequest;
use crate::select::Filters;
use serde::{Deserialize, Serialize};

/// An in-flight request as saved: its load-tracker state, with workers as indices
/// into `Snapshot::workers` (the default `W`; a running router holds the same record
/// with its slots while dumping or restoring, `service::state::persist`).
#[derive(Clone, Debug, PartialEq)]
pub struct SavedRequest<W = u32> {
    pub request: CarriedRequest<W>,
    /// Disaggregated requests: what a prefill failure needs to re-route decode-only.
    pub reroute: Option<SavedReroute>,
    /// Routed by the OpenAI proxy of the router that wrote the snapshot: its client
    /// and upstream connections live in that process only, so a restart leaves
    /// nobody to end it (`service::state::persist::drop_orphans`).
    pub proxied_here: bool,
}

impl<W> SavedRequest<W> {
    /// [`CarriedRequest::map_workers`], keeping the re-route inputs.
    pub fn map_workers<V>(self, name: impl FnMut(&W) -> Option<V>) -> Option<SavedRequest<V>> {
        Some(SavedRequest {
            request: self.request.map_workers(name)?,
            reroute: self.reroute,
            proxied_here: self.proxied_here,
        })
    }
}

/// The routing inputs of a request beyond its hashes and sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedReroute {
    pub filters: Filters,
    pub mode: Mode,
}

/// A bounds-checked little-endian cursor.
pub(super) struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if self.0.len() < n {
            return Err(bad("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        self.take(N)?.try_into().map_err(|_| bad("truncated"))
    }
    pub fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A u64 count of items of at least `min_len` bytes each, checked against the
    /// bytes left (so a corrupt count allocates nothing).
    pub fn count(&mut self, min_len: usize) -> Result<usize, SnapshotError> {
        let n = usize::try_from(self.u64()?).map_err(|_| bad("count"))?;
        match n.checked_mul(min_len.max(1)) {
            Some(b) if b <= self.0.len() => Ok(n),
            _ => Err(bad("count")),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const FLAG_IN_PREFILL: u8 = 1;
const FLAG_OSL: u8 = 2;
const FLAG_FIRST_TOKEN: u8 = 4;
const FLAG_REROUTE: u8 = 8;
const FLAG_PROXIED_HERE: u8 = 16;
const NO_WORKER: u32 = u32::MAX;

impl SavedRequest {
    /// Bytes of a request with an empty id, no optional field and no hash.
    pub(super) const MIN_LEN: usize = 2 + 4 + 4 + 12 + 1 + 4 + 8 + 4;

    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        let r = &self.request;
        let id = r.id.as_bytes();
        // Ids are at most 128 bytes (checked at routing); never write a wrong length.
        let id = &id[..id.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(id.len() as u16).to_le_bytes());
        out.extend_from_slice(id);
        out.extend_from_slice(&r.decode_worker.to_le_bytes());
        out.extend_from_slice(&r.prefill_worker.unwrap_or(NO_WORKER).to_le_bytes());
        for v in [r.input_tokens, r.cached_tokens, r.prompt_blocks] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let reroute = self
            .reroute
            .as_ref()
            .and_then(|x| serde_json::to_vec(x).ok());
        let mut flags = 0;
        for (on, f) in [
            (r.in_prefill, FLAG_IN_PREFILL),
            (r.expected_output_tokens.is_some(), FLAG_OSL),
            (r.first_token_age_us.is_some(), FLAG_FIRST_TOKEN),
            (reroute.is_some(), FLAG_REROUTE),
            (self.proxied_here, FLAG_PROXIED_HERE),
        ] {
            if on {
                flags |= f;
            }
        }
        out.push(flags);
        out.extend_from_slice(&r.output_tokens.to_le_bytes());
        out.extend_from_slice(&r.age_us.to_le_bytes());
        if let Some(osl) = r.expected_output_tokens {
            out.extend_from_slice(&osl.to_le_bytes());
        }
        if let Some(a) = r.first_token_age_us {
            out.extend_from_slice(&a.to_le_bytes());
        }
        if let Some(json) = reroute {
            out.extend_from_slice(&(json.len() as u32).to_le_bytes());
            out.extend_from_slice(&json);
        }
        out.extend_from_slice(&(r.hashes.len() as u32).to_le_bytes());
        for h in &r.hashes {
            out.extend_from_slice(&h.to_le_bytes());
        }
    }

    /// Decodes one request; worker indices must be below `workers`.
    pub(super) fn decode(r: &mut Reader<'_>, workers: usize) -> Result<Self, SnapshotError> {
        let n = usize::from(r.u16()?);
        let id = std::str::from_utf8(r.take(n)?)
            .map_err(|_| bad("request id"))?
            .to_string();
        let worker = |i: u32| -> Result<u32, SnapshotError> {
            if (i as usize) < workers {
                Ok(i)
            } else {
                Err(bad("request worker"))
            }
        };
        let decode_worker = worker(r.u32()?)?;
        let prefill_worker = match r.u32()? {
            NO_WORKER => None,
            i => Some(worker(i)?),
        };
        let (input_tokens, cached_tokens, prompt_blocks) = (r.u32()?, r.u32()?, r.u32()?);
        let flags = r.u8()?;
        let known =
            FLAG_IN_PREFILL | FLAG_OSL | FLAG_FIRST_TOKEN | FLAG_REROUTE | FLAG_PROXIED_HERE;
        if flags & !known != 0 {
            return Err(bad("request flags"));
        }
        let output_tokens = r.u32()?;
        let age_us = r.u64()?;
        let expected_output_tokens = (flags & FLAG_OSL != 0).then(|| r.u32()).transpose()?;
        let first_token_age_us = (flags & FLAG_FIRST_TOKEN != 0)
            .then(|| r.u64())
            .transpose()?;
        let reroute = if flags & FLAG_REROUTE != 0 {
            let len = r.u32()? as usize;
            Some(serde_json::from_slice(r.take(len)?).map_err(|e| bad(&e.to_string()))?)
        } else {
            None
        };
        let n = r.u32()? as usize;
        let body = r.take(n.checked_mul(8).ok_or_else(|| bad("hash count"))?)?;
        let hashes = body
            .chunks_exact(8)
            .map(|c| c.try_into().map(u64::from_le_bytes))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| bad("hash"))?;
        let request = CarriedRequest {
            id,
            decode_worker,
            prefill_worker,
            input_tokens,
            cached_tokens,
            prompt_blocks,
            hashes,
            expected_output_tokens,
            in_prefill: flags & FLAG_IN_PREFILL != 0,
            output_tokens,
            age_us,
            first_token_age_us,
            // Not in the snapshot format: a restored request counts as routed, which
            // only matters if a peer load-syncs it (it then notes its prefix).
            pinned: false,
            idle_us: 0,
            local: false,
        };
        Ok(SavedRequest {
            request,
            reroute,
            proxied_here: flags & FLAG_PROXIED_HERE != 0,
        })
    }
}
