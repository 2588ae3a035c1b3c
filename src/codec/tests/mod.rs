//! Codec tests: round trips through a byte stream split everywhere, property tests,
//! every error path, and the worked hex examples of docs/PROTOCOL.md.

mod errors;
mod examples;
mod props;
mod roundtrip;

use bytes::BytesMut;

use super::*;
use crate::config::Mode;
use crate::types::{DeviceClass, DpRanks, Overlap, Role, Tier, WorkerSpec};

/// The four message enums, seen uniformly by the test helpers.
pub(super) trait Msg: Sized + PartialEq + std::fmt::Debug {
    fn dec(frame: &Frame) -> Result<Self, CodecError>;
    fn enc(&self, out: &mut BytesMut);
}

macro_rules! impl_msg {
    ($($t:ty),*) => {$(
        impl Msg for $t {
            fn dec(frame: &Frame) -> Result<Self, CodecError> {
                <$t>::decode(frame)
            }
            fn enc(&self, out: &mut BytesMut) {
                self.encode(out)
            }
        }
    )*};
}
impl_msg!(EventMsg, WorkerBound, RequestMsg, ResponseMsg);

/// Encodes one message into a fresh buffer.
pub(super) fn encoded<M: Msg>(m: &M) -> Vec<u8> {
    let mut out = BytesMut::new();
    m.enc(&mut out);
    out.to_vec()
}

/// Decodes every frame of `stream`, feeding it to a `FrameDecoder` in two pieces split
/// at `split`; panics on any error.
pub(super) fn decode_stream<M: Msg>(stream: &[u8], split: usize) -> Vec<M> {
    let mut dec = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for piece in [&stream[..split], &stream[split..]] {
        buf.extend_from_slice(piece);
        while let Some(f) = dec.decode(&mut buf).unwrap() {
            got.push(M::dec(&f).unwrap());
        }
    }
    assert!(buf.is_empty(), "bytes left over after the last frame");
    got
}

/// Encodes `msgs` back to back, then checks that splitting the stream at every byte
/// boundary decodes to exactly `msgs`.
pub(super) fn assert_stream_roundtrip<M: Msg>(msgs: &[M]) {
    let stream: Vec<u8> = msgs.iter().flat_map(encoded).collect();
    for split in 0..=stream.len() {
        let got: Vec<M> = decode_stream(&stream, split);
        assert_eq!(got, msgs, "split at byte {split}");
    }
}

pub(super) fn full_spec() -> WorkerSpec {
    WorkerSpec {
        id: "w-7".into(),
        role: Role::Prefill,
        device: DeviceClass::Cpu,
        model: "llama-3-70b".into(),
        dp_ranks: DpRanks { lo: 2, hi: 5 },
        taints: vec!["spot".into(), "zone-ü".into()],
        topology: "rack-3".into(),
        capacity_blocks: 123_456,
        epoch: 9,
        throughput_weight: None,
        url: None,
    }
}

pub(super) fn event_samples() -> Vec<EventMsg> {
    vec![
        EventMsg::Hello(EventHello {
            auth_token: "s3cret".into(),
            spec: full_spec(),
        }),
        EventMsg::Hello(EventHello {
            auth_token: String::new(),
            spec: WorkerSpec::new("a"),
        }),
        EventMsg::Stored {
            seq: 0,
            tier: Tier::Device,
            parent: None,
            hashes: HashList::from_slice(&[1, u64::MAX, 0x0123_4567_89ab_cdef]),
        },
        EventMsg::Stored {
            seq: 1,
            tier: Tier::Disk,
            parent: Some(42),
            hashes: HashList::default(),
        },
        EventMsg::Removed {
            seq: 2,
            tier: Tier::Host,
            hashes: HashList::from_slice(&[5, 6]),
        },
        EventMsg::Cleared { seq: 3, tier: None },
        EventMsg::Cleared {
            seq: 4,
            tier: Some(Tier::Host),
        },
        EventMsg::Heartbeat {
            seq: 5,
            active_requests: 3,
            waiting_requests: 1,
            kv_used_blocks: 100,
            kv_capacity_blocks: 1 << 20,
        },
        EventMsg::ResyncBegin { seq: 6 },
        EventMsg::ResyncEnd { seq: u64::MAX },
    ]
}

