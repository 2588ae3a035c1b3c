//! The routing request and decision as the outside world sees them.
//!
//! These are the JSON bodies of `POST /v1/route` (and the binary protocol carries the
//! same fields). Worker ids are strings here; the engine works on slots internally.
//! `validate_and_hash` turns a request into the hash list and shape the engine scores,
//! enforcing the per-request limits.

use crate::config::Mode;
use crate::select::{DpBounds, Filters};
use crate::types::Overlap;
use serde::{Deserialize, Serialize};

/// DP-rank constraint: an exact rank or inclusive bounds `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DpRankSpec {
    Exact(u32),
    Range([u32; 2]),
}

impl DpRankSpec {
    pub fn bounds(self) -> (u32, u32) {
        match self {
            DpRankSpec::Exact(r) => (r, r),
            DpRankSpec::Range([lo, hi]) => (lo, hi),
        }
    }
}

/// `POST /v1/route` body.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRequest {
    pub request_id: String,
    #[serde(default)]
    pub model: Option<String>,
    /// Prompt token ids (the router hashes them)…
    #[serde(default)]
    pub tokens: Option<Vec<u32>>,
    /// …or precomputed sequence hashes, one per complete block.
    #[serde(default)]
    pub block_hashes: Option<Vec<u64>>,
    /// Prompt length; defaults to `tokens.len()` or `block_hashes.len() * block_size`.
    #[serde(default)]
    pub input_tokens: Option<u32>,
    /// OSL hint used by `track_output_blocks`.
    #[serde(default)]
    pub expected_output_tokens: Option<u32>,
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    #[serde(default)]
    pub pin: Option<String>,
    #[serde(default)]
    pub dp_rank: Option<DpRankSpec>,
    #[serde(default)]
    pub tolerations: Option<Vec<String>>,
    #[serde(default, with = "mode_opt")]
    pub mode: Option<Mode>,
    #[serde(default)]
    pub explain: bool,
    /// LoRA adapter the prompt runs under. Token prompts are then hashed in that
    /// adapter's hash space, exactly as the engine adapter hashes the engine's events
    /// for it (`engines::lora_salt`), so a frontend needs no salting of its own. Only
    /// with `tokens`: `block_hashes` are used as given.
    #[serde(default)]
    pub lora_name: Option<String>,
    /// The request's `cache_salt` (vLLM and SGLang's tenant isolation field). Token
    /// prompts are then hashed in that salt's hash space, as the engine adapter hashes
    /// the engines' salted events (`engines::chain_start`), so salted blocks are only
    /// credited to requests with the same salt. An empty salt is no salt. Only with
    /// `tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
    /// The request's session (`admission::hints`: a hash of its session key within its
    /// tenant), set by the proxy: its next turns go back to the same worker under the
    /// affinity slack (`select::Sessions`). Not part of the JSON API.
    #[serde(skip)]
    pub session: Option<u64>,
}

mod mode_opt {
    use crate::config::Mode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &Option<Mode>, s: S) -> Result<S::Ok, S::Error> {
        match m {
            Some(m) => s.serialize_str(m.name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Mode>, D::Error> {
        let v: Option<String> = Option::deserialize(d)?;
        match v {
            None => Ok(None),
            Some(s) => Mode::parse(&s)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown mode {s:?}"))),
        }
    }
}

/// One scored candidate (only with `explain`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateOut {
    pub worker: String,
    pub stage: String,
    pub prefill_blocks: f64,
    pub overlap: Overlap,
    pub adjusted_prefill: f64,
    pub decode_blocks: f64,
    pub cost: f64,
    /// Blocks of `overlap.device` that are only pending on the worker (speculative
    /// indexing: routed there recently, not yet confirmed by its events).
    #[serde(default)]
    pub speculative: u32,
}

/// `POST /v1/route` answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteDecision {
    pub request_id: String,
    pub decode_worker: String,
    pub prefill_worker: Option<String>,
    pub dp_rank: u32,
    pub overlap: Overlap,
    pub cost: f64,
    /// `none`, `no_prefill_workers`, `prefill_filtered_out` or `prefill_failed`.
    pub fallback: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub candidates: Option<Vec<CandidateOut>>,
    /// A disaggregated request that prefills on its decode worker (no prefill leg),
    /// and why: `short` (little of the prompt uncached there) or `cached` (it holds
    /// enough of it); see `local_prefill_*`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub local_prefill: Option<String>,
    /// The affinity worker (a session's or a prefix's) the decision was offered, and
    /// whether it got the request.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub affinity: Option<AffinityOut>,
}

/// [`RouteDecision::affinity`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AffinityOut {
    pub worker: String,
    /// `session` or `prefix`.
    pub source: String,
    /// The request went to it (its cost was within the affinity slack).
    pub kept: bool,
}

/// A request reduced to what scoring needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    pub hashes: Vec<u64>,
    pub input_tokens: u32,
    pub prompt_blocks: u32,
    pub filters: Filters,
    /// [`RouteRequest::session`].
    pub session: Option<u64>,
}

