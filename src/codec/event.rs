//! Event protocol messages (port 7400): [`EventMsg`] (worker → router) and
//! [`WorkerBound`] (router → worker).
//!
//! A connection starts with the worker's `Hello` (identity, metadata, auth token) and
//! the router's `HelloAck` (the sequence number it expects next). Every later
//! worker frame is a sequenced event; sequence rules are in docs/PROTOCOL.md §Sequence.
//! This module only translates bytes; it keeps no per-connection state.

use bytes::BytesMut;

use crate::types::{Tier, WorkerSpec};

use super::kind::*;
use super::spec::{read_spec, write_spec};
use super::wire::{encode_frame, Reader};
use super::{CodecError, Frame, HashList, Problem, EVENT_MAGIC, PROTOCOL_VERSION};

/// The worker's handshake: who it is and the token that authorises it. The magic
/// `KVRE` and version [`PROTOCOL_VERSION`] are implicit (checked on decode, written on
/// encode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventHello {
    /// Shared secret, may be empty (router without auth).
    pub auth_token: String,
    /// The worker's complete registration.
    pub spec: WorkerSpec,
}

/// A frame a worker sends to the router.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventMsg {
    /// First frame of every connection, exactly once.
    Hello(EventHello),
    /// Blocks `hashes` (sequence hashes, in prefix order) are now cached in `tier`;
    /// `parent` is the sequence hash of the block preceding `hashes[0]`, if any.
    Stored {
        seq: u64,
        tier: Tier,
        parent: Option<u64>,
        hashes: HashList,
    },
    /// Blocks `hashes` left `tier`.
    Removed {
        seq: u64,
        tier: Tier,
        hashes: HashList,
    },
    /// Every block of `tier` (of every tier if `None`) is gone.
    Cleared { seq: u64, tier: Option<Tier> },
    /// Liveness and load report; consumes a sequence number like any event.
    Heartbeat {
        seq: u64,
        active_requests: u32,
        waiting_requests: u32,
        kv_used_blocks: u64,
        kv_capacity_blocks: u64,
    },
    /// Start of a full re-announce: the router drops this worker's blocks and rebuilds
    /// them from the `Stored` events up to the matching `ResyncEnd`.
    ResyncBegin { seq: u64 },
    /// End of a full re-announce.
    ResyncEnd { seq: u64 },
}

/// Reads magic + version, the common prefix of both protocols' `Hello`.
pub(crate) fn read_hello_prefix(r: &mut Reader<'_>, magic: [u8; 4]) -> Result<(), CodecError> {
    let got = r.bytes4("magic")?;
    if got != magic {
        return Err(r.error_at(0, "magic", Problem::BadMagic(got)));
    }
    let version = r.u16("version")?;
    if version != PROTOCOL_VERSION {
        return Err(CodecError::UnsupportedVersion {
            got: version,
            supported: PROTOCOL_VERSION,
        });
    }
    Ok(())
}

impl EventMsg {
    /// Decodes a worker → router frame.
    pub fn decode(frame: &Frame) -> Result<EventMsg, CodecError> {
        let mut rd = Reader::new(frame);
        let r = &mut rd;
        let msg = match frame.kind {
            EV_HELLO => {
                read_hello_prefix(r, EVENT_MAGIC)?;
                EventMsg::Hello(EventHello {
                    auth_token: r.string("auth_token")?,
                    spec: read_spec(r)?,
                })
            }
            EV_STORED => EventMsg::Stored {
                seq: r.u64("seq")?,
                tier: r.enum_u8("tier", Tier::from_u8)?,
                parent: r.opt("parent", |r| r.u64("parent"))?,
                hashes: hashes(r)?,
            },
            EV_REMOVED => EventMsg::Removed {
                seq: r.u64("seq")?,
                tier: r.enum_u8("tier", Tier::from_u8)?,
                hashes: hashes(r)?,
            },
            EV_CLEARED => EventMsg::Cleared {
                seq: r.u64("seq")?,
                tier: r.opt("tier", |r| r.enum_u8("tier", Tier::from_u8))?,
            },
            EV_HEARTBEAT => EventMsg::Heartbeat {
                seq: r.u64("seq")?,
                active_requests: r.u32("active_requests")?,
                waiting_requests: r.u32("waiting_requests")?,
                kv_used_blocks: r.u64("kv_used_blocks")?,
                kv_capacity_blocks: r.u64("kv_capacity_blocks")?,
            },
            EV_RESYNC_BEGIN => EventMsg::ResyncBegin { seq: r.u64("seq")? },
            EV_RESYNC_END => EventMsg::ResyncEnd { seq: r.u64("seq")? },
            k => return Err(CodecError::UnknownKind(k)),
        };
        rd.finish()?;
        Ok(msg)
    }

