//! The one rule for worker and request ids, checked at every door: HTTP register,
//! events, delete, route and lifecycle; binary `Hello`, `Register`, `Deregister`,
//! `Route` and `Lifecycle`; `[[engines]]` at config validation; snapshot restore.
//!
//! Rule: 1 to [`MAX_ID_LEN`] bytes, each one of [`ID_CHARSET`]
//! (`A-Z a-z 0-9 . _ : @ + = -`).
//!
//! Why this charset: an id must be addressable as one HTTP path segment
//! (`/v1/workers/{id}`, `/v1/requests/{id}/finish`) without any encoding. `/`, `?`
//! and `#` would split or cut the path, `%` would need percent-decoding (and two
//! spellings of one id), spaces and control bytes break logs and the Prometheus text.
//! An id accepted by one door is therefore reachable through every other door, and
//! no request can be left active forever for want of an addressable id. The set keeps
//! the usual id shapes (UUIDs, `host:port`, `name@rank`, base64url without padding).
//!
//! Pure: no I/O, no allocation on success.

/// Longest accepted id, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// The characters an id may use, as written in error messages and the docs.
pub const ID_CHARSET: &str = "A-Z a-z 0-9 . _ : @ + = -";

/// The prefix of every request id the OpenAI proxy makes (`proxy::request::router_id`);
/// the route APIs refuse client ids that start with it, so a proxy id is unique by
/// construction (its core and that core's counter follow) and a proxied route need not
/// ask the other cores whether they know it (`index_layout = "replicated"`).
pub const PROXY_ID_PREFIX: &str = "px=";

/// Whether `id` is in the proxy's reserved id space ([`PROXY_ID_PREFIX`]).
pub fn is_proxy_id(id: &str) -> bool {
    id.starts_with(PROXY_ID_PREFIX)
}

/// Whether `b` may appear in an id.
pub fn is_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'+' | b'=' | b'-')
}

/// Checks `id` against the rule; the error names `what` (e.g. "worker id") and the rule.
pub fn check(what: &str, id: &str) -> Result<(), String> {
    if !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(is_id_byte) {
        return Ok(());
    }
    Err(format!(
        "{what} must be 1..={MAX_ID_LEN} bytes of [{ID_CHARSET}], got {} bytes{}",
        id.len(),
        match id.bytes().find(|&b| !is_id_byte(b)) {
            Some(b) if b.is_ascii_graphic() => format!(" with {:?}", b as char),
            Some(b) => format!(" with byte 0x{b:02x}"),
            None => String::new(),
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_charset_up_to_the_limit() {
        for ok in [
            "w1",
            "a",
            "550e8400-e29b-41d4-a716-446655440000",
            "host:7400",
            "w@3",
            "a+b=c_d.e",
        ] {
            assert_eq!(check("id", ok), Ok(()), "{ok}");
        }
        assert_eq!(check("id", &"x".repeat(MAX_ID_LEN)), Ok(()));
    }

    #[test]
    fn refuses_what_a_path_segment_cannot_carry() {
        for bad in [
            "", "a/b", "a?b", "a#b", "a%2Fb", "a b", "a\tb", "é", "a,b", "a~b", "a\\b",
        ] {
            let e = check("worker id", bad).unwrap_err();
            assert!(e.starts_with("worker id must be 1..=128 bytes of ["), "{e}");
        }
        assert!(check("id", &"x".repeat(MAX_ID_LEN + 1)).is_err());
        assert!(check("id", "a/b").unwrap_err().contains("'/'"));
    }

    #[test]
    fn the_rule_is_what_is_written() {
        let listed: Vec<u8> = (0u8..=255).filter(|&b| is_id_byte(b)).collect();
        let mut want: Vec<u8> = (b'0'..=b'9')
            .chain(b'A'..=b'Z')
            .chain(b'a'..=b'z')
            .collect();
        want.extend(b".:_@+=-");
        want.sort_unstable();
        assert_eq!(listed, want);
        for b in listed {
            let c = b as char;
            let named = c.is_ascii_alphanumeric() || ID_CHARSET.contains(c);
            assert!(named, "{c:?} missing from ID_CHARSET");
        }
    }
}
