//! Sans-I/O codec for kvroute's two binary TCP protocols (specified byte by byte in
//! `docs/PROTOCOL.md`).
//!
//! - **Event protocol** (worker → router, port 7400): [`EventMsg`] one way,
//!   [`WorkerBound`] the other.
//! - **Request protocol** (frontend ↔ router, port 7401): [`RequestMsg`] one way,
//!   [`ResponseMsg`] the other.
//!
//! Like quinn-proto or rustls, this module never touches a socket: the runtime reads
//! bytes into a `BytesMut`, asks [`FrameDecoder::decode`] for complete [`Frame`]s, and
//! turns each frame into a typed message with `decode`; encoders append complete frames
//! (length prefix included) to a `BytesMut` the runtime writes out.
//!
//! Guarantees:
//! - Decoding never panics and never trusts a length: every count is checked against
//!   the bytes actually present before anything is allocated, a frame longer than
//!   `max_frame` is rejected from its 4-byte header alone, and trailing bytes are an
//!   error, so every byte of an accepted frame has exactly one meaning.
//! - Block-hash and token arrays are zero-copy: [`HashList`] / [`TokenList`] are
//!   sub-slices of the frame's `Bytes`; decoding a `Stored` event allocates nothing per
//!   block.
//! - `encode` followed by `decode` gives back an equal value (round-trip tests and fuzz
//!   targets check this for every message).
//! - Every error names what was wrong: the frame kind, the field, the payload offset and
//!   the problem ([`CodecError`]).

mod error;
mod event;
mod frame;
mod request;
mod response;
mod spec;
mod wire;

#[cfg(test)]
mod tests;

pub use error::{CodecError, ErrorCode, Problem};
pub use event::{EventHello, EventMsg, WorkerBound};
pub use frame::{Frame, FrameDecoder, DEFAULT_MAX_FRAME, FRAME_HEADER_LEN};
pub use request::{LifecycleOp, Prompt, RequestMsg, Route};
pub use response::{Candidate, Decision, Fallback, ResponseMsg, Stage};
pub use wire::{HashList, TokenList};

/// Protocol version spoken by this codec (both protocols). A `Hello` with another
/// version is rejected with [`CodecError::UnsupportedVersion`]; the magic and version
/// are the first six payload bytes of `Hello` in every version, so a router can always
/// tell a client that it speaks the wrong version.
pub const PROTOCOL_VERSION: u16 = 1;

/// Magic at the start of an event-protocol `Hello` payload.
pub const EVENT_MAGIC: [u8; 4] = *b"KVRE";

/// Magic at the start of a request-protocol `Hello` payload.
pub const REQUEST_MAGIC: [u8; 4] = *b"KVRQ";

/// Longest string the wire can carry (its length is a `u16`).
pub const MAX_STRING_LEN: usize = u16::MAX as usize;

/// Frame kind bytes. The four directions use disjoint ranges so a peer connected to the
/// wrong port, or a frame sent the wrong way, is an `UnknownKind` error instead of a
/// plausible misparse.
pub mod kind {
    /// Event protocol, worker → router.
    pub const EV_HELLO: u8 = 0x01;
    pub const EV_STORED: u8 = 0x02;
    pub const EV_REMOVED: u8 = 0x03;
    pub const EV_CLEARED: u8 = 0x04;
    pub const EV_HEARTBEAT: u8 = 0x05;
    pub const EV_RESYNC_BEGIN: u8 = 0x06;
    pub const EV_RESYNC_END: u8 = 0x07;
    /// Event protocol, router → worker.
    pub const WB_HELLO_ACK: u8 = 0x41;
    pub const WB_RESYNC: u8 = 0x42;
    pub const WB_ERROR: u8 = 0x43;
    /// Request protocol, frontend → router.
    pub const RQ_HELLO: u8 = 0x81;
    pub const RQ_ROUTE: u8 = 0x82;
    pub const RQ_LIFECYCLE: u8 = 0x83;
    pub const RQ_REGISTER: u8 = 0x84;
    pub const RQ_DEREGISTER: u8 = 0x85;
    /// Request protocol, router → frontend.
    pub const RS_HELLO_ACK: u8 = 0xC1;
    pub const RS_DECISION: u8 = 0xC2;
    pub const RS_ACK: u8 = 0xC3;
    pub const RS_ERROR: u8 = 0xC4;
    /// Every router → worker kind (a worker sending one is a `protocol_violation`).
    pub const WORKER_BOUND: [u8; 3] = [WB_HELLO_ACK, WB_RESYNC, WB_ERROR];
    /// Every router → frontend kind (a frontend sending one is a `protocol_violation`).
    pub const RESPONSES: [u8; 4] = [RS_HELLO_ACK, RS_DECISION, RS_ACK, RS_ERROR];
}

/// Reasons a router gives in [`WorkerBound::Resync`]. The field stays a raw `u8` on the
/// wire and in the message: a worker must re-announce whatever the reason, so a reason
/// this version does not know is still a valid request.
pub mod resync_reason {
    /// The router saw a sequence gap (or a sequence number it did not expect).
    pub const SEQUENCE_GAP: u8 = 0;
    /// The router lost this worker's index state (restart, shard rebuild).
    pub const STATE_LOST: u8 = 1;
    /// An operator asked for it.
    pub const ADMIN: u8 = 2;
}
