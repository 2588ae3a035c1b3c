//! Errors as each API's clients expect them.
//!
//! - Anthropic: `{"type": "error", "error": {"type", "message"}}`, the `error.type`
//!   from the HTTP status in Anthropic's vocabulary (vLLM's `translate_error_type`:
//!   the SDKs dispatch on it), and the same object as the `event: error` of a stream
//!   that broke after bytes reached the client.
//! - Responses: OpenAI's shape, and the engine's own answer for a
//!   `previous_response_id` it does not hold (vLLM's `_make_not_found_error`).

use serde_json::json;

/// Anthropic's `error.type` for an HTTP status.
pub fn anthropic_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The JSON body of an Anthropic error.
pub fn anthropic_body(status: u16, message: &str) -> Vec<u8> {
    let v = json!({"type": "error", "error": {"type": anthropic_type(status), "message": message}});
    v.to_string().into_bytes()
}

/// The SSE event ending an Anthropic stream with an error.
pub fn anthropic_sse(status: u16, message: &str) -> Vec<u8> {
    let mut out = b"event: error\ndata: ".to_vec();
    out.extend_from_slice(&anthropic_body(status, message));
    out.extend_from_slice(b"\n\n");
    out
}

/// vLLM's answer (404) to a `previous_response_id` it does not hold.
pub fn response_not_found(id: &str) -> Vec<u8> {
    json!({"error": {
        "message": format!("Response with id '{id}' not found."),
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }})
    .to_string()
    .into_bytes()
}

/// An OpenAI-shaped error body (vLLM's `ErrorResponse`: a numeric `code`).
pub fn openai_body(status: u16, kind: &str, message: &str) -> Vec<u8> {
    json!({"error": {"message": message, "type": kind, "param": null, "code": status}})
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_types_follow_the_status() {
        let v: serde_json::Value = serde_json::from_slice(&anthropic_body(429, "slow")).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["message"], "slow");
        assert_eq!(anthropic_type(502), "api_error");
        assert_eq!(anthropic_type(503), "overloaded_error");
        assert_eq!(anthropic_type(418), "invalid_request_error");
        let e = anthropic_sse(500, "broke");
        assert!(e.starts_with(b"event: error\ndata: {") && e.ends_with(b"\n\n"));
        let v: serde_json::Value = serde_json::from_slice(&response_not_found("r1")).unwrap();
        assert_eq!(v["error"]["message"], "Response with id 'r1' not found.");
        assert_eq!(v["error"]["code"], 404);
    }
}
