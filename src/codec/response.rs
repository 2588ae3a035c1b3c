//! Request protocol, router → frontend (port 7401): [`ResponseMsg`], the routing
//! [`Decision`] with its optional explanation. (The [`ErrorCode`](super::ErrorCode)
//! table both protocols share is in `error`.)
//!
//! Enumerations that change what a client must do (stage, fallback) are strict on
//! decode; error codes stay raw `u16` so a code added by a newer router still decodes
//! (clients treat unknown codes like `Internal`).

use bytes::BytesMut;

use crate::types::Overlap;

use super::kind::*;
use super::wire::{encode_frame, Reader, Writer};
use super::{CodecError, Frame};

/// Why a disaggregated request was routed decode-only (DESIGN §1 "Disaggregated").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Fallback {
    /// No fallback: normal routing.
    #[default]
    None = 0,
    /// The model has no prefill workers.
    NoPrefillWorkers = 1,
    /// Prefill workers exist but the request's filters excluded them all.
    PrefillFilteredOut = 2,
    /// The frontend reported that prefill failed.
    PrefillFailed = 3,
}

impl Fallback {
    pub fn from_u8(v: u8) -> Option<Fallback> {
        match v {
            0 => Some(Fallback::None),
            1 => Some(Fallback::NoPrefillWorkers),
            2 => Some(Fallback::PrefillFilteredOut),
            3 => Some(Fallback::PrefillFailed),
            _ => None,
        }
    }
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// Which routing stage scored an explained candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Stage {
    /// Single-stage (aggregated or decode-only fallback) routing.
    #[default]
    Aggregated = 0,
    /// Prefill stage of disaggregated routing.
    Prefill = 1,
    /// Decode stage of disaggregated routing.
    Decode = 2,
}

impl Stage {
    pub fn from_u8(v: u8) -> Option<Stage> {
        match v {
            0 => Some(Stage::Aggregated),
            1 => Some(Stage::Prefill),
            2 => Some(Stage::Decode),
            _ => None,
        }
    }
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// One scored worker in an explained decision: the terms of DESIGN §1 "Cost".
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Candidate {
    pub worker: String,
    pub stage: Stage,
    pub prefill_blocks: f64,
    pub overlap: Overlap,
    pub adjusted_prefill: f64,
    pub decode_blocks: f64,
    pub cost: f64,
}

/// The router's answer to a `Route`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Decision {
    pub corr: u64,
    pub request_id: String,
    /// Worker that decodes (and, without a prefill worker, also prefills).
    pub decode_worker: String,
    /// Prefill worker of a disaggregated decision.
    pub prefill_worker: Option<String>,
    /// Data-parallel rank chosen on the decode worker (0 without data parallelism).
    pub dp_rank: u32,
    /// Overlap of the request with the worker that does the prefill.
    pub overlap: Overlap,
    /// Cost of the chosen (decode) worker.
    pub cost: f64,
    pub fallback: Fallback,
    /// Every scored candidate if the request asked to `explain`, else empty.
    pub candidates: Vec<Candidate>,
}

/// A frame the router sends to a frontend.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseMsg {
    /// Handshake accepted.
    HelloAck {
        server_version: u16,
    },
    Decision(Decision),
    /// A `Lifecycle`, `Register` or `Deregister` succeeded.
    Ack {
        corr: u64,
    },
    /// The request `corr` failed (`corr` 0 for connection-level errors, after which the
    /// router closes). `code` is an [`ErrorCode`] value.
    Error {
        corr: u64,
        code: u16,
        message: String,
    },
}

impl ResponseMsg {
    /// Decodes a router → frontend frame.
    pub fn decode(frame: &Frame) -> Result<ResponseMsg, CodecError> {
        let mut rd = Reader::new(frame);
        let r = &mut rd;
        let msg = match frame.kind {
            RS_HELLO_ACK => ResponseMsg::HelloAck {
                server_version: r.u16("server_version")?,
            },
            RS_DECISION => ResponseMsg::Decision(read_decision(r)?),
            RS_ACK => ResponseMsg::Ack {
                corr: r.u64("corr")?,
            },
            RS_ERROR => ResponseMsg::Error {
                corr: r.u64("corr")?,
                code: r.u16("code")?,
                message: r.string("message")?,
            },
            k => return Err(CodecError::UnknownKind(k)),
        };
        rd.finish()?;
        Ok(msg)
    }

