//! A JSON list of token ids (non-negative integers of at most `u32::MAX`) read and
//! checked in one pass over its text. A prompt of token ids is most of a long
//! request's body, so this is the proxy's hottest parse: serde_json skips or reads
//! such a list at about 1.8 ns a byte, this at a fraction of that.
//!
//! Guarantee: [`read`] answers `Some(len)` only when `text` begins with a JSON array
//! whose elements are all integers without sign, fraction, exponent or leading zero,
//! each at most `u32::MAX`; `len` is the length of the array's text (through its `]`),
//! and the elements were passed to `push` in order, exactly as serde_json reads them.
//! Anything else is `None` (some elements may have been pushed): the caller takes its
//! general path, which answers for the other shapes and for broken JSON.
//! Property-tested against serde_json below.

/// JSON's whitespace.
#[inline]
pub fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\n' | b'\t' | b'\r')
}

/// The index of the first byte of `text` at or after `i` that is not JSON whitespace
/// (`text.len()` if none).
#[inline]
pub fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while i < text.len() && is_ws(text[i]) {
        i += 1;
    }
    i
}

/// Reads the list of token ids at the start of `text` (see the module's guarantee).
pub fn read(text: &[u8], mut push: impl FnMut(u32)) -> Option<usize> {
    if text.first() != Some(&b'[') {
        return None;
    }
    let mut i = skip_ws(text, 1);
    if text.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        let (id, digits) = match text.get(i..i + 8) {
            Some(w) => swar(w).or_else(|| scalar(&text[i..]))?,
            None => scalar(&text[i..])?,
        };
        if digits > 1 && text[i] == b'0' {
            return None;
        }
        push(id);
        i = skip_ws(text, i + digits);
        match text.get(i) {
            Some(b',') => i = skip_ws(text, i + 1),
            Some(b']') => return Some(i + 1),
            _ => return None,
        }
    }
}

/// The number of 1 to 7 digits at the start of the 8 bytes `w`, and its length, with
/// no branch on the length (which varies from one id to the next, so a loop over the
/// digits mispredicts its exit about once an id). `None`: no digit first, or 8 digits
/// (the caller reads those one by one).
#[inline]
fn swar(w: &[u8]) -> Option<(u32, usize)> {
    let w = u64::from_le_bytes(w.try_into().ok()?);
    // Each byte less '0': a digit is now 0..=9. A byte below '0' borrows from the next,
    // and one above '9' may carry into it below; only bytes after the first non-digit
    // are disturbed, and only the first non-digit matters.
    let t = w.wrapping_sub(0x3030_3030_3030_3030);
    // High bit of each byte that is not a digit: 0x80 or more, or 10 or more.
    let other = (t | t.wrapping_add(0x7676_7676_7676_7676)) & 0x8080_8080_8080_8080;
    let digits = (other.trailing_zeros() / 8) as usize;
    if digits == 0 || digits == 8 {
        return None;
    }
    // The digits in the high bytes, the first the most significant, zeros before them.
    let x = (t & 0x0F0F_0F0F_0F0F_0F0F) << (8 * (8 - digits));
    let x = (x.wrapping_mul(10 * 256 + 1) >> 8) & 0x00FF_00FF_00FF_00FF;
    let x = (x.wrapping_mul(100 * 65_536 + 1) >> 16) & 0x0000_FFFF_0000_FFFF;
    let x = x.wrapping_mul(10_000 * (1 << 32) + 1) >> 32;
    Some((x as u32, digits))
}

/// The number at the start of `text`, digit by digit, and its length: `None` for no
/// digit, more than 10, or more than `u32::MAX`.
fn scalar(text: &[u8]) -> Option<(u32, usize)> {
    let mut v: u64 = 0;
    let mut i = 0;
    while let Some(&c @ b'0'..=b'9') = text.get(i) {
        if i == 10 {
            return None;
        }
        v = v * 10 + u64::from(c - b'0');
        i += 1;
    }
    if i == 0 {
        return None;
    }
    Some((u32::try_from(v).ok()?, i))
}

