//! Event and status shapes shared by the HTTP API, the engine and the tools.
//!
//! `KvEvent` is the JSON form of a worker's cache change (`POST /v1/workers/{id}/events`,
//! same semantics as the binary protocol). `WorkerStatus` is one row of `GET /v1/workers`.

use crate::types::{DeviceClass, DpRanks, Role, Tier};
use serde::{Deserialize, Serialize};

fn device_tier() -> Tier {
    Tier::Device
}

/// A worker's KV cache change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum KvEvent {
    /// Blocks now held (sequence hashes, in prefix order; `parent` = sequence hash of the
    /// block before the first one, informational).
    Stored {
        #[serde(default = "device_tier")]
        tier: Tier,
        #[serde(default)]
        parent: Option<u64>,
        block_hashes: Vec<u64>,
    },
    /// Blocks no longer held in `tier`.
    Removed {
        #[serde(default = "device_tier")]
        tier: Tier,
        block_hashes: Vec<u64>,
    },
    /// Everything in `tier` dropped (all tiers when absent).
    Cleared {
        #[serde(default)]
        tier: Option<Tier>,
    },
}

/// `POST /v1/workers/{id}/events` body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventBatch {
    pub events: Vec<KvEvent>,
}

/// Routing state of a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Eligible for routing.
    Live,
    /// Index state suspect (sequence gap): routed with zero overlap until resync.
    Suspect,
    /// Missed its heartbeat window: out of routing until it returns.
    Down,
}

/// One row of `GET /v1/workers`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub id: String,
    pub role: Role,
    pub device: DeviceClass,
    pub model: String,
    pub dp_ranks: DpRanks,
    pub taints: Vec<String>,
    pub topology: String,
    pub capacity_blocks: u64,
    pub epoch: u64,
    pub state: WorkerState,
    pub cached_blocks: u64,
    pub active_requests: u32,
    pub prefill_tokens: f64,
    pub decode_blocks: f64,
    /// Why the worker's engine event stream is refusing events (ZMQ engines), e.g.
    /// `block_size_mismatch: engine 16, router 4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_issue: Option<String>,
    /// The declared `throughput_weight` (absent when none was declared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput_weight: Option<f64>,
    /// The worker's upstream URL for the proxy (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Approximate mode: the worker publishes no KV events and its cache is modelled
    /// from the prompts routed to it (`index::approx`).
    #[serde(default)]
    pub approximate: bool,
    /// Approximate workers: the blocks modelled (over every shard; absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approximate_entries: Option<u64>,
}

impl WorkerStatus {
    /// A status row from a worker's spec and its fleet-wide figures.
    pub fn new(
        spec: &crate::types::WorkerSpec,
        state: WorkerState,
        cached_blocks: u64,
        load: &crate::load::WorkerLoad,
        decode_blocks: f64,
    ) -> WorkerStatus {
        WorkerStatus {
            id: spec.id.clone(),
            role: spec.role,
            device: spec.device,
            model: spec.model.clone(),
            dp_ranks: spec.dp_ranks,
            taints: spec.taints.clone(),
            topology: spec.topology.clone(),
            capacity_blocks: spec.capacity_blocks,
            epoch: spec.epoch,
            state,
            cached_blocks,
            active_requests: load.active_requests,
            prefill_tokens: load.prefill_tokens,
            decode_blocks,
            engine_issue: None,
            throughput_weight: spec.throughput_weight,
            url: spec.url.clone(),
            approximate: false,
            approximate_entries: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_json_shapes() {
        let b: EventBatch = serde_json::from_str(
            r#"{"events":[{"type":"stored","tier":"host","parent":null,"block_hashes":[1,18446744073709551615]},
                {"type":"removed","tier":"device","block_hashes":[2]},{"type":"cleared"}]}"#,
        )
        .unwrap();
        assert_eq!(
            b.events[0],
            KvEvent::Stored {
                tier: Tier::Host,
                parent: None,
                block_hashes: vec![1, u64::MAX]
            }
        );
        assert_eq!(b.events[2], KvEvent::Cleared { tier: None });
        assert!(serde_json::from_str::<EventBatch>(r#"{"events":[{"type":"bogus"}]}"#).is_err());
        assert!(serde_json::from_str::<EventBatch>(
            r#"{"events":[{"type":"stored","tier":"gpu","block_hashes":[]}]}"#
        )
        .is_err());
    }
}