/// Why a request was refused before scoring (HTTP 400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// Longest accepted `lora_name`, in bytes (the binary protocol's string limit).
pub const MAX_LORA_NAME: usize = u16::MAX as usize;

/// Longest accepted request id.
pub const MAX_REQUEST_ID: usize = crate::ids::MAX_ID_LEN;

/// Checks a request id against the id rule (`crate::ids`).
pub fn check_request_id(id: &str) -> Result<(), BadRequest> {
    crate::ids::check("request_id", id).map_err(BadRequest)
}

impl RouteRequest {
    /// Validates the request and computes its sequence hashes and shape.
    pub fn prepare(&self, block_size: u32, max_hashes: usize) -> Result<Prepared, BadRequest> {
        self.prepare_with(block_size, 0, max_hashes)
    }

    /// [`RouteRequest::prepare`] for engines whose block hashes cover the `lookahead`
    /// tokens after each block (`lookahead_tokens`).
    pub fn prepare_with(
        &self,
        block_size: u32,
        lookahead: u32,
        max_hashes: usize,
    ) -> Result<Prepared, BadRequest> {
        check_request_id(&self.request_id)?;
        let bs = block_size.max(1) as usize;
        match &self.lora_name {
            Some(n) if n.is_empty() || n.len() > MAX_LORA_NAME => {
                return Err(BadRequest(format!(
                    "lora_name must be 1..={MAX_LORA_NAME} bytes"
                )))
            }
            Some(_) if self.block_hashes.is_some() => {
                return Err(BadRequest(
                    "lora_name applies to tokens; block_hashes are used as given".into(),
                ))
            }
            _ => {}
        }
        match &self.cache_salt {
            Some(n) if n.len() > MAX_LORA_NAME => {
                return Err(BadRequest(format!(
                    "cache_salt must be at most {MAX_LORA_NAME} bytes"
                )))
            }
            Some(n) if !n.is_empty() && self.block_hashes.is_some() => {
                return Err(BadRequest(
                    "cache_salt applies to tokens; block_hashes are used as given".into(),
                ))
            }
            _ => {}
        }
        let salt =
            crate::engines::chain_start(self.lora_name.as_deref(), self.cache_salt.as_deref());
        let (hashes, default_isl) = match (&self.tokens, &self.block_hashes) {
            (Some(_), Some(_)) => {
                return Err(BadRequest(
                    "give either tokens or block_hashes, not both".into(),
                ))
            }
            (None, None) => return Err(BadRequest("tokens or block_hashes is required".into())),
            (Some(t), None) => {
                if t.len() / bs > max_hashes {
                    return Err(BadRequest(format!(
                        "prompt too long: {} blocks > limit {max_hashes}",
                        t.len() / bs
                    )));
                }
                let len =
                    u32::try_from(t.len()).map_err(|_| BadRequest("prompt too long".into()))?;
                let mut hashes = Vec::with_capacity(t.len() / bs);
                crate::engines::prompt_hashes(t, bs, salt, lookahead as usize, &mut hashes);
                (hashes, len)
            }
            (None, Some(h)) => {
                if h.len() > max_hashes {
                    return Err(BadRequest(format!(
                        "too many block_hashes: {} > limit {max_hashes}",
                        h.len()
                    )));
                }
                (h.clone(), (h.len() * bs) as u32)
            }
        };
        let input_tokens = match self.input_tokens {
            Some(n) if (n as u64) < (hashes.len() as u64) * bs as u64 => {
                return Err(BadRequest(format!(
                    "input_tokens {n} is smaller than the {} complete blocks given",
                    hashes.len()
                )))
            }
            Some(n) => n,
            None => default_isl,
        };
        let prompt_blocks = input_tokens.div_ceil(block_size.max(1));
        for (name, list) in [("allow", &self.allow), ("tolerations", &self.tolerations)] {
            if let Some(l) = list {
                if l.len() > 4096 {
                    return Err(BadRequest(format!("{name} has more than 4096 entries")));
                }
            }
        }
        let dp = match self.dp_rank {
            Some(spec) => {
                let (lo, hi) = spec.bounds();
                if lo > hi {
                    return Err(BadRequest("dp_rank range must have lo <= hi".into()));
                }
                Some(DpBounds { lo, hi })
            }
            None => None,
        };
        Ok(Prepared {
            hashes,
            input_tokens,
            prompt_blocks,
            filters: Filters {
                model: self.model.clone().unwrap_or_default(),
                allow: self.allow.clone(),
                pin: self.pin.clone(),
                dp,
                tolerations: self.tolerations.clone().unwrap_or_default(),
            },
            session: self.session,
        })
    }
}

/// A lifecycle step of a routed request: the first output token, progress (output
/// tokens so far), the end (its load released), or a failed prefill (re-routed
/// decode-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifeOp {
    FirstToken,
    Progress(u32),
    Finish,
    PrefillFailed,
}
