//! Codec errors. Each one says what was wrong and where, so a log line or an `Error`
//! frame sent back to a peer is enough to find the bad byte.
//!
//! Which errors leave the stream usable: [`CodecError::Oversized`] and
//! [`CodecError::EmptyFrame`] come from the framing layer and mean the byte stream can
//! no longer be split into frames (the caller must close the connection). Every other
//! error concerns one complete frame that has already been removed from the buffer, so
//! the next frame can still be decoded (the protocols nevertheless tell the router to
//! answer with an `Error` frame and close, see docs/PROTOCOL.md §Errors).

use std::fmt;

/// Everything that can go wrong turning bytes into messages, or (for
/// [`CodecError::TooLarge`]) a message into bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The length prefix announces more than the decoder's `max_frame`. Detected from
    /// the 4-byte header alone, before any of the body is buffered.
    #[error("frame length {len} exceeds the limit of {max} bytes")]
    Oversized { len: usize, max: usize },
    /// The length prefix is 0; every frame has at least its kind byte.
    #[error("frame length 0: a frame must contain at least its kind byte")]
    EmptyFrame,
    /// The kind byte is not a message of the protocol/direction being decoded.
    #[error("unknown frame kind 0x{0:02x}")]
    UnknownKind(u8),
    /// The payload does not follow the layout of its kind.
    #[error("malformed frame (kind 0x{kind:02x}) at payload offset {offset}, field `{field}`: {problem}")]
    Malformed {
        /// Kind byte of the frame.
        kind: u8,
        /// Offset inside the payload (0 = first byte after the kind byte).
        offset: usize,
        /// Name of the field being read, as in docs/PROTOCOL.md.
        field: &'static str,
        /// What was wrong.
        problem: Problem,
    },
    /// A `Hello` with the right magic but a protocol version this codec does not speak.
    #[error("unsupported protocol version {got} (this side speaks version {supported})")]
    UnsupportedVersion { got: u16, supported: u16 },
    /// Encoding only: a string, list or frame does not fit its length field.
    #[error("cannot encode field `{field}`: length {len} exceeds the wire limit of {max}")]
    TooLarge {
        field: &'static str,
        len: usize,
        max: usize,
    },
}

impl CodecError {
    /// The docs/PROTOCOL.md §5 code a receiver answers this error with (one mapping for
    /// both ports): `unsupported_version` for a `Hello` of another version;
    /// `protocol_violation` for a frame the receiver itself sends (`own_kinds`: the
    /// peer sent it the wrong way); `bad_request` for everything else (framing, unknown
    /// kind, bad magic, a truncated or invalid field, trailing bytes).
    pub fn error_code(&self, own_kinds: &[u8]) -> ErrorCode {
        match self {
            CodecError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            CodecError::UnknownKind(k) if own_kinds.contains(k) => ErrorCode::ProtocolViolation,
            CodecError::Oversized { .. }
            | CodecError::EmptyFrame
            | CodecError::UnknownKind(_)
            | CodecError::Malformed { .. }
            | CodecError::TooLarge { .. } => ErrorCode::BadRequest,
        }
    }
}

/// The precise problem behind [`CodecError::Malformed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The payload ends inside the field: `need` bytes were required, `have` remained.
    Truncated { need: usize, have: usize },
    /// A string is not valid UTF-8; `valid_up_to` bytes of it are.
    InvalidUtf8 { valid_up_to: usize },
    /// A value outside the field's domain (unknown enum discriminant, flag not 0/1).
    InvalidValue(u64),
    /// Bytes remain after the last field of the message.
    TrailingBytes(usize),
    /// An array's count does not match the bytes left in the payload exactly.
    CountMismatch {
        count: u64,
        item_size: usize,
        remaining: usize,
    },
    /// A `Hello` does not start with the protocol's magic.
    BadMagic([u8; 4]),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Truncated { need, have } => {
                write!(f, "truncated: needs {need} bytes but only {have} remain")
            }
            Problem::InvalidUtf8 { valid_up_to } => {
                write!(f, "invalid UTF-8 after {valid_up_to} valid bytes")
            }
            Problem::InvalidValue(v) => write!(f, "invalid value {v}"),
            Problem::TrailingBytes(n) => write!(f, "{n} unexpected trailing bytes"),
            Problem::CountMismatch {
                count,
                item_size,
                remaining,
            } => write!(
                f,
                "count {count} × {item_size} bytes does not match the {remaining} bytes remaining"
            ),
            Problem::BadMagic(m) => write!(f, "bad magic {:02x?}", m),
        }
    }
}

/// Error codes of `Error` frames in both protocols, with the HTTP status the JSON API
/// uses for the same condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// Malformed frame or invalid field value.
    BadRequest = 1,
    UnknownWorker = 2,
    UnknownRequest = 3,
    /// A `Route` reused the `request_id` of an active request.
    DuplicateRequest = 4,
    /// Filters left no worker of the model.
    NoEligibleWorker = 5,
    /// Every eligible worker is over `busy_threshold`.
    AllBusy = 6,
    /// The router sheds load (HTTP 429).
    Overloaded = 7,
    /// Missing or wrong auth token.
    Unauthorized = 8,
    Internal = 9,
    /// `Hello` carried a protocol version the router does not speak.
    UnsupportedVersion = 10,
    /// A valid frame at the wrong time (event before `Hello`, second `Hello`, …).
    ProtocolViolation = 11,
    /// The worker id already has a live event connection.
    Conflict = 12,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::BadRequest,
        ErrorCode::UnknownWorker,
        ErrorCode::UnknownRequest,
        ErrorCode::DuplicateRequest,
        ErrorCode::NoEligibleWorker,
        ErrorCode::AllBusy,
        ErrorCode::Overloaded,
        ErrorCode::Unauthorized,
        ErrorCode::Internal,
        ErrorCode::UnsupportedVersion,
        ErrorCode::ProtocolViolation,
        ErrorCode::Conflict,
    ];

    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// `None` for codes this version does not know.
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_u16() == v)
    }

    /// snake_case name, as in JSON error bodies and metrics.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UnknownWorker => "unknown_worker",
            ErrorCode::UnknownRequest => "unknown_request",
            ErrorCode::DuplicateRequest => "duplicate_request",
            ErrorCode::NoEligibleWorker => "no_eligible_worker",
            ErrorCode::AllBusy => "all_busy",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Internal => "internal",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::ProtocolViolation => "protocol_violation",
            ErrorCode::Conflict => "conflict",
        }
    }

    /// HTTP status of the same condition in the JSON API.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest | ErrorCode::ProtocolViolation => 400,
            ErrorCode::UnknownWorker | ErrorCode::UnknownRequest => 404,
            ErrorCode::DuplicateRequest | ErrorCode::Conflict => 409,
            ErrorCode::NoEligibleWorker | ErrorCode::AllBusy => 503,
            ErrorCode::Overloaded => 429,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Internal => 500,
            ErrorCode::UnsupportedVersion => 505,
        }
    }
}
