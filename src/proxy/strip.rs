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
//! [`XARGS`] inside its `vllm_xargs` object (every occurrence of a repeated one);
//! everything else is kept byte for byte as sent. A body with none of them is not
//! touched (nothing is scanned beyond the parse that found none); otherwise the
//! members are cut out of the bytes (`members::removals`), never re-serialised. Each
//! removal is named by its [`FIELDS`] label so the caller can count it. The proxy
//! calls it through `request::Body::strip`, which keeps the body's member spans.

use super::members;
use std::ops::Range;

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

/// The bytes of client body `raw` (a JSON object) without the trusted members, and
/// the labels ([`FIELDS`]) of what was removed, in order; `None` when there is none
/// to remove (the body is then forwarded as it is).
pub fn strip(raw: &[u8]) -> Option<(Vec<u8>, Vec<&'static str>)> {
    let mut found = [false; FIELDS.len()];
    let mut values = Vec::new();
    let mut drop = Vec::new();
    let mut cuts = Vec::new();
    let ok = members::object(raw, |k, r| {
        let top = TOP.iter().position(|(n, _)| *n == k);
        if let Some(i) = top {
            found[i] = true;
        } else if k == "vllm_xargs" && raw[r.start] == b'{' {
            cuts.extend(xargs_removals(raw, r.clone(), &mut found));
        }
        drop.push(top.is_some());
        values.push(r);
    });
    if ok.is_err() || !found.contains(&true) {
        return None;
    }
    cuts.extend(members::removals(
        raw,
        members::open_index(raw),
        &values,
        |i| drop[i],
    ));
    cuts.sort_by_key(|r| r.start);
    let labels = FIELDS
        .iter()
        .zip(found)
        .filter_map(|(f, hit)| hit.then_some(*f))
        .collect();
    Some((members::cut(raw, &cuts), labels))
}

/// The members removed through a JSON tree (re-serialised): what `Body::strip` falls
/// back to should an edit of the bytes not read back as an object.
pub fn tree_strip(raw: &[u8]) -> Vec<u8> {
    let Ok(serde_json::Value::Object(mut obj)) = serde_json::from_slice(raw) else {
        return b"{}".to_vec();
    };
    for (name, _) in TOP {
        obj.shift_remove(name);
    }
    if let Some(serde_json::Value::Object(x)) = obj.get_mut("vllm_xargs") {
        for name in XARGS {
            x.shift_remove(name);
        }
    }
    serde_json::to_vec(&obj).unwrap_or_else(|_| b"{}".to_vec())
}

/// The cuts that take [`XARGS`] out of the `vllm_xargs` object at `span` of `raw`.
fn xargs_removals(
    raw: &[u8],
    span: Range<usize>,
    found: &mut [bool; FIELDS.len()],
) -> Vec<Range<usize>> {
    let text = &raw[span.clone()];
    let (mut values, mut drop) = (Vec::new(), Vec::new());
    let ok = members::object(text, |k, r| {
        let x = XARGS.iter().position(|n| *n == k);
        if let Some(i) = x {
            found[TOP.len() + i] = true;
        }
        drop.push(x.is_some());
        values.push(r);
    });
    if ok.is_err() {
        return Vec::new();
    }
    let cuts = members::removals(text, members::open_index(text), &values, |i| drop[i]);
    cuts.into_iter()
        .map(|r| r.start + span.start..r.end + span.start)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn strip(b: &mut Value) -> Vec<&'static str> {
        let Some((bytes, out)) = super::strip(b.to_string().as_bytes()) else {
            return Vec::new();
        };
        *b = serde_json::from_slice(&bytes).unwrap();
        out
    }

    fn cut(text: &str) -> (String, Vec<&'static str>) {
        let (bytes, out) = super::strip(text.as_bytes()).unwrap();
        (String::from_utf8(bytes).unwrap(), out)
    }

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
    }

    #[test]
    fn the_bytes_kept_are_the_clients() {
        let text = "{ \"a\": 1.50 ,\"kv_transfer_params\" : {\"x\":[1]},\n \"vllm_xargs\": {\"kv_transfer_params\":1, \"m\": 2e0},\"bootstrap_room\":3, \"kv_transfer_params\":null }";
        let (got, labels) = cut(text);
        assert_eq!(
            labels,
            [
                "kv_transfer_params",
                "bootstrap_room",
                "vllm_xargs.kv_transfer_params"
            ]
        );
        assert_eq!(got, "{ \"a\": 1.50,\n \"vllm_xargs\": { \"m\": 2e0} }");
        // Only the stripped members first: the separator after them goes too.
        let (got, labels) = cut("{\"routed_dp_rank\":1, \"model\":\"m\"}");
        assert_eq!(labels, ["routed_dp_rank"]);
        assert_eq!(got, "{ \"model\":\"m\"}");
        assert_eq!(cut("{\"routed_dp_rank\":1}").0, "{}");
        // Nothing to strip: nothing to do.
        assert_eq!(super::strip(b"{\"a\":{\"kv_transfer_params\":1}}"), None);
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