    /// Appends the complete frame. Fails (leaving `out` unchanged) only if a string or
    /// list exceeds its wire limit (`TooLarge`).
    pub fn try_encode(&self, out: &mut BytesMut) -> Result<(), CodecError> {
        match self {
            EventMsg::Hello(h) => encode_frame(out, EV_HELLO, |w| {
                w.bytes(&EVENT_MAGIC);
                w.u16(PROTOCOL_VERSION);
                w.string("auth_token", &h.auth_token)?;
                write_spec(w, &h.spec)
            }),
            EventMsg::Stored {
                seq,
                tier,
                parent,
                hashes,
            } => encode_frame(out, EV_STORED, |w| {
                w.u64(*seq);
                w.u8(tier.as_u8());
                w.opt(*parent, |w, p| {
                    w.u64(p);
                    Ok(())
                })?;
                w.raw_array("hashes", 8, hashes.as_le_bytes())
            }),
            EventMsg::Removed { seq, tier, hashes } => encode_frame(out, EV_REMOVED, |w| {
                w.u64(*seq);
                w.u8(tier.as_u8());
                w.raw_array("hashes", 8, hashes.as_le_bytes())
            }),
            EventMsg::Cleared { seq, tier } => encode_frame(out, EV_CLEARED, |w| {
                w.u64(*seq);
                w.opt(*tier, |w, t| {
                    w.u8(t.as_u8());
                    Ok(())
                })
            }),
            EventMsg::Heartbeat {
                seq,
                active_requests,
                waiting_requests,
                kv_used_blocks,
                kv_capacity_blocks,
            } => encode_frame(out, EV_HEARTBEAT, |w| {
                w.u64(*seq);
                w.u32(*active_requests);
                w.u32(*waiting_requests);
                w.u64(*kv_used_blocks);
                w.u64(*kv_capacity_blocks);
                Ok(())
            }),
            EventMsg::ResyncBegin { seq } => encode_frame(out, EV_RESYNC_BEGIN, |w| {
                w.u64(*seq);
                Ok(())
            }),
            EventMsg::ResyncEnd { seq } => encode_frame(out, EV_RESYNC_END, |w| {
                w.u64(*seq);
                Ok(())
            }),
        }
    }

    /// Appends the complete frame.
    ///
    /// # Panics
    /// If a field exceeds its wire limit (a string over 65535 bytes, over 65535 taints,
    /// over 2³² hashes); use [`EventMsg::try_encode`] for values that may.
    pub fn encode(&self, out: &mut BytesMut) {
        if let Err(e) = self.try_encode(out) {
            panic!("EventMsg::encode: {e}");
        }
    }

    /// Appends a `Stored` frame straight from a slice (no intermediate [`HashList`]).
    ///
    /// # Panics
    /// With more than ~536 million hashes (the frame length would overflow `u32`).
    pub fn encode_stored(
        out: &mut BytesMut,
        seq: u64,
        tier: Tier,
        parent: Option<u64>,
        hashes: &[u64],
    ) {
        let res = encode_frame(out, EV_STORED, |w| {
            w.u64(seq);
            w.u8(tier.as_u8());
            w.opt(parent, |w, p| {
                w.u64(p);
                Ok(())
            })?;
            w.u64_array("hashes", hashes)
        });
        if let Err(e) = res {
            panic!("EventMsg::encode_stored: {e}");
        }
    }

