//! Request members that inference engines trust as engine-to-engine or router data,
//! removed from every client body before it goes to a worker (docs/SECURITY.md, "The
//! proxy").
//!
//! An engine cannot tell who wrote a request member: vLLM hands a request's
//! `kv_transfer_params` to its KV connector, which (NIXL) then pulls KV blocks from the
//! `remote_host` / `remote_port` it names; SGLang's decode server connects to the
//! `bootstrap_host` / `bootstrap_port` of a request. Only the proxy may set such
//! members (`pd`: from the prefill worker's answer), so a client's are dropped, on
//! every path: aggregated, both legs of a disaggregated request, and the decode-only
//! fallback. The list comes from the engines' OpenAI protocol and disaggregation code
//! (vLLM `entrypoints/openai/*/protocol.py` and `kv_transfer_params_sanitizer.py`,
//! SGLang `srt/entrypoints/openai/protocol.py`, TensorRT-LLM `serve/openai_protocol.py`).
//!
//! Guarantees: no member of [`TOP`] is left at the top level of the body, nor any of
//! [`XARGS`] inside its `vllm_xargs` object; everything else is kept as sent. Each
//! removal is named by its [`FIELDS`] label so the caller can count it.

use serde_json::Value;

/// Top-level members removed, with what trusts them.
pub const TOP: [(&str, &str); 10] = [
    (
        "kv_transfer_params",
        "vLLM KV connectors (NIXL: remote_host/remote_port to pull KV blocks from)",
    ),
    (
        "ec_transfer_params",
        "vLLM encoder-cache connectors (disaggregated encoders)",
    ),
    (
        "disaggregated_params",
        "TensorRT-LLM disaggregated serving (context request id, opaque state)",
    ),
    (
        "bootstrap_host",
        "SGLang P/D: the prefill server the decode server connects to",
    ),
    ("bootstrap_port", "SGLang P/D: that server's bootstrap port"),
    ("bootstrap_room", "SGLang P/D: the KV transfer's room id"),
    (
        "routed_dp_rank",
        "SGLang: the data-parallel rank an external router assigns",
    ),
    (
        "data_parallel_rank",
        "SGLang (deprecated name of routed_dp_rank)",
    ),
    (
        "disagg_prefill_dp_rank",
        "SGLang P/D: the prefill DP rank holding the KV cache",
    ),
    (
        "custom_logit_processor",
        "SGLang: a serialized Python callable run by the engine (operator-enabled)",
    ),
];

/// Members removed from `vllm_xargs` (vLLM copies it into the sampling params'
/// `extra_args`, where its connectors read `kv_transfer_params`).
pub const XARGS: [&str; 2] = ["kv_transfer_params", "ec_transfer_params"];

/// Labels of the removals (the metric's `field`): the top-level names, then
/// `vllm_xargs.NAME`.
pub const FIELDS: [&str; 12] = [
    "kv_transfer_params",
    "ec_transfer_params",
    "disaggregated_params",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
    "custom_logit_processor",
    "vllm_xargs.kv_transfer_params",
    "vllm_xargs.ec_transfer_params",
];

/// Removes the trusted members from a client body (a JSON object; anything else is
/// left alone) and returns the labels ([`FIELDS`]) of what was removed, in order.
pub fn strip(body: &mut Value) -> Vec<&'static str> {
    let mut out = Vec::new();
    let Some(obj) = body.as_object_mut() else {
        return out;
    };
    for (i, (name, _)) in TOP.iter().enumerate() {
        if obj.shift_remove(*name).is_some() {
            out.push(FIELDS[i]);
        }
    }
    if let Some(Value::Object(x)) = obj.get_mut("vllm_xargs") {
        for (i, name) in XARGS.iter().enumerate() {
            if x.shift_remove(*name).is_some() {
                out.push(FIELDS[TOP.len() + i]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn engine_members_go_and_the_rest_stays_in_order() {
        let mut b = json!({
            "model": "m",
            "kv_transfer_params": {"do_remote_prefill": true, "remote_host": "203.0.113.66"},
            "prompt": [1, 2],
            "bootstrap_host": "203.0.113.66", "bootstrap_port": 8998, "bootstrap_room": 7,
            "routed_dp_rank": 1, "data_parallel_rank": 1, "disagg_prefill_dp_rank": 0,
            "ec_transfer_params": {}, "disaggregated_params": {"request_type": "generation_only"},
            "custom_logit_processor": "gASV...",
            "vllm_xargs": {"kv_transfer_params": "x", "ec_transfer_params": 1, "mine": 2},
            "cache_salt": "s", "priority": 3,
        });
        let got = strip(&mut b);
        assert_eq!(got, FIELDS.to_vec());
        assert_eq!(
            b,
            json!({"model": "m", "prompt": [1, 2], "vllm_xargs": {"mine": 2},
                   "cache_salt": "s", "priority": 3})
        );
        let keys: Vec<&String> = b.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["model", "prompt", "vllm_xargs", "cache_salt", "priority"]
        );
        // Nothing to strip: nothing said, nothing changed.
        let mut c = json!({"model": "m", "vllm_xargs": ["kv_transfer_params"]});
        let before = c.clone();
        assert!(strip(&mut c).is_empty());
        assert_eq!(c, before);
        assert!(strip(&mut json!([1])).is_empty());
    }

    #[test]
    fn every_top_member_has_its_label() {
        for (i, (name, why)) in TOP.iter().enumerate() {
            assert_eq!(FIELDS[i], *name);
            assert!(!why.is_empty());
        }
        for (i, name) in XARGS.iter().enumerate() {
            assert_eq!(FIELDS[TOP.len() + i], format!("vllm_xargs.{name}"));
        }
    }
}
