//! Byte classes of JSON text the scan skips over: whitespace, and runs of plain string
//! content (found eight bytes at a time). A leaf of `jscan`: pure functions of bytes.

/// The index of the first byte at or after `i` that is not plain string content
/// (`"`, `\\`, a control character or a non-ASCII byte), eight bytes at a time.
pub(super) fn skip_plain(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    while let Some(w) = b.get(i..i + 8) {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        let v = u64::from_le_bytes(a);
        let special = has_zero(v ^ (ONES * u64::from(b'"')))
            | has_zero(v ^ (ONES * u64::from(b'\\')))
            | v.wrapping_sub(ONES * 0x20) & !v & HIGH
            | v & HIGH;
        if special != 0 {
            break;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c) {
            break;
        }
        i += 1;
    }
    i
}
