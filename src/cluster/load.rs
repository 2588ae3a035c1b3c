//! Shared active load between replicas: what one replica's routing and lifecycle calls
//! did, published on core NATS (`kvroute.NAME.load`, batched) and applied by the other
//! replicas to their load view, so each replica's cost counts its peers' requests and
//! a lifecycle call may reach any replica (every replica holds every request's record).
//!
//! Workers travel as ids (slots differ between replicas). A batch is JSON: small,
//! self-describing, and bounded by the NATS payload limit before it is parsed; it is
//! sealed (`cluster::auth`), and live batches carry a per-origin sequence that
//! [`SeqGuard`] checks, so a captured batch replayed later is refused. Pure: the
//! batcher decides when to flush; the driver sends.

use crate::load::CarriedRequest;
use serde::{Deserialize, Serialize};

/// Largest load batch a receiver parses.
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Ops per batch at most; a batch is also flushed after [`FLUSH_US`].
pub const MAX_OPS: usize = 256;
pub const FLUSH_US: u64 = 2_000;

/// One load change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum LoadOp {
    /// A routed request, as its record was committed (fresh: its progress fields
    /// left out), or as a load sync carries it; workers as ids.
    Route(CarriedRequest<String>),
    FirstToken {
        id: String,
    },
    Progress {
        id: String,
        output_tokens: u32,
    },
    Finish {
        id: String,
    },
    PrefillFailed {
        id: String,
    },
}

/// What travels in one NATS message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBatch {
    /// The publishing replica's incarnation (receivers skip their own).
    pub origin: String,
    /// Live batches: 1, 2, ... per origin ([`SeqGuard`]); 0 (left out) in load-sync
    /// answers, which are bound to their request instead.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    pub ops: Vec<LoadOp>,
    /// A load-sync answer continues in another message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more: bool,
}

/// Whether `op` travels in a batch of its own: a pinned route, whose `pinned` field
/// replicas older than it refuse with the whole batch (unknown field), so alone it
/// costs such a replica that one route and nothing else.
pub fn alone(op: &LoadOp) -> bool {
    matches!(op, LoadOp::Route(r) if r.pinned)
}

/// Whether `op` must start a new batch after the `pending` ones: either of them
/// travels [`alone`]. The one rule of live batches ([`Batcher::takes`]) and load-sync
/// answers ([`chunk`]).
fn apart(pending: &[LoadOp], op: &LoadOp) -> bool {
    !pending.is_empty() && (alone(op) || pending.first().is_some_and(alone))
}

