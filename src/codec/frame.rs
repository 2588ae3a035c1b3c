//! Framing: `u32 LE length` · `u8 kind` · payload, where length counts the kind byte and
//! the payload (so it is ≥ 1).
//!
//! [`FrameDecoder`] splits complete frames off the front of a `BytesMut` without
//! copying, and rejects an oversized length from the header alone, so a hostile peer
//! cannot make the router buffer more than `max_frame` bytes per connection.

use bytes::{Buf, Bytes, BytesMut};

use super::CodecError;

/// Default limit on a frame's length field: 1 MiB.
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;

/// Bytes of the length prefix.
pub const FRAME_HEADER_LEN: usize = 4;

/// One complete frame: its kind byte and its payload (everything after the kind byte).
/// The payload shares the receive buffer's memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub payload: Bytes,
}

impl Frame {
    /// Builds a frame from parts (tests, tools, and code that already has a payload).
    pub fn new(kind: u8, payload: impl Into<Bytes>) -> Frame {
        Frame {
            kind,
            payload: payload.into(),
        }
    }

    /// Splits one complete encoded frame (length prefix included), as produced by the
    /// encoders, into a `Frame`. `None` unless `bytes` is exactly one well-formed frame.
    /// Meant for tools and tests; streams go through [`FrameDecoder`].
    pub fn from_encoded(bytes: &[u8]) -> Option<Frame> {
        let header: [u8; 4] = bytes.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
        let len = u32::from_le_bytes(header) as usize;
        if len == 0 || bytes.len() != FRAME_HEADER_LEN + len {
            return None;
        }
        Some(Frame {
            kind: bytes[FRAME_HEADER_LEN],
            payload: Bytes::copy_from_slice(&bytes[FRAME_HEADER_LEN + 1..]),
        })
    }
}

/// Incremental frame splitter. Holds no buffered data itself: the caller owns the
/// `BytesMut` and appends whatever it reads from the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameDecoder {
    /// Largest accepted value of the length field (kind byte + payload).
    pub max_frame: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder {
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

impl FrameDecoder {
    /// A decoder accepting frames whose length field is at most `max_frame`.
    pub fn new(max_frame: usize) -> FrameDecoder {
        FrameDecoder { max_frame }
    }

    /// Takes the next complete frame off the front of `buf`.
    ///
    /// - `Ok(Some(frame))`: the frame's bytes have been removed from `buf` (no copy).
    /// - `Ok(None)`: `buf` holds only part of a frame; read more and call again. If the
    ///   header is complete, `buf` has been given capacity for the rest of the frame.
    /// - `Err(Oversized | EmptyFrame)`: the stream cannot be framed any more; nothing is
    ///   consumed, so calling again returns the same error. Close the connection.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        let Some(header) = buf.get(..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 {
            return Err(CodecError::EmptyFrame);
        }
        if len > self.max_frame {
            return Err(CodecError::Oversized {
                len,
                max: self.max_frame,
            });
        }
        let total = FRAME_HEADER_LEN + len;
        if buf.len() < total {
            // The length is within limits, so reserving for it is bounded.
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        buf.advance(FRAME_HEADER_LEN);
        let mut body = buf.split_to(len).freeze();
        let kind = body[0];
        body.advance(1);
        Ok(Some(Frame {
            kind,
            payload: body,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn raw_frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((payload.len() + 1) as u32).to_le_bytes());
        v.push(kind);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn splits_back_to_back_frames_and_waits_for_partial() {
        let mut stream = raw_frame(7, b"abc");
        stream.extend(raw_frame(9, b""));
        stream.extend(raw_frame(1, b"xy")[..3].iter());
        let mut buf = BytesMut::from(&stream[..]);
        let mut d = FrameDecoder::default();
        assert_eq!(
            d.decode(&mut buf).unwrap(),
            Some(Frame::new(7, &b"abc"[..]))
        );
        assert_eq!(d.decode(&mut buf).unwrap(), Some(Frame::new(9, &b""[..])));
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        assert_eq!(buf.len(), 3, "a partial header is left untouched");
        buf.put_slice(&raw_frame(1, b"xy")[3..]);
        assert_eq!(d.decode(&mut buf).unwrap(), Some(Frame::new(1, &b"xy"[..])));
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_is_rejected_from_the_header_alone() {
        let mut d = FrameDecoder::new(16);
        let mut buf = BytesMut::new();
        buf.put_u32_le(17);
        assert_eq!(
            d.decode(&mut buf),
            Err(CodecError::Oversized { len: 17, max: 16 })
        );
        // Sticky: nothing consumed, same answer again.
        assert!(matches!(
            d.decode(&mut buf),
            Err(CodecError::Oversized { .. })
        ));
        let mut ok = BytesMut::new();
        ok.put_u32_le(16);
        assert_eq!(d.decode(&mut ok), Ok(None), "exactly max_frame is allowed");
        assert!(ok.capacity() >= 20, "room reserved for the announced body");
        let mut huge = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
        assert!(matches!(
            FrameDecoder::default().decode(&mut huge),
            Err(CodecError::Oversized { .. })
        ));
        assert!(
            huge.capacity() < 1 << 20,
            "nothing reserved for a rejected body"
        );
    }

    #[test]
    fn zero_length_is_an_error() {
        let mut buf = BytesMut::from(&[0u8, 0, 0, 0, 5][..]);
        assert_eq!(
            FrameDecoder::default().decode(&mut buf),
            Err(CodecError::EmptyFrame)
        );
    }

    #[test]
    fn from_encoded_requires_exactly_one_frame() {
        let f = raw_frame(3, b"hi");
        assert_eq!(Frame::from_encoded(&f), Some(Frame::new(3, &b"hi"[..])));
        assert_eq!(Frame::from_encoded(&f[..f.len() - 1]), None);
        let mut two = f.clone();
        two.push(0);
        assert_eq!(Frame::from_encoded(&two), None);
        assert_eq!(Frame::from_encoded(&[0, 0, 0, 0]), None);
    }
}
