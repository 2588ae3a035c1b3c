//! Request protocol, frontend → router (port 7401): [`RequestMsg`].
//!
//! After `Hello`/`HelloAck`, the frontend pipelines requests; each carries a
//! correlation id `corr` chosen by the frontend, which the router copies into the one
//! response (`Decision`, `Ack` or `Error`) it sends for it, in any order.
//! The prompt of a `Route` (token ids or block hashes) is decoded zero-copy.

use bytes::BytesMut;

use crate::config::Mode;
use crate::types::WorkerSpec;

use super::event::read_hello_prefix;
use super::kind::*;
use super::spec::{read_spec, write_spec};
use super::wire::{encode_frame, Reader, Writer};
use super::{CodecError, Frame, HashList, TokenList, PROTOCOL_VERSION, REQUEST_MAGIC};

/// The prompt of a route request: token ids (the router hashes them into blocks) or
/// precomputed block sequence hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Tokens(TokenList),
    Hashes(HashList),
}

impl Prompt {
    /// Copies token ids into a prompt (clients; decoding is zero-copy).
    pub fn from_tokens(tokens: &[u32]) -> Prompt {
        Prompt::Tokens(TokenList::from_slice(tokens))
    }

    /// Copies block hashes into a prompt.
    pub fn from_hashes(hashes: &[u64]) -> Prompt {
        Prompt::Hashes(HashList::from_slice(hashes))
    }
}

/// "Where should this request run?" Filters and hints mirror DESIGN §1 "Selection".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub corr: u64,
    /// Caller's id of the request, the key of later `Lifecycle` notifications.
    pub request_id: String,
    /// Model; empty = default model.
    pub model: String,
    /// Routing mode; `None` = the router's configured default.
    pub mode: Option<Mode>,
    /// Return every candidate's cost terms with the decision.
    pub explain: bool,
    /// Prompt length in tokens when it differs from what the prompt implies (e.g. a
    /// hash prompt whose last partial block is not hashed).
    pub input_tokens: Option<u32>,
    /// Expected output length (OSL hint).
    pub expected_output_tokens: Option<u32>,
    /// Only these worker ids are eligible; `None` = no allow-list.
    pub allow: Option<Vec<String>>,
    /// Exactly this worker (mode `direct`, or a hard pin in any mode).
    pub pin: Option<String>,
    /// Inclusive data-parallel rank bounds `(lo, hi)`.
    pub dp: Option<(u32, u32)>,
    /// Taints this request tolerates.
    pub tolerations: Vec<String>,
    /// LoRA adapter the prompt runs under: token prompts are hashed in that adapter's
    /// hash space, as the engine adapter hashes its events (`engines::lora_salt`).
    /// On the wire: bit 1 of `prompt_kind` (docs/PROTOCOL.md §4.1 `Route`).
    pub lora_name: Option<String>,
    /// The request's `cache_salt`: token prompts are hashed in that salt's hash space
    /// (`engines::chain_start`). On the wire: bit 2 of `prompt_kind`, the string after
    /// `lora_name` (docs/PROTOCOL.md §4.1 `Route`).
    pub cache_salt: Option<String>,
    pub prompt: Prompt,
}

impl Route {
    /// A request with no hints or filters.
    pub fn new(corr: u64, request_id: impl Into<String>, prompt: Prompt) -> Route {
        Route {
            corr,
            request_id: request_id.into(),
            model: String::new(),
            mode: None,
            explain: false,
            input_tokens: None,
            expected_output_tokens: None,
            allow: None,
            pin: None,
            dp: None,
            tolerations: Vec::new(),
            lora_name: None,
            cache_salt: None,
            prompt,
        }
    }
}

/// Request lifecycle notifications (DESIGN §1 "Active load model").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LifecycleOp {
    /// Prefill finished: the first output token was produced.
    FirstToken = 0,
    /// `output_tokens` have been generated so far.
    Progress = 1,
    /// The request is done; its load is released.
    Finish = 2,
    /// The prefill worker failed; the request falls back to decode-only routing.
    PrefillFailed = 3,
}

