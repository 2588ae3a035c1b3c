//! Framed reading over a glommio stream: bytes accumulate in a `BytesMut`, complete
//! frames are split off without copying (`FrameDecoder`), so hash arrays inside them
//! are read in place by the codec.

use crate::codec::{CodecError, Frame, FrameDecoder};
use bytes::BytesMut;
use futures_lite::{AsyncRead, AsyncReadExt};

/// Bytes read per call when the buffer is empty.
pub const READ_CHUNK: usize = 64 << 10;

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

/// Time a new connection has to send its first frame.
pub const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads the first frame of a connection within [`HELLO_TIMEOUT`]. The error is a
/// metric label.
pub async fn read_hello<S: AsyncRead + Unpin>(
    rd: &mut FramedReader,
    s: &mut S,
) -> Result<Frame, &'static str> {
    let r = glommio::timer::timeout(HELLO_TIMEOUT, async {
        loop {
            match rd.next_frame() {
                Ok(Some(f)) => return Ok(Ok(f)),
                Ok(None) => {}
                Err(e) => return Ok(Err(error_kind(&e))),
            }
            match rd.fill(s).await {
                Ok(0) | Err(_) => return Ok(Err("closed_before_hello")),
                Ok(_) => {}
            }
        }
    })
    .await;
    match r {
        Ok(inner) => inner,
        Err(_) => Err("hello_timeout"),
    }
}
