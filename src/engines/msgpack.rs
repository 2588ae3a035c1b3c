//! A bounded, allocation-free msgpack reader over a byte slice (markers from `rmp`).
//!
//! Used by [`vllm`](super::vllm) to decode `KVEventBatch` payloads straight into typed
//! values instead of building an `rmpv::Value` tree (whose nodes cost ~32 bytes per
//! input byte: a 50 MB message of nils took RSS to 2.3 GB).
//!
//! Guarantees: never panics; never allocates; an array or map header whose count
//! exceeds the bytes that remain (every element takes at least one byte) is an error,
//! so a caller may reserve `count` elements after [`Rd::head`]; nesting is bounded by
//! the depth given to [`Rd::skip`].

use rmp::Marker;

/// Why the bytes are not (bounded) msgpack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bad(pub &'static str);

/// The head of one value: scalars with their payload, containers with their count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Head<'a> {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext,
}

impl Head<'_> {
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Head::Uint(u) => Some(u as f64),
            Head::Int(i) => Some(i as f64),
            Head::Float(f) => Some(f),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Head::Uint(u) => Some(u),
            Head::Int(i) => u64::try_from(i).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Head::Uint(u) => i64::try_from(u).ok(),
            Head::Int(i) => Some(i),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Head::Str(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }
}

/// A cursor over msgpack bytes.
#[derive(Clone, Copy, Debug)]
pub struct Rd<'a> {
    pub b: &'a [u8],
}

impl<'a> Rd<'a> {
    pub fn new(b: &'a [u8]) -> Rd<'a> {
        Rd { b }
    }

    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if self.b.len() < n {
            return Err(Bad("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn be(&mut self, n: usize) -> Result<u64, Bad> {
        Ok(self.take(n)?.iter().fold(0u64, |a, &x| (a << 8) | x as u64))
    }

    fn bytes(&mut self, len_bytes: usize) -> Result<&'a [u8], Bad> {
        let n = self.be(len_bytes)? as usize;
        self.take(n)
    }

    fn count(&mut self, n: u64, per: usize) -> Result<usize, Bad> {
        let n = usize::try_from(n).map_err(|_| Bad("count overflows"))?;
        if n.saturating_mul(per) > self.b.len() {
            return Err(Bad("container count larger than the remaining bytes"));
        }
        Ok(n)
    }

    /// Reads one value's head (a container's elements follow it).
    pub fn head(&mut self) -> Result<Head<'a>, Bad> {
        let m = Marker::from_u8(self.take(1)?[0]);
        Ok(match m {
            Marker::Null => Head::Nil,
            Marker::True => Head::Bool(true),
            Marker::False => Head::Bool(false),
            Marker::FixPos(v) => Head::Uint(v as u64),
            Marker::FixNeg(v) => Head::Int(v as i64),
            Marker::U8 => Head::Uint(self.be(1)?),
            Marker::U16 => Head::Uint(self.be(2)?),
            Marker::U32 => Head::Uint(self.be(4)?),
            Marker::U64 => Head::Uint(self.be(8)?),
            Marker::I8 => Head::Int(self.be(1)? as u8 as i8 as i64),
            Marker::I16 => Head::Int(self.be(2)? as u16 as i16 as i64),
            Marker::I32 => Head::Int(self.be(4)? as u32 as i32 as i64),
            Marker::I64 => Head::Int(self.be(8)? as i64),
            Marker::F32 => Head::Float(f32::from_bits(self.be(4)? as u32) as f64),
            Marker::F64 => Head::Float(f64::from_bits(self.be(8)?)),
            Marker::FixStr(n) => Head::Str(self.take(n as usize)?),
            Marker::Str8 => Head::Str(self.bytes(1)?),
            Marker::Str16 => Head::Str(self.bytes(2)?),
            Marker::Str32 => Head::Str(self.bytes(4)?),
            Marker::Bin8 => Head::Bin(self.bytes(1)?),
            Marker::Bin16 => Head::Bin(self.bytes(2)?),
            Marker::Bin32 => Head::Bin(self.bytes(4)?),
            Marker::FixArray(n) => Head::Array(self.count(n as u64, 1)?),
            Marker::Array16 => {
                let n = self.be(2)?;
                Head::Array(self.count(n, 1)?)
            }
            Marker::Array32 => {
                let n = self.be(4)?;
                Head::Array(self.count(n, 1)?)
            }
            Marker::FixMap(n) => Head::Map(self.count(n as u64, 2)?),
            Marker::Map16 => {
                let n = self.be(2)?;
                Head::Map(self.count(n, 2)?)
            }
            Marker::Map32 => {
                let n = self.be(4)?;
                Head::Map(self.count(n, 2)?)
            }
            Marker::FixExt1 => self.ext(1)?,
            Marker::FixExt2 => self.ext(2)?,
            Marker::FixExt4 => self.ext(4)?,
            Marker::FixExt8 => self.ext(8)?,
            Marker::FixExt16 => self.ext(16)?,
            Marker::Ext8 => {
                let n = self.be(1)? as usize;
                self.ext(n)?
            }
            Marker::Ext16 => {
                let n = self.be(2)? as usize;
                self.ext(n)?
            }
            Marker::Ext32 => {
                let n = self.be(4)? as usize;
                self.ext(n)?
            }
            Marker::Reserved => return Err(Bad("reserved marker 0xc1")),
        })
    }

    fn ext(&mut self, n: usize) -> Result<Head<'a>, Bad> {
        self.take(1 + n)?;
        Ok(Head::Ext)
    }

