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
}
