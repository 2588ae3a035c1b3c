//! Wire primitives shared by every message: a bounds-checked payload [`Reader`], a
//! frame [`Writer`], and the zero-copy little-endian arrays [`HashList`] / [`TokenList`].
//!
//! The reader is the only place that indexes payload bytes, so the "never panic, never
//! trust a length" guarantee is proved here once: every read checks the remaining bytes
//! first and reports the field name and offset when they are missing.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use super::{CodecError, Frame, Problem, MAX_STRING_LEN};

/// Cursor over one frame's payload.
pub(crate) struct Reader<'a> {
    payload: &'a Bytes,
    pos: usize,
    kind: u8,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(frame: &'a Frame) -> Reader<'a> {
        Reader {
            payload: &frame.payload,
            pos: 0,
            kind: frame.kind,
        }
    }

    /// Payload bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.payload.len() - self.pos
    }

    /// The next byte, not consumed.
    pub(crate) fn peek_u8(&self) -> Option<u8> {
        self.payload.get(self.pos).copied()
    }

    /// A `Malformed` error at `offset`.
    pub(crate) fn error_at(&self, offset: usize, field: &'static str, p: Problem) -> CodecError {
        CodecError::Malformed {
            kind: self.kind,
            offset,
            field,
            problem: p,
        }
    }

    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], CodecError> {
        let have = self.remaining();
        if have < n {
            return Err(self.error_at(self.pos, field, Problem::Truncated { need: n, have }));
        }
        let s = &self.payload[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], CodecError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(field, N)?);
        Ok(a)
    }

    pub(crate) fn bytes4(&mut self, field: &'static str) -> Result<[u8; 4], CodecError> {
        self.array(field)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, CodecError> {
        Ok(self.array::<1>(field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, CodecError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// IEEE-754 binary64, little-endian; every bit pattern (NaN included) is accepted
    /// and preserved.
    pub(crate) fn f64(&mut self, field: &'static str) -> Result<f64, CodecError> {
        Ok(f64::from_bits(self.u64(field)?))
    }

    /// A `u8` mapped through `parse`; values it rejects are `InvalidValue`.
    pub(crate) fn enum_u8<T>(
        &mut self,
        field: &'static str,
        parse: impl FnOnce(u8) -> Option<T>,
    ) -> Result<T, CodecError> {
        let at = self.pos;
        let v = self.u8(field)?;
        parse(v).ok_or_else(|| self.error_at(at, field, Problem::InvalidValue(v.into())))
    }

    /// A boolean byte: exactly 0 or 1.
    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, CodecError> {
        self.enum_u8(field, |v| match v {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        })
    }

    /// `Option<T>`: a presence byte (0 = absent, 1 = present) followed, if present, by
    /// the value read with `read`.
    pub(crate) fn opt<T>(
        &mut self,
        field: &'static str,
        read: impl FnOnce(&mut Self) -> Result<T, CodecError>,
    ) -> Result<Option<T>, CodecError> {
        if self.bool(field)? {
            read(self).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `u16` byte length + UTF-8 bytes.
    pub(crate) fn string(&mut self, field: &'static str) -> Result<String, CodecError> {
        let len = self.u16(field)? as usize;
        let at = self.pos;
        let raw = self.take(field, len)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.error_at(
                at,
                field,
                Problem::InvalidUtf8 {
                    valid_up_to: e.valid_up_to(),
                },
            )),
        }
    }

    /// `u16` count + that many strings.
    pub(crate) fn string_list(&mut self, field: &'static str) -> Result<Vec<String>, CodecError> {
        let count = self.u16(field)? as usize;
        // Each string takes at least its 2-byte length, so a count the payload cannot
        // hold fails below; don't let it size the allocation.
        let mut v = Vec::with_capacity(count.min(self.remaining() / 2));
        for _ in 0..count {
            v.push(self.string(field)?);
        }
        Ok(v)
    }

    /// `u32` count + `count × item_size` bytes that must be exactly the rest of the
    /// payload; returns them as a zero-copy slice of the frame.
    pub(crate) fn tail_array(
        &mut self,
        field: &'static str,
        item_size: usize,
    ) -> Result<Bytes, CodecError> {
        let at = self.pos;
        let count = self.u32(field)? as u64;
        let remaining = self.remaining();
        if count.checked_mul(item_size as u64) != Some(remaining as u64) {
            return Err(self.error_at(
                at,
                field,
                Problem::CountMismatch {
                    count,
                    item_size,
                    remaining,
                },
            ));
        }
        let b = self.payload.slice(self.pos..);
        self.pos = self.payload.len();
        Ok(b)
    }

    /// Ends the message: every payload byte must have been consumed.
    pub(crate) fn finish(self) -> Result<(), CodecError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(self.error_at(self.pos, "end of message", Problem::TrailingBytes(n))),
        }
    }
}

/// Appends one frame to a `BytesMut`; the length prefix is patched in by
/// [`Writer::finish`]. On error the caller truncates `out` back to [`Writer::start`].
pub(crate) struct Writer<'a> {
    out: &'a mut BytesMut,
    start: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn begin(out: &'a mut BytesMut, kind: u8) -> Writer<'a> {
        let start = out.len();
        out.put_u32_le(0);
        out.put_u8(kind);
        Writer { out, start }
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.out.put_slice(b);
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.out.put_u8(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.out.put_u16_le(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.out.put_u32_le(v);
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.out.put_u64_le(v);
    }
    pub(crate) fn f64(&mut self, v: f64) {
        self.out.put_u64_le(v.to_bits());
    }
    pub(crate) fn bool(&mut self, v: bool) {
        self.out.put_u8(v as u8);
    }

    /// Presence byte, then the value via `write` if present.
    pub(crate) fn opt<T>(
        &mut self,
        v: Option<T>,
        write: impl FnOnce(&mut Self, T) -> Result<(), CodecError>,
    ) -> Result<(), CodecError> {
        match v {
            None => {
                self.u8(0);
                Ok(())
            }
            Some(x) => {
                self.u8(1);
                write(self, x)
            }
        }
    }

    pub(crate) fn string(&mut self, field: &'static str, s: &str) -> Result<(), CodecError> {
        let len = fit(field, s.len(), MAX_STRING_LEN)?;
        self.u16(len as u16);
        self.bytes(s.as_bytes());
        Ok(())
    }

    /// Like [`Writer::string`] but cuts `s` at a character boundary to fit; for
    /// human-readable error messages, where a shortened text beats no frame at all.
    pub(crate) fn string_truncated(&mut self, s: &str) {
        let mut end = s.len().min(MAX_STRING_LEN);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.bytes(&s.as_bytes()[..end]);
    }

    pub(crate) fn string_list(
        &mut self,
        field: &'static str,
        list: &[String],
    ) -> Result<(), CodecError> {
        self.count16(field, list.len())?;
        list.iter().try_for_each(|s| self.string(field, s))
    }

    /// A `u16` item count.
    pub(crate) fn count16(&mut self, field: &'static str, n: usize) -> Result<(), CodecError> {
        self.u16(fit(field, n, u16::MAX as usize)? as u16);
        Ok(())
    }

    /// `u32` count + raw little-endian items (`bytes.len()` must be a multiple of
    /// `item_size`).
    pub(crate) fn raw_array(
        &mut self,
        field: &'static str,
        item_size: usize,
        bytes: &[u8],
    ) -> Result<(), CodecError> {
        let count = bytes.len() / item_size;
        self.u32(fit(field, count, u32::MAX as usize)? as u32);
        self.bytes(bytes);
        Ok(())
    }

    pub(crate) fn u64_array(&mut self, field: &'static str, v: &[u64]) -> Result<(), CodecError> {
        self.u32(fit(field, v.len(), u32::MAX as usize)? as u32);
        self.out.reserve(v.len() * 8);
        v.iter().for_each(|&x| self.out.put_u64_le(x));
        Ok(())
    }

    /// Where this frame starts in `out`.
    pub(crate) fn start(&self) -> usize {
        self.start
    }

    /// Patches the length prefix. Fails if the frame does not fit a `u32` length.
    pub(crate) fn finish(self) -> Result<(), CodecError> {
        let len = self.out.len() - self.start - 4;
        let len = fit("frame length", len, u32::MAX as usize)? as u32;
        self.out[self.start..self.start + 4].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }
}

fn fit(field: &'static str, len: usize, max: usize) -> Result<usize, CodecError> {
    if len <= max {
        Ok(len)
    } else {
        Err(CodecError::TooLarge { field, len, max })
    }
}

/// Runs `write` to append one frame to `out`; on error, `out` is restored to its length
/// before the call, so a failed encode never leaves half a frame behind.
pub(crate) fn encode_frame(
    out: &mut BytesMut,
    kind: u8,
    write: impl FnOnce(&mut Writer<'_>) -> Result<(), CodecError>,
) -> Result<(), CodecError> {
    let mut w = Writer::begin(out, kind);
    let start = w.start();
    let res = write(&mut w).and_then(|()| w.finish());
    if res.is_err() {
        out.truncate(start);
    }
    res
}

macro_rules! le_list {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $width:expr) => {
        $(#[$doc])*
        #[derive(Clone, Default, PartialEq, Eq, Hash)]
        pub struct $name {
            /// Little-endian items; length is a multiple of the item width.
            bytes: Bytes,
        }

        impl $name {
            /// Bytes per item on the wire.
            pub const ITEM_SIZE: usize = $width;

            /// Copies `items` into a new list (clients and tests; decoding never copies).
            pub fn from_slice(items: &[$ty]) -> Self {
                let mut b = BytesMut::with_capacity(items.len() * $width);
                items.iter().for_each(|x| b.put_slice(&x.to_le_bytes()));
                $name { bytes: b.freeze() }
            }

            /// Wraps little-endian item bytes; `None` unless the length is a multiple of
            /// the item width.
            pub fn from_le_bytes(bytes: Bytes) -> Option<Self> {
                (bytes.len() % $width == 0).then_some($name { bytes })
            }

            /// Number of items.
            pub fn len(&self) -> usize {
                self.bytes.len() / $width
            }

            pub fn is_empty(&self) -> bool {
                self.bytes.is_empty()
            }

            /// Item `i`, or `None` past the end.
            pub fn get(&self, i: usize) -> Option<$ty> {
                let s = self.bytes.get(i.checked_mul($width)?..)?.get(..$width)?;
                let mut a = [0u8; $width];
                a.copy_from_slice(s);
                Some(<$ty>::from_le_bytes(a))
            }

            /// Items in order, decoded on the fly.
            pub fn iter(&self) -> impl ExactSizeIterator<Item = $ty> + DoubleEndedIterator + '_ {
                self.bytes.chunks_exact($width).map(|c| {
                    let mut a = [0u8; $width];
                    a.copy_from_slice(c);
                    <$ty>::from_le_bytes(a)
                })
            }

            /// Consecutive sub-lists of at most `items` items each (at least one item
            /// per sub-list), sharing this list's bytes: no copy.
            pub fn chunks(&self, items: usize) -> impl Iterator<Item = Self> + '_ {
                let step = items.max(1) * $width;
                (0..self.bytes.len()).step_by(step).map(move |at| $name {
                    bytes: self.bytes.slice(at..(at + step).min(self.bytes.len())),
                })
            }

            /// Copies the items out.
            pub fn to_vec(&self) -> Vec<$ty> {
                self.iter().collect()
            }

            /// The raw little-endian bytes (shared with the frame they came from).
            pub fn as_le_bytes(&self) -> &Bytes {
                &self.bytes
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.iter()).finish()
            }
        }

        impl From<&[$ty]> for $name {
            fn from(items: &[$ty]) -> Self {
                Self::from_slice(items)
            }
        }

        impl From<Vec<$ty>> for $name {
            fn from(items: Vec<$ty>) -> Self {
                Self::from_slice(&items)
            }
        }
    };
}

le_list!(
    /// Zero-copy array of `u64` block sequence hashes: a view into the frame's payload.
    /// Decoding a message with a `HashList` allocates nothing per hash; items are read
    /// with `u64::from_le_bytes` on access (no alignment requirement).
    HashList,
    u64,
    8
);

le_list!(
    /// Zero-copy array of `u32` token ids: a view into the frame's payload.
    TokenList,
    u32,
    4
);