    /// Skips one complete value, nested at most `max_depth` deep.
    ///
    /// A container's fixed-width scalar elements (the bulk of an event: token ids and
    /// block hashes) are stepped over by their width from [`SCALAR_WIDTH`] without
    /// decoding a [`Head`]; any other element goes through `skip` itself. Same result,
    /// same errors as skipping every element by its head.
    pub fn skip(&mut self, max_depth: usize) -> Result<(), Bad> {
        let n = match self.head()? {
            Head::Array(n) => n,
            Head::Map(n) => n * 2,
            _ => return Ok(()),
        };
        if max_depth == 0 {
            return Err(Bad("nested too deeply"));
        }
        for _ in 0..n {
            let w = self.b.first().map_or(0, |&m| SCALAR_WIDTH[usize::from(m)]);
            if w == 0 {
                self.skip(max_depth - 1)?;
            } else if let Some(rest) = self.b.get(usize::from(w)..) {
                self.b = rest;
            } else {
                return Err(Bad("truncated"));
            }
        }
        Ok(())
    }

    /// The next value as a `u32`, if it is an unsigned integer that fits; `None` for
    /// anything else (the cursor then stays where it was). Positive fixints and
    /// `uint8`/`uint16`/`uint32` (what encoders write for token ids) are read directly.
    #[inline]
    pub fn u32(&mut self) -> Option<u32> {
        let (&m, rest) = self.b.split_first()?;
        let (v, used) = match m {
            0x00..=0x7f => (u32::from(m), 0),
            0xcc => (u32::from(*rest.first()?), 1),
            0xcd => (
                u32::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?)),
                2,
            ),
            0xce => (u32::from_be_bytes(rest.get(..4)?.try_into().ok()?), 4),
            _ => {
                let mut probe = *self;
                let v = probe
                    .head()
                    .ok()?
                    .as_u64()
                    .and_then(|v| u32::try_from(v).ok())?;
                *self = probe;
                return Some(v);
            }
        };
        self.b = rest.get(used..)?;
        Some(v)
    }

    /// The bytes of the next complete value (the cursor moves past it).
    pub fn span(&mut self, max_depth: usize) -> Result<&'a [u8], Bad> {
        let start = self.b;
        self.skip(max_depth)?;
        Ok(&start[..start.len() - self.b.len()])
    }
}

