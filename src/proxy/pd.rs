//! The two legs of a disaggregated request through the proxy (vLLM's NIXL connector
//! flow): the prefill worker gets the request with `max_tokens: 1`, `stream: false`
//! and `kv_transfer_params` asking for a remote decode; the `kv_transfer_params` of its
//! JSON answer go into the request sent to the decode worker. The client body they
//! start from has already lost its own `kv_transfer_params` (`strip`), so the decode
//! leg's come from the prefill answer only; every other member is kept as the client
//! sent it.

use super::request::Body;
use serde_json::{json, Map, Value};

/// The client body's members (a JSON tree: both legs rewrite some of them).
fn members(client: &Body) -> Map<String, Value> {
    match client.to_value() {
        Value::Object(o) => o,
        _ => Map::new(),
    }
}

/// The prefill leg's body.
pub fn prefill_body(client: &Body) -> Vec<u8> {
    let mut obj = members(client);
    obj.insert("max_tokens".into(), json!(1));
    if obj.contains_key("max_completion_tokens") {
        obj.insert("max_completion_tokens".into(), json!(1));
    }
    obj.insert("stream".into(), json!(false));
    obj.remove("stream_options");
    obj.insert(
        "kv_transfer_params".into(),
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null
        }),
    );
    serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
}

/// `kv_transfer_params` of the prefill leg's answer (an object), if any.
pub fn answer_params(answer: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(answer).ok()?;
    match v.get("kv_transfer_params") {
        Some(p @ Value::Object(_)) => Some(p.clone()),
        _ => None,
    }
}

/// The decode leg's body: the client's, with the prefill's `kv_transfer_params`.
pub fn decode_body(client: &Body, params: Value) -> Vec<u8> {
    let mut obj = members(client);
    obj.insert("kv_transfer_params".into(), params);
    serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legs_carry_the_nixl_fields_and_keep_the_rest() {
        let c = json!({"model":"m","prompt":[1,2],"stream":true,"max_tokens":50,
                       "stream_options":{"include_usage":true},"custom":{"a":1}});
        let c = Body::parse(bytes::Bytes::from(c.to_string())).unwrap();
        let p: Value = serde_json::from_slice(&prefill_body(&c)).unwrap();
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["stream"], false);
        assert!(p.get("stream_options").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert!(p["kv_transfer_params"]["remote_host"].is_null());
        assert_eq!(p["custom"]["a"], 1);
        let ans = br#"{"choices":[],"kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[3]}}"#;
        let params = answer_params(ans).unwrap();
        let d: Value = serde_json::from_slice(&decode_body(&c, params)).unwrap();
        assert_eq!(d["kv_transfer_params"]["remote_engine_id"], "e1");
        assert_eq!(d["max_tokens"], 50);
        assert_eq!(d["stream"], true);
        assert!(answer_params(b"{}").is_none());
        assert!(answer_params(b"garbage").is_none());
    }
}