impl LifecycleOp {
    pub fn from_u8(v: u8) -> Option<LifecycleOp> {
        match v {
            0 => Some(LifecycleOp::FirstToken),
            1 => Some(LifecycleOp::Progress),
            2 => Some(LifecycleOp::Finish),
            3 => Some(LifecycleOp::PrefillFailed),
            _ => None,
        }
    }

    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// A frame a frontend sends to the router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestMsg {
    /// First frame of every connection (magic `KVRQ` and version implicit).
    Hello {
        auth_token: String,
    },
    Route(Route),
    Lifecycle {
        corr: u64,
        op: LifecycleOp,
        request_id: String,
        output_tokens: u32,
    },
    /// Admin: register or update a worker without an event connection.
    Register {
        corr: u64,
        spec: WorkerSpec,
    },
    /// Admin: remove a worker and its blocks.
    Deregister {
        corr: u64,
        worker_id: String,
    },
}

impl RequestMsg {
    /// Decodes a frontend → router frame.
    pub fn decode(frame: &Frame) -> Result<RequestMsg, CodecError> {
        let mut rd = Reader::new(frame);
        let r = &mut rd;
        let msg = match frame.kind {
            RQ_HELLO => {
                read_hello_prefix(r, REQUEST_MAGIC)?;
                RequestMsg::Hello {
                    auth_token: r.string("auth_token")?,
                }
            }
            RQ_ROUTE => RequestMsg::Route(read_route(r)?),
            RQ_LIFECYCLE => RequestMsg::Lifecycle {
                corr: r.u64("corr")?,
                op: r.enum_u8("op", LifecycleOp::from_u8)?,
                request_id: r.string("request_id")?,
                output_tokens: r.u32("output_tokens")?,
            },
            RQ_REGISTER => RequestMsg::Register {
                corr: r.u64("corr")?,
                spec: read_spec(r)?,
            },
            RQ_DEREGISTER => RequestMsg::Deregister {
                corr: r.u64("corr")?,
                worker_id: r.string("worker_id")?,
            },
            k => return Err(CodecError::UnknownKind(k)),
        };
        rd.finish()?;
        Ok(msg)
    }

    /// Appends the complete frame. Fails (leaving `out` unchanged) only if a string or
    /// list exceeds its wire limit (`TooLarge`), e.g. for a route built from
    /// unvalidated input.
    pub fn try_encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        match self {
            RequestMsg::Hello { auth_token } => encode_frame(out, RQ_HELLO, |w| {
                w.bytes(&REQUEST_MAGIC);
                w.u16(PROTOCOL_VERSION);
                w.string("auth_token", auth_token)
            }),
            RequestMsg::Route(route) => encode_frame(out, RQ_ROUTE, |w| write_route(w, route)),
            RequestMsg::Lifecycle {
                corr,
                op,
                request_id,
                output_tokens,
            } => encode_frame(out, RQ_LIFECYCLE, |w| {
                w.u64(*corr);
                w.u8(op.as_u8());
                w.string("request_id", request_id)?;
                w.u32(*output_tokens);
                Ok(())
            }),
            RequestMsg::Register { corr, spec } => encode_frame(out, RQ_REGISTER, |w| {
                w.u64(*corr);
                write_spec(w, spec)
            }),
            RequestMsg::Deregister { corr, worker_id } => encode_frame(out, RQ_DEREGISTER, |w| {
                w.u64(*corr);
                w.string("worker_id", worker_id)
            }),
        }
    }

    /// Appends the complete frame.
    ///
    /// # Panics
    /// If a field exceeds its wire limit; use [`RequestMsg::try_encode`] for values
    /// that may.
    pub fn encode(&self, out: &mut BytesMut) {
        if let Err(e) = self.try_encode(out) {
            panic!("RequestMsg::encode: {e}");
        }
    }

    /// The correlation id (`None` for `Hello`).
    pub fn corr(&self) -> Option<u64> {
        match self {
            RequestMsg::Hello { .. } => None,
            RequestMsg::Route(r) => Some(r.corr),
            RequestMsg::Lifecycle { corr, .. }
            | RequestMsg::Register { corr, .. }
            | RequestMsg::Deregister { corr, .. } => Some(*corr),
        }
    }
}

