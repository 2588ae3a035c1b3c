//! The request head as the gateway forwards it (`HttpHeaders.headers`): the few
//! headers the EPP reads, within limits.
//!
//! Envoy lower-cases keys and sends values in `raw_value` (older versions in `value`);
//! both are read. Pseudo-headers (`:method`, `:path`) carry the request line.
//! Guarantees: a head with more than `max_count` headers, or more than `max_bytes` of
//! keys and values together, is refused before anything is copied out of it; only the
//! headers named here are kept.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};

/// What the EPP reads from the request head.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// `:method`, upper-case as sent (empty when absent).
    pub method: String,
    /// `:path` without its query string.
    pub path: String,
    /// `content-type`, lower-cased.
    pub content_type: Option<String>,
    /// `content-length`, when a number.
    pub content_length: Option<u64>,
    /// `x-request-id`'s bytes.
    pub request_id: Option<Vec<u8>>,
}

/// Why a head was refused (431 to the client).
#[derive(Debug, PartialEq, Eq)]
pub struct TooLarge(pub String);

/// A header's value bytes (`raw_value`, else `value`).
pub fn value(h: &HeaderValue) -> &[u8] {
    if h.raw_value.is_empty() {
        h.value.as_bytes()
    } else {
        &h.raw_value
    }
}

/// Reads `map` within the limits.
pub fn read(map: Option<&HeaderMap>, max_count: usize, max_bytes: usize) -> Result<Head, TooLarge> {
    let headers = map.map(|m| m.headers.as_slice()).unwrap_or_default();
    if headers.len() > max_count {
        return Err(TooLarge(format!(
            "{} request headers, more than {max_count}",
            headers.len()
        )));
    }
    let bytes: usize = headers.iter().map(|h| h.key.len() + value(h).len()).sum();
    if bytes > max_bytes {
        return Err(TooLarge(format!(
            "request headers of {bytes} bytes, more than {max_bytes}"
        )));
    }
    let mut head = Head::default();
    let text = |h: &HeaderValue| String::from_utf8_lossy(value(h)).trim().to_string();
    for h in headers {
        match h.key.as_str() {
            ":method" => head.method = text(h),
            ":path" => {
                let p = text(h);
                head.path = match p.split_once(['?', '#']) {
                    Some((p, _)) => p.to_string(),
                    None => p,
                };
            }
            "content-type" => head.content_type = Some(text(h).to_ascii_lowercase()),
            "content-length" => head.content_length = text(h).parse().ok(),
            "x-request-id" => head.request_id = Some(value(h).to_vec()),
            _ => {}
        }
    }
    Ok(head)
}

impl Head {
    /// Whether the body is declared JSON (`application/json`, or `+json`, with any
    /// parameters); `None` when no content type was sent.
    pub fn is_json(&self) -> Option<bool> {
        let ct = self.content_type.as_deref()?;
        let mime = ct.split(';').next().unwrap_or_default().trim();
        Some(
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json")),
        )
    }

    /// The proxy endpoint this path is, if any (a trailing `/` tolerated).
    pub fn endpoint(&self) -> Option<crate::proxy::request::Endpoint> {
        use crate::proxy::request::Endpoint;
        match self.path.trim_end_matches('/') {
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/chat/completions" => Some(Endpoint::Chat),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(k: &str, v: &str, raw: bool) -> HeaderValue {
        HeaderValue {
            key: k.into(),
            value: if raw { String::new() } else { v.into() },
            raw_value: if raw {
                v.as_bytes().to_vec()
            } else {
                Vec::new()
            },
        }
    }

    fn map(hs: &[(&str, &str)]) -> HeaderMap {
        HeaderMap {
            headers: hs.iter().map(|(k, v)| hv(k, v, true)).collect(),
        }
    }

    #[test]
    fn reads_the_request_line_and_the_headers_it_needs() {
        let m = map(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions?x=1"),
            ("content-type", "Application/JSON; charset=utf-8"),
            ("content-length", "12"),
            ("x-request-id", "r-1"),
            ("other", "x"),
        ]);
        let h = read(Some(&m), 10, 1000).unwrap();
        assert_eq!(h.method, "POST");
        assert_eq!(h.path, "/v1/chat/completions");
        assert_eq!(h.is_json(), Some(true));
        assert_eq!(h.content_length, Some(12));
        assert_eq!(h.request_id.as_deref(), Some(&b"r-1"[..]));
        assert_eq!(h.endpoint(), Some(crate::proxy::request::Endpoint::Chat));
        // `value` is read when `raw_value` is empty.
        let old = HeaderMap {
            headers: vec![hv(":path", "/v1/completions/", false)],
        };
        let h = read(Some(&old), 10, 1000).unwrap();
        assert_eq!(
            h.endpoint(),
            Some(crate::proxy::request::Endpoint::Completions)
        );
        assert_eq!(h.is_json(), None);
        assert_eq!(read(None, 0, 0).unwrap(), Head::default());
    }

    #[test]
    fn content_types() {
        let ct = |c: &str| Head {
            content_type: Some(c.into()),
            ..Head::default()
        };
        assert_eq!(ct("application/vnd.api+json").is_json(), Some(true));
        assert_eq!(ct("text/plain").is_json(), Some(false));
        assert_eq!(
            ct("application/x-www-form-urlencoded").is_json(),
            Some(false)
        );
        assert_eq!(ct("multipart/form-data; boundary=x").is_json(), Some(false));
    }

    #[test]
    fn limits_count_and_bytes() {
        let m = map(&[("a", "1"), ("b", "2"), ("c", "3")]);
        assert!(read(Some(&m), 3, 6).is_ok());
        assert!(read(Some(&m), 2, 100).is_err());
        assert!(read(Some(&m), 3, 5).is_err());
    }
}