    /// Appends a `Removed` frame straight from a slice.
    ///
    /// # Panics
    /// As [`EventMsg::encode_stored`].
    pub fn encode_removed(out: &mut BytesMut, seq: u64, tier: Tier, hashes: &[u64]) {
        let res = encode_frame(out, EV_REMOVED, |w| {
            w.u64(seq);
            w.u8(tier.as_u8());
            w.u64_array("hashes", hashes)
        });
        if let Err(e) = res {
            panic!("EventMsg::encode_removed: {e}");
        }
    }

    /// The frame's kind byte.
    pub fn kind(&self) -> u8 {
        match self {
            EventMsg::Hello(_) => EV_HELLO,
            EventMsg::Stored { .. } => EV_STORED,
            EventMsg::Removed { .. } => EV_REMOVED,
            EventMsg::Cleared { .. } => EV_CLEARED,
            EventMsg::Heartbeat { .. } => EV_HEARTBEAT,
            EventMsg::ResyncBegin { .. } => EV_RESYNC_BEGIN,
            EventMsg::ResyncEnd { .. } => EV_RESYNC_END,
        }
    }

    /// The event's sequence number (`None` for `Hello`, which is not sequenced).
    pub fn seq(&self) -> Option<u64> {
        match self {
            EventMsg::Hello(_) => None,
            EventMsg::Stored { seq, .. }
            | EventMsg::Removed { seq, .. }
            | EventMsg::Cleared { seq, .. }
            | EventMsg::Heartbeat { seq, .. }
            | EventMsg::ResyncBegin { seq }
            | EventMsg::ResyncEnd { seq } => Some(*seq),
        }
    }
}

fn hashes(r: &mut Reader<'_>) -> Result<HashList, CodecError> {
    let bytes = r.tail_array("hashes", HashList::ITEM_SIZE)?;
    // tail_array guarantees a multiple of 8 bytes.
    Ok(HashList::from_le_bytes(bytes).unwrap_or_default())
}

/// A frame the router sends to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerBound {
    /// Handshake accepted. `next_seq` is the sequence number the router expects next:
    /// 0 for a new epoch, or where a reconnect with the same epoch resumes.
    HelloAck { server_version: u16, next_seq: u64 },
    /// Please re-announce everything (`ResyncBegin`, `Stored`…, `ResyncEnd`). `reason`
    /// is one of [`super::resync_reason`]; unknown values must be accepted.
    Resync { reason: u8 },
    /// Fatal error ([`super::ErrorCode`] values); the router closes after sending it.
    Error { code: u16, message: String },
}

impl WorkerBound {
    /// Decodes a router → worker frame.
    pub fn decode(frame: &Frame) -> Result<WorkerBound, CodecError> {
        let mut r = Reader::new(frame);
        let msg = match frame.kind {
            WB_HELLO_ACK => WorkerBound::HelloAck {
                server_version: r.u16("server_version")?,
                next_seq: r.u64("next_seq")?,
            },
            WB_RESYNC => WorkerBound::Resync {
                reason: r.u8("reason")?,
            },
            WB_ERROR => WorkerBound::Error {
                code: r.u16("code")?,
                message: r.string("message")?,
            },
            k => return Err(CodecError::UnknownKind(k)),
        };
        r.finish()?;
        Ok(msg)
    }

    /// Appends the complete frame. Never fails: an `Error` message longer than 65535
    /// bytes is cut at a character boundary.
    pub fn encode(&self, out: &mut BytesMut) {
        // Every field is fixed-size or truncated, so the writer cannot fail.
        let _ = match self {
            WorkerBound::HelloAck {
                server_version,
                next_seq,
            } => encode_frame(out, WB_HELLO_ACK, |w| {
                w.u16(*server_version);
                w.u64(*next_seq);
                Ok(())
            }),
            WorkerBound::Resync { reason } => encode_frame(out, WB_RESYNC, |w| {
                w.u8(*reason);
                Ok(())
            }),
            WorkerBound::Error { code, message } => encode_frame(out, WB_ERROR, |w| {
                w.u16(*code);
                w.string_truncated(message);
                Ok(())
            }),
        };
    }
}