/// Total width in bytes (marker included) of each fixed-width scalar by its marker
/// byte, 0 for markers of containers, strings, binaries, extensions and the reserved
/// 0xc1: nil, booleans, fixints, `(u)int8..64`, `float32/64`.
const SCALAR_WIDTH: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = match i {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 1,
            0xcc | 0xd0 => 2,
            0xcd | 0xd1 => 3,
            0xce | 0xd2 | 0xca => 5,
            0xcf | 0xd3 | 0xcb => 9,
            _ => 0,
        };
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_counts_and_depth() {
        // [1, -1, "ab", nil, {1: 2.5}]
        let b = [
            0x95, 0x01, 0xff, 0xa2, b'a', b'b', 0xc0, 0x81, 0x01, 0xcb, 0x40, 0x04, 0, 0, 0, 0, 0,
            0,
        ];
        let mut r = Rd::new(&b);
        assert_eq!(r.head(), Ok(Head::Array(5)));
        assert_eq!(r.head(), Ok(Head::Uint(1)));
        assert_eq!(r.head(), Ok(Head::Int(-1)));
        assert_eq!(r.head().unwrap().as_str(), Some("ab"));
        assert_eq!(r.head(), Ok(Head::Nil));
        assert_eq!(r.span(4).unwrap().len(), 11);
        assert!(r.is_empty());
        // An array32 claiming 2^32-1 elements in 5 bytes.
        assert!(Rd::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]).head().is_err());
        // Deep nesting.
        let deep = [0x91u8; 40];
        assert!(Rd::new(&deep).skip(32).is_err());
        assert!(Rd::new(&[0xc1]).head().is_err());
    }

    /// `skip` as it was before the scalar fast path: every element by its head.
    fn skip_by_heads(r: &mut Rd<'_>, max_depth: usize) -> Result<(), Bad> {
        let n = match r.head()? {
            Head::Array(n) => n,
            Head::Map(n) => n * 2,
            _ => return Ok(()),
        };
        if max_depth == 0 {
            return Err(Bad("nested too deeply"));
        }
        for _ in 0..n {
            skip_by_heads(r, max_depth - 1)?;
        }
        Ok(())
    }

    #[test]
    fn scalar_widths_match_the_heads() {
        for m in 0..=255u8 {
            let w = usize::from(SCALAR_WIDTH[usize::from(m)]);
            let mut b = vec![m];
            b.extend_from_slice(&[0u8; 20]);
            let mut r = Rd::new(&b);
            let h = r.head();
            let scalar = matches!(
                h,
                Ok(Head::Nil | Head::Bool(_) | Head::Uint(_) | Head::Int(_) | Head::Float(_))
            );
            if scalar {
                assert_eq!(w, b.len() - r.b.len(), "marker {m:#x}");
            } else {
                assert_eq!(w, 0, "marker {m:#x}");
            }
        }
    }

    #[test]
    fn u32_reads_what_head_reads() {
        let cases: &[&[u8]] = &[
            &[0x05],
            &[0x7f],
            &[0xcc, 0xff],
            &[0xcd, 0x01, 0x02],
            &[0xce, 0xff, 0xff, 0xff, 0xff],
            &[0xcf, 0, 0, 0, 0, 0, 0, 0, 7],
            &[0xcf, 0, 0, 0, 1, 0, 0, 0, 0],
            &[0xd0, 0x05],
            &[0xff],
            &[0xcd, 0x01],
            &[0xce],
            &[0xa1, b'x'],
            &[],
        ];
        for b in cases {
            let mut fast = Rd::new(b);
            let mut slow = Rd::new(b);
            let want = slow
                .head()
                .ok()
                .and_then(|h| h.as_u64())
                .and_then(|v| u32::try_from(v).ok());
            let got = fast.u32();
            assert_eq!(got, want, "{b:x?}");
            if got.is_some() {
                assert_eq!(fast.b.len(), slow.b.len(), "{b:x?}");
            } else {
                assert_eq!(fast.b.len(), b.len(), "{b:x?}: the cursor moved on a miss");
            }
        }
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// The fast path changes nothing: same result, same error, same position, on
        /// arbitrary bytes and on arrays of scalars with a container or a cut inside.
        #[test]
        fn skip_equals_skipping_by_heads(
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            ints in proptest::collection::vec(
                // every width: fixint, uint8, uint16, uint32
                (proptest::prelude::any::<u32>(), 0u32..32).prop_map(|(v, s)| v >> s),
                0..40,
            ),
            cut in 0usize..300,
            depth in 0usize..4,
        ) {
            let mut enc = Vec::new();
            rmp::encode::write_array_len(&mut enc, ints.len() as u32 + 1).unwrap();
            for &i in &ints {
                rmp::encode::write_uint(&mut enc, u64::from(i)).unwrap();
            }
            rmp::encode::write_array_len(&mut enc, 1).unwrap();
            rmp::encode::write_sint(&mut enc, -3).unwrap();
            let cut = cut.min(enc.len());
            for b in [&raw[..], &enc[..], &enc[..cut]] {
                let (mut fast, mut slow) = (Rd::new(b), Rd::new(b));
                let (f, s) = (fast.skip(depth), skip_by_heads(&mut slow, depth));
                proptest::prop_assert_eq!(f, s);
                if f.is_ok() {
                    proptest::prop_assert_eq!(fast.b.len(), slow.b.len());
                }
            }
        }
    }
}
