//! Errors in OpenAI's shape, `{"error": {"message", "type", "code"}}`, as JSON bodies
//! and as the SSE event that ends a stream an upstream broke after bytes reached the
//! client (`data: {"error": ...}`, then a blank line).

use bytes::Bytes;

/// The JSON body of an error.
pub fn body(kind: &str, code: &str, message: &str) -> Bytes {
    let v = serde_json::json!({
        "error": { "message": message, "type": kind, "code": code, "param": null }
    });
    Bytes::from(serde_json::to_vec(&v).unwrap_or_else(|_| b"{}".to_vec()))
}

/// The SSE event carrying an error.
pub fn sse_event(code: &str, message: &str) -> Bytes {
    let b = body("upstream_error", code, message);
    let mut out = Vec::with_capacity(b.len() + 10);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&b);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// A whole HTTP/1.1 429 response (OpenAI's error shape, `retry-after`, `connection:
/// close`) for a client connection the proxy has no slot for: written by
/// `proxy::refuse` instead of dropping the socket.
pub fn refused_connection_response(retry_after_s: u32) -> Vec<u8> {
    let b = body(
        "rate_limit_exceeded",
        "too_many_connections",
        "every proxy connection slot is in use; retry later",
    );
    let mut out = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: {retry_after_s}\r\nconnection: close\r\n\r\n",
        b.len()
    )
    .into_bytes();
    out.extend_from_slice(&b);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn shapes() {
        let v: serde_json::Value = serde_json::from_slice(&super::body("t", "c", "m")).unwrap();
        assert_eq!(v["error"]["message"], "m");
        assert_eq!(v["error"]["code"], "c");
        let e = super::sse_event("x", "broke");
        assert!(e.starts_with(b"data: {\"error\"") && e.ends_with(b"\n\n"));
    }

    #[test]
    fn refused_connection_is_a_complete_429() {
        let r = String::from_utf8(super::refused_connection_response(2)).unwrap();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 429 "));
        assert!(head.contains("\r\nretry-after: 2") && head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