pub(super) fn worker_bound_samples() -> Vec<WorkerBound> {
    vec![
        WorkerBound::HelloAck {
            server_version: 1,
            next_seq: 77,
        },
        WorkerBound::Resync {
            reason: resync_reason::SEQUENCE_GAP,
        },
        WorkerBound::Resync { reason: 200 },
        WorkerBound::Error {
            code: ErrorCode::Unauthorized.as_u16(),
            message: "bad token ✗".into(),
        },
    ]
}

pub(super) fn full_route() -> Route {
    Route {
        corr: 11,
        request_id: "req-1".into(),
        model: "m".into(),
        mode: Some(Mode::DeviceAwareWeighted),
        explain: true,
        input_tokens: Some(300),
        expected_output_tokens: Some(64),
        allow: Some(vec!["w-1".into(), "w-2".into()]),
        pin: Some("w-2".into()),
        dp: Some((0, 3)),
        tolerations: vec!["spot".into()],
        lora_name: None,
        cache_salt: None,
        prompt: Prompt::from_hashes(&[9, 8, 7]),
    }
}

pub(super) fn request_samples() -> Vec<RequestMsg> {
    vec![
        RequestMsg::Hello {
            auth_token: "t".into(),
        },
        RequestMsg::Route(full_route()),
        RequestMsg::Route(Route::new(12, "r", Prompt::from_tokens(&[1, 2, u32::MAX]))),
        RequestMsg::Route(Route {
            allow: Some(vec![]),
            ..Route::new(13, "", Prompt::from_tokens(&[]))
        }),
        RequestMsg::Route(Route {
            lora_name: Some("sql-lora".into()),
            ..Route::new(17, "r", Prompt::from_tokens(&[1, 2, 3]))
        }),
        RequestMsg::Route(Route {
            lora_name: Some("sql".into()),
            cache_salt: Some("tenant-a".into()),
            ..Route::new(19, "r", Prompt::from_tokens(&[5]))
        }),
        RequestMsg::Route(Route {
            cache_salt: Some("tenant-b".into()),
            ..Route::new(20, "r", Prompt::from_tokens(&[6]))
        }),
        RequestMsg::Route(Route {
            lora_name: Some(String::new()),
            ..Route::new(18, "r", Prompt::from_hashes(&[4]))
        }),
        RequestMsg::Lifecycle {
            corr: 14,
            op: LifecycleOp::PrefillFailed,
            request_id: "req-1".into(),
            output_tokens: 0,
        },
        RequestMsg::Register {
            corr: 15,
            spec: full_spec(),
        },
        RequestMsg::Deregister {
            corr: 16,
            worker_id: "w-7".into(),
        },
    ]
}

pub(super) fn full_decision() -> Decision {
    let ov = Overlap {
        device: 1,
        host: 2,
        disk: 3,
        shared: 4,
    };
    Decision {
        corr: 11,
        request_id: "req-1".into(),
        decode_worker: "d-1".into(),
        prefill_worker: Some("p-1".into()),
        dp_rank: 2,
        overlap: ov,
        cost: 10.5,
        fallback: Fallback::None,
        candidates: vec![
            Candidate {
                worker: "p-1".into(),
                stage: Stage::Prefill,
                prefill_blocks: 10.0,
                overlap: ov,
                adjusted_prefill: 3.25,
                decode_blocks: 0.0,
                cost: 3.25,
            },
            Candidate {
                worker: "d-1".into(),
                stage: Stage::Decode,
                prefill_blocks: -0.0,
                overlap: Overlap::default(),
                adjusted_prefill: 0.0,
                decode_blocks: 7.5,
                cost: f64::INFINITY,
            },
        ],
    }
}

pub(super) fn response_samples() -> Vec<ResponseMsg> {
    vec![
        ResponseMsg::HelloAck { server_version: 1 },
        ResponseMsg::Decision(full_decision()),
        ResponseMsg::Decision(Decision {
            fallback: Fallback::PrefillFailed,
            ..Decision::default()
        }),
        ResponseMsg::Ack { corr: 3 },
        ResponseMsg::Error {
            corr: 4,
            code: ErrorCode::Overloaded.as_u16(),
            message: "slow down".into(),
        },
    ]
}