    /// Appends the complete frame. Fails (leaving `out` unchanged) only if a string or
    /// the candidate list exceeds its wire limit. `Error` messages are cut at a
    /// character boundary instead of failing.
    pub fn try_encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        match self {
            ResponseMsg::HelloAck { server_version } => encode_frame(out, RS_HELLO_ACK, |w| {
                w.u16(*server_version);
                Ok(())
            }),
            ResponseMsg::Decision(d) => encode_frame(out, RS_DECISION, |w| write_decision(w, d)),
            ResponseMsg::Ack { corr } => encode_frame(out, RS_ACK, |w| {
                w.u64(*corr);
                Ok(())
            }),
            ResponseMsg::Error {
                corr,
                code,
                message,
            } => encode_frame(out, RS_ERROR, |w| {
                w.u64(*corr);
                w.u16(*code);
                w.string_truncated(message);
                Ok(())
            }),
        }
    }

    /// Appends the complete frame.
    ///
    /// # Panics
    /// If a field exceeds its wire limit; use [`ResponseMsg::try_encode`] for values
    /// that may.
    pub fn encode(&self, out: &mut BytesMut) {
        if let Err(e) = self.try_encode(out) {
            panic!("ResponseMsg::encode: {e}");
        }
    }

    /// The correlation id (`None` for `HelloAck`).
    pub fn corr(&self) -> Option<u64> {
        match self {
            ResponseMsg::HelloAck { .. } => None,
            ResponseMsg::Decision(d) => Some(d.corr),
            ResponseMsg::Ack { corr } | ResponseMsg::Error { corr, .. } => Some(*corr),
        }
    }
}

fn read_overlap(r: &mut Reader<'_>) -> Result<Overlap, CodecError> {
    Ok(Overlap {
        device: r.u32("overlap.device")?,
        host: r.u32("overlap.host")?,
        disk: r.u32("overlap.disk")?,
        shared: r.u32("overlap.shared")?,
    })
}

fn write_overlap(w: &mut Writer<'_>, o: &Overlap) {
    w.u32(o.device);
    w.u32(o.host);
    w.u32(o.disk);
    w.u32(o.shared);
}

/// Smallest encoded candidate: empty worker string (2) + stage (1) + 4 f64 + overlap.
const MIN_CANDIDATE_LEN: usize = 2 + 1 + 4 * 8 + 16;

fn read_decision(r: &mut Reader<'_>) -> Result<Decision, CodecError> {
    let mut d = Decision {
        corr: r.u64("corr")?,
        request_id: r.string("request_id")?,
        decode_worker: r.string("decode_worker")?,
        prefill_worker: r.opt("prefill_worker", |r| r.string("prefill_worker"))?,
        dp_rank: r.u32("dp_rank")?,
        overlap: read_overlap(r)?,
        cost: r.f64("cost")?,
        fallback: r.enum_u8("fallback", Fallback::from_u8)?,
        candidates: Vec::new(),
    };
    let count = r.u16("candidates")? as usize;
    // A count the payload cannot hold fails while reading; don't let it size the Vec.
    d.candidates = Vec::with_capacity(count.min(r.remaining() / MIN_CANDIDATE_LEN));
    for _ in 0..count {
        d.candidates.push(Candidate {
            worker: r.string("candidate.worker")?,
            stage: r.enum_u8("candidate.stage", Stage::from_u8)?,
            prefill_blocks: r.f64("candidate.prefill_blocks")?,
            overlap: read_overlap(r)?,
            adjusted_prefill: r.f64("candidate.adjusted_prefill")?,
            decode_blocks: r.f64("candidate.decode_blocks")?,
            cost: r.f64("candidate.cost")?,
        });
    }
    Ok(d)
}

fn write_decision(w: &mut Writer<'_>, d: &Decision) -> Result<(), CodecError> {
    w.u64(d.corr);
    w.string("request_id", &d.request_id)?;
    w.string("decode_worker", &d.decode_worker)?;
    w.opt(d.prefill_worker.as_deref(), |w, p| {
        w.string("prefill_worker", p)
    })?;
    w.u32(d.dp_rank);
    write_overlap(w, &d.overlap);
    w.f64(d.cost);
    w.u8(d.fallback.as_u8());
    w.count16("candidates", d.candidates.len())?;
    for c in &d.candidates {
        w.string("candidate.worker", &c.worker)?;
        w.u8(c.stage.as_u8());
        w.f64(c.prefill_blocks);
        write_overlap(w, &c.overlap);
        w.f64(c.adjusted_prefill);
        w.f64(c.decode_blocks);
        w.f64(c.cost);
    }
    Ok(())
}