/// Cuts a load-sync answer into batches of at most `max_bytes` of ops (roughly:
/// each op's JSON length is counted; a pinned route is a batch of its own, see
/// [`alone`]), the last one with `more == false`.
pub fn chunk(origin: &str, ops: Vec<LoadOp>, max_bytes: usize) -> Vec<LoadBatch> {
    let mut out = Vec::new();
    let mut cur: Vec<LoadOp> = Vec::new();
    let mut bytes = 0;
    for op in ops {
        let n = serde_json::to_vec(&op).map_or(0, |v| v.len()) + 1;
        if (bytes + n > max_bytes && !cur.is_empty()) || apart(&cur, &op) {
            out.push(LoadBatch {
                origin: origin.to_string(),
                seq: 0,
                ops: std::mem::take(&mut cur),
                more: true,
            });
            bytes = 0;
        }
        bytes += n;
        cur.push(op);
    }
    out.push(LoadBatch {
        origin: origin.to_string(),
        seq: 0,
        ops: cur,
        more: false,
    });
    out
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Replay guard of live load batches: the last sequence seen per origin incarnation.
/// A batch is admitted only with a sequence above its origin's last one (core NATS
/// delivers one publisher's messages in order). Bounded: past `cap` origins it forgets
/// them all, after which one replay per forgotten origin could pass again (its load
/// then expires with `request_ttl_ms`).
pub struct SeqGuard {
    last: std::collections::HashMap<String, u64>,
    cap: usize,
}

impl SeqGuard {
    pub fn new(cap: usize) -> SeqGuard {
        SeqGuard {
            last: std::collections::HashMap::new(),
            cap: cap.max(1),
        }
    }

    /// Whether a live batch `seq` of `origin` is new (and remembers it).
    pub fn admit(&mut self, origin: &str, seq: u64) -> bool {
        if seq == 0 {
            return false;
        }
        if let Some(last) = self.last.get_mut(origin) {
            if seq <= *last {
                return false;
            }
            *last = seq;
            return true;
        }
        if self.last.len() >= self.cap {
            self.last.clear();
        }
        self.last.insert(origin.to_string(), seq);
        true
    }
}

impl LoadBatch {
    pub fn decode(b: &[u8]) -> Result<LoadBatch, String> {
        if b.len() > MAX_BATCH_BYTES {
            return Err(format!("load batch of {} bytes", b.len()));
        }
        serde_json::from_slice(b).map_err(|e| e.to_string())
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Accumulates ops; says when a batch is due. A pinned route ([`alone`]) goes in a
/// batch of its own: [`Batcher::takes`] refuses it after other ops and any op after
/// it, and a batch holding it is due at once.
#[derive(Default)]
pub struct Batcher {
    ops: Vec<LoadOp>,
    first_us: u64,
}

impl Batcher {
    /// Whether `op` may join the pending ops (else flush them first).
    pub fn takes(&self, op: &LoadOp) -> bool {
        !apart(&self.ops, op)
    }

    pub fn push(&mut self, op: LoadOp, now_us: u64) {
        if self.ops.is_empty() {
            self.first_us = now_us;
        }
        self.ops.push(op);
    }

    /// Whether the pending ops should go out now.
    pub fn due(&self, now_us: u64) -> bool {
        !self.ops.is_empty()
            && (self.ops.len() >= MAX_OPS
                || now_us.saturating_sub(self.first_us) >= FLUSH_US
                || self.ops.first().is_some_and(alone))
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn take(&mut self) -> Vec<LoadOp> {
        std::mem::take(&mut self.ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_and_flush_by_size_or_age() {
        let b = LoadBatch {
            origin: "r/1".into(),
            seq: 0,
            ops: vec![
                LoadOp::Route(CarriedRequest {
                    id: "q".into(),
                    decode_worker: "w1".into(),
                    prefill_worker: None,
                    input_tokens: 64,
                    cached_tokens: 16,
                    prompt_blocks: 4,
                    hashes: vec![1, 2, 3, 4],
                    expected_output_tokens: Some(8),
                    in_prefill: true,
                    output_tokens: 0,
                    age_us: 0,
                    first_token_age_us: None,
                    pinned: false,
                    idle_us: 0,
                    local: false,
                }),
                LoadOp::Progress {
                    id: "q".into(),
                    output_tokens: 3,
                },
                LoadOp::Finish { id: "q".into() },
            ],
            more: false,
        };
        // A fresh route leaves the progress fields out.
        let text = String::from_utf8(b.encode()).unwrap();
        assert!(
            !text.contains("in_prefill") && !text.contains("more"),
            "{text}"
        );
        assert_eq!(LoadBatch::decode(&b.encode()), Ok(b));
        assert!(LoadBatch::decode(b"{\"origin\":\"x\",\"ops\":[{\"op\":\"boom\"}]}").is_err());
        assert!(LoadBatch::decode(&vec![b' '; MAX_BATCH_BYTES + 1]).is_err());
        let mut bt = Batcher::default();
        assert!(!bt.due(0));
        bt.push(LoadOp::Finish { id: "a".into() }, 100);
        assert!(!bt.due(100 + FLUSH_US - 1));
        assert!(bt.due(100 + FLUSH_US));
        bt.take();
        for i in 0..MAX_OPS {
            bt.push(LoadOp::Finish { id: format!("{i}") }, 0);
        }
        assert!(bt.due(0));
        assert_eq!(bt.take().len(), MAX_OPS);
        assert!(bt.is_empty());
        let ops: Vec<LoadOp> = (0..100)
            .map(|i| LoadOp::Finish {
                id: format!("r{i}"),
            })
            .collect();
        let parts = chunk("o", ops.clone(), 200);
        assert!(parts.len() > 1);
        assert!(parts[..parts.len() - 1].iter().all(|p| p.more));
        assert!(!parts[parts.len() - 1].more);
        let joined: Vec<LoadOp> = parts.into_iter().flat_map(|p| p.ops).collect();
        assert_eq!(joined, ops);
        assert_eq!(chunk("o", vec![], 10).len(), 1);
    }

    /// The JSON of route ops, byte for byte (peers of other builds parse it): a fresh
    /// route leaves its progress and absent optional fields out; a load-sync route
    /// carries them all.
    #[test]
    fn route_op_json_is_pinned() {
        let fresh = LoadOp::Route(CarriedRequest {
            id: "q".into(),
            decode_worker: "w1".into(),
            prefill_worker: None,
            input_tokens: 64,
            cached_tokens: 16,
            prompt_blocks: 4,
            hashes: vec![1, u64::MAX],
            expected_output_tokens: None,
            in_prefill: true,
            output_tokens: 0,
            age_us: 0,
            first_token_age_us: None,
            pinned: false,
            idle_us: 0,
            local: false,
        });
        let synced = LoadOp::Route(CarriedRequest {
            id: "r".into(),
            decode_worker: "w2".into(),
            prefill_worker: Some("p1".into()),
            input_tokens: 10,
            cached_tokens: 0,
            prompt_blocks: 1,
            hashes: vec![],
            expected_output_tokens: Some(8),
            in_prefill: false,
            output_tokens: 3,
            age_us: 1500,
            first_token_age_us: Some(700),
            pinned: false,
            idle_us: 0,
            local: false,
        });
        let b = LoadBatch {
            origin: "o".into(),
            seq: 0,
            ops: vec![fresh, synced],
            more: true,
        };
        let text = String::from_utf8(b.encode()).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"origin":"o","ops":["#,
                r#"{"op":"route","id":"q","decode":"w1","input_tokens":64,"cached_tokens":16,"#,
                r#""prompt_blocks":4,"hashes":[1,18446744073709551615]},"#,
                r#"{"op":"route","id":"r","decode":"w2","prefill":"p1","input_tokens":10,"#,
                r#""cached_tokens":0,"prompt_blocks":1,"hashes":[],"osl":8,"in_prefill":false,"#,
                r#""output_tokens":3,"age_us":1500,"first_token_age_us":700}],"more":true}"#
            )
        );
        assert_eq!(LoadBatch::decode(text.as_bytes()), Ok(b));
        // Unknown fields in a route are refused, as in every op.
        let extra = r#"{"origin":"o","ops":[{"op":"route","id":"q","decode":"w","input_tokens":1,"cached_tokens":0,"prompt_blocks":1,"hashes":[],"x":1}]}"#;
        assert!(LoadBatch::decode(extra.as_bytes()).is_err());
        let ok = extra.replace(r#","x":1"#, "");
        assert!(LoadBatch::decode(ok.as_bytes()).is_ok(), "{ok}");
    }

    #[test]
    fn live_batches_carry_a_sequence_and_replays_are_refused() {
        let b = LoadBatch {
            origin: "o/1".into(),
            seq: 7,
            ops: vec![LoadOp::Finish { id: "q".into() }],
            more: false,
        };
        let text = String::from_utf8(b.encode()).unwrap();
        assert_eq!(
            text,
            r#"{"origin":"o/1","seq":7,"ops":[{"op":"finish","id":"q"}]}"#
        );
        assert_eq!(LoadBatch::decode(text.as_bytes()), Ok(b));
        let mut g = SeqGuard::new(2);
        assert!(g.admit("a", 1) && g.admit("a", 2) && g.admit("a", 5));
        assert!(!g.admit("a", 5) && !g.admit("a", 3), "replays");
        assert!(!g.admit("b", 0), "a sync answer's 0 is never live");
        assert!(g.admit("b", 9) && !g.admit("b", 9));
        // Bounded: a third origin forgets the others.
        assert!(g.admit("c", 1));
        assert!(g.last.len() <= 2);
    }

    /// A pinned route says so last (`"pinned":true`); a route without the field (an
    /// older peer's, or any unpinned one) reads as not pinned.
    #[test]
    fn a_pinned_route_carries_its_flag_and_its_absence_means_unpinned() {
        let route = |pinned| {
            LoadOp::Route(CarriedRequest {
                id: "q".into(),
                decode_worker: "w".into(),
                prefill_worker: None,
                input_tokens: 1,
                cached_tokens: 0,
                prompt_blocks: 1,
                hashes: vec![],
                expected_output_tokens: None,
                in_prefill: true,
                output_tokens: 0,
                age_us: 0,
                first_token_age_us: None,
                pinned,
                idle_us: 0,
                local: false,
            })
        };
        let unpinned = r#"{"op":"route","id":"q","decode":"w","input_tokens":1,"cached_tokens":0,"prompt_blocks":1,"hashes":[]}"#;
        let pinned = unpinned.replace("[]}", r#"[],"pinned":true}"#);
        assert_eq!(serde_json::to_string(&route(false)).unwrap(), unpinned);
        assert_eq!(serde_json::to_string(&route(true)).unwrap(), pinned);
        assert_eq!(
            serde_json::from_str::<LoadOp>(unpinned).unwrap(),
            route(false)
        );
        assert_eq!(
            serde_json::from_str::<LoadOp>(&pinned).unwrap(),
            route(true)
        );
        // It travels alone, live and in a load sync; unpinned routes share batches.
        let mut bt = Batcher::default();
        assert!(bt.takes(&route(true)));
        bt.push(route(false), 0);
        assert!(bt.takes(&route(false)) && !bt.takes(&route(true)));
        assert!(!bt.due(0));
        bt.take();
        bt.push(route(true), 0);
        assert!(bt.due(0), "due at once");
        assert!(!bt.takes(&route(false)) && !bt.takes(&LoadOp::Finish { id: "q".into() }));
        let f = || LoadOp::Finish { id: "f".into() };
        let ops = vec![f(), route(true), route(true), f(), f()];
        let parts: Vec<usize> = chunk("o", ops, 1 << 20)
            .iter()
            .map(|p| p.ops.len())
            .collect();
        assert_eq!(parts, [1, 1, 1, 2]);
    }
}
