//! Framed reading over a glommio stream: bytes accumulate in a `BytesMut`, complete
//! frames are split off without copying (`FrameDecoder`), so hash arrays inside them
//! are read in place by the codec.
//!
//! Before its handshake a connection holds only a small reader ([`FramedReader::preauth`]:
//! a [`PREAUTH_CHUNK`] scratch and a buffer bounded by `max_hello_bytes`, whose limit
//! refuses a bigger `Hello` length prefix before its body is read); the full 64 KiB
//! buffers come with [`FramedReader::authenticated`]. Every wait for the peer goes
//! through [`read_for`], which also ends when the connection's slot is told to close.

use crate::codec::{CodecError, Frame, FrameDecoder};
use crate::service::net::conn_slot::Slot;
use bytes::BytesMut;
use futures_lite::{AsyncRead, AsyncReadExt};
use std::time::Duration;

/// Bytes read per call when the buffer is empty.
pub const READ_CHUNK: usize = 64 << 10;

/// Bytes read per call before the handshake (a `Hello` is a few hundred bytes).
pub const PREAUTH_CHUNK: usize = 1 << 10;

/// Waits until the executor next polls its rings.
///
/// glommio reads try the socket synchronously before going through io_uring, so a
/// task whose socket always has data (an unpaced publisher) never waits for I/O; and
/// while any task stays runnable glommio does not poll its rings, so other
/// connections' requests stay unread and their answers unsent until the preempt timer
/// (100 ms by default). A timer one microsecond out completes only in that poll (a
/// zero-length sleep would return at once).
pub async fn yield_to_poll() {
    glommio::timer::sleep(std::time::Duration::from_micros(1)).await;
}

pub struct FramedReader {
    buf: BytesMut,
    dec: FrameDecoder,
    /// Socket reads land here and only the bytes read are appended to `buf`:
    /// zero-filling a fresh 64 KiB region of `buf` for every read cost more than the
    /// copy (a routing request is ~600 bytes).
    scratch: Box<[u8]>,
}

impl FramedReader {
    pub fn new(max_frame: usize) -> FramedReader {
        FramedReader {
            buf: BytesMut::with_capacity(READ_CHUNK),
            dec: FrameDecoder::new(max_frame),
            scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
        }
    }

    /// A reader for a connection that has not sent its `Hello`: ~1 KiB, and frames of
    /// at most `max_hello` bytes.
    pub fn preauth(max_hello: usize) -> FramedReader {
        FramedReader {
            buf: BytesMut::new(),
            dec: FrameDecoder::new(max_hello),
            scratch: vec![0u8; PREAUTH_CHUNK].into_boxed_slice(),
        }
    }

    /// After the handshake: full-size reads and frames up to `max_frame` bytes. Bytes
    /// already buffered (frames pipelined behind the `Hello`) are kept.
    pub fn authenticated(&mut self, max_frame: usize) {
        self.dec = FrameDecoder::new(max_frame);
        self.scratch = vec![0u8; READ_CHUNK].into_boxed_slice();
        self.buf.reserve(READ_CHUNK);
    }

    /// Reads more bytes; `Ok(0)` at end of stream.
    pub async fn fill<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> std::io::Result<usize> {
        let n = s.read(&mut self.scratch).await?;
        self.buf.extend_from_slice(&self.scratch[..n]);
        Ok(n)
    }

    /// The next complete frame, if buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, CodecError> {
        self.dec.decode(&mut self.buf)
    }

    /// Bytes buffered but not yet decoded (a frame cut mid-way at close).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Short metric label of a codec error.
pub fn error_kind(e: &CodecError) -> &'static str {
    match e {
        CodecError::Oversized { .. } => "oversized_frame",
        CodecError::UnknownKind(_) => "unknown_kind",
        _ => "malformed_frame",
    }
}

/// Why a wait for the peer ended without data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// End of stream or a socket error.
    Closed,
    /// The wait outlived its deadline.
    TimedOut,
    /// The connection's slot was given to a new connection (`slots`).
    Displaced,
}

/// One read, bounded by `limit` (none: unbounded) and ended early if `slot` is told to
/// close. `Ok(n)`, `n > 0`: bytes were read.
pub async fn read_for<S: AsyncRead + Unpin>(
    rd: &mut FramedReader,
    s: &mut S,
    slot: &Slot,
    limit: Option<Duration>,
) -> Result<usize, Stop> {
    let read = async {
        match rd.fill(s).await {
            Ok(0) | Err(_) => Err(Stop::Closed),
            Ok(n) => Ok(n),
        }
    };
    let displaced = async {
        slot.closed().await;
        Err(Stop::Displaced)
    };
    let either = futures_lite::future::or(read, displaced);
    match limit {
        None => either.await,
        Some(d) => glommio::timer::timeout(d, async { Ok(either.await) })
            .await
            .unwrap_or(Err(Stop::TimedOut)),
    }
}

/// Reads the first frame of a connection within `limit`, with a [`FramedReader::preauth`]
/// reader. The error is a metric label.
pub async fn read_hello<S: AsyncRead + Unpin>(
    rd: &mut FramedReader,
    s: &mut S,
    slot: &Slot,
    limit: Duration,
) -> Result<Frame, &'static str> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match rd.next_frame() {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(error_kind(&e)),
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match read_for(rd, s, slot, Some(left)).await {
            Ok(_) => {}
            Err(Stop::Closed) => return Err("closed_before_hello"),
            Err(Stop::TimedOut) => return Err("hello_timeout"),
            Err(Stop::Displaced) => return Err("preauth_displaced"),
        }
    }
}