/// How many elements a list read by [`read`] from `text` (the list's text) can have at
/// most: one more than its commas. Counted at memory speed, to size the list's vector
/// before it is filled.
pub fn bound(text: &[u8]) -> usize {
    // Counted per 64 bytes in a byte-wide sum, which the compiler vectorizes 16 or 32
    // bytes at a time (a `usize` count per byte went 4 bytes at a time).
    let mut chunks = text.chunks_exact(64);
    let mut n = 0;
    for c in &mut chunks {
        n += usize::from(c.iter().fold(0u8, |k, &b| k + u8::from(b == b',')));
    }
    n + chunks.remainder().iter().filter(|&&b| b == b',').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ours(text: &str) -> Option<(Vec<u32>, usize)> {
        let mut v = Vec::new();
        read(text.as_bytes(), |x| v.push(x)).map(|len| (v, len))
    }

    /// serde_json's reading of the first value of `text` as a list of u32s, and the
    /// length of its text; `None` when it is not one.
    fn serde(text: &str) -> Option<(Vec<u32>, usize)> {
        let mut it = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        let v = it.next()?.ok()?;
        let len = it.byte_offset();
        let ids = v
            .as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect::<Option<Vec<u32>>>()?;
        Some((ids, len))
    }

    #[test]
    fn lists_and_refusals() {
        assert_eq!(ours("[1,2, 3 ]"), Some((vec![1, 2, 3], 9)));
        assert_eq!(ours("[ ]x"), Some((vec![], 3)));
        assert_eq!(ours("[]"), Some((vec![], 2)));
        assert_eq!(ours("[0, 4294967295]"), Some((vec![0, u32::MAX], 15)));
        assert_eq!(ours("[\n1\r,\t2]"), Some((vec![1, 2], 8)));
        for bad in [
            "[4294967296]",
            "[99999999999999999999999]",
            "[1.5]",
            "[1e2]",
            "[-1]",
            "[01]",
            "[00]",
            "[1,\"a\"]",
            "[[1]]",
            "[1,]",
            "[,1]",
            "[1 2]",
            "[1",
            "[1,",
            "[",
            "1",
            " [1]",
            "[1}",
        ] {
            assert_eq!(ours(bad), None, "{bad}");
        }
        assert_eq!(bound(b"[1,2,3]"), 3);
        assert_eq!(bound(b"[]"), 1);
        let long: String = (0..1000).map(|i| format!("{i},")).collect();
        assert_eq!(bound(long.as_bytes()), 1001);
    }

    fn element() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => any::<u32>().prop_map(|n| n.to_string()),
            1 => any::<u64>().prop_map(|n| n.to_string()),
            1 => "(0|-?[0-9]{1,12})(\\.[0-9])?([eE][+-]?[0-9])?",
            1 => prop_oneof![Just("\"a\"".to_string()), Just("[1]".to_string()), Just(String::new())],
        ]
    }

    fn ws() -> impl Strategy<Value = String> {
        "[ \t\r\n]{0,2}"
    }

    proptest! {
        #[test]
        fn agrees_with_serde_json(
            items in proptest::collection::vec((ws(), element(), ws()), 0..12),
            tail in "[ ,\\]]{0,2}",
        ) {
            let body: Vec<String> = items.iter().map(|(a, e, b)| format!("{a}{e}{b}")).collect();
            let text = format!("[{}]{tail}", body.join(","));
            // Read: exactly serde_json's reading. Refused: the general path answers.
            if let Some(m) = ours(&text) {
                prop_assert_eq!(Some(m), serde(&text), "{}", text);
            }
        }

        #[test]
        fn every_list_of_ids_is_read(
            items in proptest::collection::vec((ws(), any::<u32>(), ws()), 0..12),
        ) {
            let body: Vec<String> = items.iter().map(|(a, e, b)| format!("{a}{e}{b}")).collect();
            let text = format!("[{}]", body.join(","));
            let want: Vec<u32> = items.iter().map(|x| x.1).collect();
            prop_assert_eq!(ours(&text), Some((want, text.len())));
        }
    }
}