/// Prompt kind byte: bit 0 = hashes (else token ids), bit 1 = a `lora_name` string
/// precedes the prompt array, bit 2 = a `cache_salt` string follows it (then the
/// prompt). Values above 7 are malformed.
const PROMPT_TOKENS: u8 = 0;
const PROMPT_HASHES: u8 = 1;
const PROMPT_LORA: u8 = 2;
const PROMPT_SALT: u8 = 4;

fn read_route(r: &mut Reader<'_>) -> Result<Route, CodecError> {
    let mut route = Route {
        corr: r.u64("corr")?,
        request_id: r.string("request_id")?,
        model: r.string("model")?,
        mode: r.opt("mode", |r| r.enum_u8("mode", Mode::from_u8))?,
        explain: r.bool("explain")?,
        input_tokens: r.opt("input_tokens", |r| r.u32("input_tokens"))?,
        expected_output_tokens: r.opt("expected_output_tokens", |r| {
            r.u32("expected_output_tokens")
        })?,
        allow: r.opt("allow", |r| r.string_list("allow"))?,
        pin: r.opt("pin", |r| r.string("pin"))?,
        dp: r.opt("dp", |r| Ok((r.u32("dp.lo")?, r.u32("dp.hi")?)))?,
        tolerations: r.string_list("tolerations")?,
        lora_name: None,
        cache_salt: None,
        prompt: Prompt::Tokens(TokenList::default()),
    };
    let prompt_kind = r.enum_u8("prompt_kind", |k| {
        (k <= (PROMPT_HASHES | PROMPT_LORA | PROMPT_SALT)).then_some(k)
    })?;
    if prompt_kind & PROMPT_LORA != 0 {
        route.lora_name = Some(r.string("lora_name")?);
    }
    if prompt_kind & PROMPT_SALT != 0 {
        route.cache_salt = Some(r.string("cache_salt")?);
    }
    route.prompt = if prompt_kind & PROMPT_HASHES == 0 {
        let b = r.tail_array("prompt", TokenList::ITEM_SIZE)?;
        Prompt::Tokens(TokenList::from_le_bytes(b).unwrap_or_default())
    } else {
        let b = r.tail_array("prompt", HashList::ITEM_SIZE)?;
        Prompt::Hashes(HashList::from_le_bytes(b).unwrap_or_default())
    };
    Ok(route)
}

fn write_route(w: &mut Writer<'_>, route: &Route) -> Result<(), CodecError> {
    w.u64(route.corr);
    w.string("request_id", &route.request_id)?;
    w.string("model", &route.model)?;
    w.opt(route.mode, |w, m| {
        w.u8(m.as_u8());
        Ok(())
    })?;
    w.bool(route.explain);
    w.opt(route.input_tokens, |w, v| {
        w.u32(v);
        Ok(())
    })?;
    w.opt(route.expected_output_tokens, |w, v| {
        w.u32(v);
        Ok(())
    })?;
    w.opt(route.allow.as_deref(), |w, l| w.string_list("allow", l))?;
    w.opt(route.pin.as_deref(), |w, p| w.string("pin", p))?;
    w.opt(route.dp, |w, (lo, hi)| {
        w.u32(lo);
        w.u32(hi);
        Ok(())
    })?;
    w.string_list("tolerations", &route.tolerations)?;
    let lora = if route.lora_name.is_some() {
        PROMPT_LORA
    } else {
        0
    };
    let kind = match &route.prompt {
        Prompt::Tokens(_) => PROMPT_TOKENS,
        Prompt::Hashes(_) => PROMPT_HASHES,
    };
    let salt = if route.cache_salt.is_some() {
        PROMPT_SALT
    } else {
        0
    };
    w.u8(kind | lora | salt);
    if let Some(name) = &route.lora_name {
        w.string("lora_name", name)?;
    }
    if let Some(salt) = &route.cache_salt {
        w.string("cache_salt", salt)?;
    }
    match &route.prompt {
        Prompt::Tokens(t) => w.raw_array("prompt", TokenList::ITEM_SIZE, t.as_le_bytes()),
        Prompt::Hashes(h) => w.raw_array("prompt", HashList::ITEM_SIZE, h.as_le_bytes()),
    }
}
