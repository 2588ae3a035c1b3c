//! Fuzz target: arbitrary bytes as the JSON bodies of the HTTP API.
//!
//! The same input is parsed as a `POST /v1/route` body (`RouteRequest`), a
//! `POST /v1/workers/{id}/events` body (`EventBatch`) and a `POST /v1/workers` body
//! (`WorkerSpec`). Whatever parses must survive validation without panicking
//! (`RouteRequest::prepare` with a small and a large block size, `WorkerSpec::validate`),
//! and must serialize to JSON that parses back to an equal value (no field is lost or
//! changed by a round trip). Any panic is a bug: bad bodies must become HTTP 400s.
#![no_main]

use kvroute::engine::{EventBatch, RouteRequest};
use kvroute::types::WorkerSpec;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// Serializes `v`, parses it again and checks the result is equal to `v`.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(v: &T) {
    let text = serde_json::to_string(v).expect("a parsed value serializes");
    let again: T = serde_json::from_str(&text).expect("serialized JSON parses again");
    assert_eq!(&again, v, "JSON round trip changed the value: {text}");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = serde_json::from_slice::<RouteRequest>(data) {
        for (block_size, max_hashes) in [(1, 64), (16, 1 << 16), (128, 8)] {
            let _ = req.prepare(block_size, max_hashes);
        }
        round_trip(&req);
    }
    if let Ok(batch) = serde_json::from_slice::<EventBatch>(data) {
        round_trip(&batch);
    }
    if let Ok(spec) = serde_json::from_slice::<WorkerSpec>(data) {
        let _ = spec.validate();
        round_trip(&spec);
    }
});
