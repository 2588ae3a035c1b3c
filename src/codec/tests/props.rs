//! Property tests: arbitrary field values round-trip through split streams, and the
//! encoding is canonical (any payload that decodes re-encodes to the same bytes).

use bytes::BytesMut;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use super::*;

fn text() -> impl Strategy<Value = String> {
    ".{0,12}"
}

fn f64_no_nan() -> impl Strategy<Value = f64> {
    any::<u64>()
        .prop_map(f64::from_bits)
        .prop_filter("NaN != NaN", |f| !f.is_nan())
}

fn tier() -> impl Strategy<Value = Tier> {
    prop::sample::select(Tier::ALL.to_vec())
}

fn hashes() -> impl Strategy<Value = HashList> {
    vec(any::<u64>(), 0..40).prop_map(HashList::from)
}

fn spec() -> impl Strategy<Value = WorkerSpec> {
    (
        (text(), 0..4u8, 0..2u8, text()),
        (any::<u32>(), any::<u32>(), vec(text(), 0..4), text()),
        (any::<u64>(), any::<u64>()),
    )
        .prop_map(
            |((id, role, dev, model), (lo, hi, taints, topo), (cap, epoch))| WorkerSpec {
                id,
                role: Role::from_u8(role).unwrap(),
                device: DeviceClass::from_u8(dev).unwrap(),
                model,
                dp_ranks: DpRanks { lo, hi },
                taints,
                topology: topo,
                capacity_blocks: cap,
                epoch,
                throughput_weight: None,
                url: None,
            },
        )
}

fn event() -> impl Strategy<Value = EventMsg> {
    prop_oneof![
        (text(), spec())
            .prop_map(|(auth_token, spec)| EventMsg::Hello(EventHello { auth_token, spec })),
        (any::<u64>(), tier(), option::of(any::<u64>()), hashes()).prop_map(
            |(seq, tier, parent, hashes)| EventMsg::Stored {
                seq,
                tier,
                parent,
                hashes
            }
        ),
        (any::<u64>(), tier(), hashes()).prop_map(|(seq, tier, hashes)| EventMsg::Removed {
            seq,
            tier,
            hashes
        }),
        (any::<u64>(), option::of(tier())).prop_map(|(seq, tier)| EventMsg::Cleared { seq, tier }),
        any::<(u64, u32, u32, u64, u64)>().prop_map(|(seq, a, w, u, c)| EventMsg::Heartbeat {
            seq,
            active_requests: a,
            waiting_requests: w,
            kv_used_blocks: u,
            kv_capacity_blocks: c
        }),
        any::<u64>().prop_map(|seq| EventMsg::ResyncBegin { seq }),
        any::<u64>().prop_map(|seq| EventMsg::ResyncEnd { seq }),
    ]
}

fn worker_bound() -> impl Strategy<Value = WorkerBound> {
    prop_oneof![
        any::<(u16, u64)>().prop_map(|(server_version, next_seq)| WorkerBound::HelloAck {
            server_version,
            next_seq
        }),
        any::<u8>().prop_map(|reason| WorkerBound::Resync { reason }),
        (any::<u16>(), text()).prop_map(|(code, message)| WorkerBound::Error { code, message }),
    ]
}

fn route() -> impl Strategy<Value = Route> {
    let prompt = prop_oneof![
        vec(any::<u32>(), 0..40).prop_map(|t| Prompt::from_tokens(&t)),
        vec(any::<u64>(), 0..40).prop_map(|h| Prompt::from_hashes(&h)),
    ];
    (
        (
            any::<u64>(),
            text(),
            text(),
            option::of(0..6u8),
            any::<bool>(),
        ),
        (option::of(any::<u32>()), option::of(any::<u32>())),
        (
            option::of(vec(text(), 0..3)),
            option::of(text()),
            option::of(any::<(u32, u32)>()),
        ),
        (vec(text(), 0..3), option::of(text()), prompt),
    )
        .prop_map(
            |(
                (corr, request_id, model, mode, explain),
                (isl, osl),
                (allow, pin, dp),
                (tol, lora_name, prompt),
            )| Route {
                corr,
                request_id,
                model,
                mode: mode.and_then(Mode::from_u8),
                explain,
                input_tokens: isl,
                expected_output_tokens: osl,
                allow,
                pin,
                dp,
                tolerations: tol,
                cache_salt: lora_name.as_ref().map(|l| format!("salt-{l}")),
                lora_name,
                prompt,
            },
        )
}

fn request() -> impl Strategy<Value = RequestMsg> {
    prop_oneof![
        text().prop_map(|auth_token| RequestMsg::Hello { auth_token }),
        route().prop_map(RequestMsg::Route),
        (any::<u64>(), 0..4u8, text(), any::<u32>()).prop_map(|(corr, op, request_id, n)| {
            RequestMsg::Lifecycle {
                corr,
                op: LifecycleOp::from_u8(op).unwrap(),
                request_id,
                output_tokens: n,
            }
        }),
        (any::<u64>(), spec()).prop_map(|(corr, spec)| RequestMsg::Register { corr, spec }),
        (any::<u64>(), text())
            .prop_map(|(corr, worker_id)| RequestMsg::Deregister { corr, worker_id }),
    ]
}

fn overlap() -> impl Strategy<Value = Overlap> {
    any::<(u32, u32, u32, u32)>().prop_map(|(device, host, disk, shared)| Overlap {
        device,
        host,
        disk,
        shared,
    })
}

fn candidate() -> impl Strategy<Value = Candidate> {
    (
        text(),
        0..3u8,
        f64_no_nan(),
        overlap(),
        f64_no_nan(),
        f64_no_nan(),
        f64_no_nan(),
    )
        .prop_map(
            |(worker, stage, prefill_blocks, overlap, adjusted_prefill, decode_blocks, cost)| {
                Candidate {
                    worker,
                    stage: Stage::from_u8(stage).unwrap(),
                    prefill_blocks,
                    overlap,
                    adjusted_prefill,
                    decode_blocks,
                    cost,
                }
            },
        )
}

fn response() -> impl Strategy<Value = ResponseMsg> {
    let decision = (
        (any::<u64>(), text(), text(), option::of(text())),
        (
            any::<u32>(),
            overlap(),
            f64_no_nan(),
            0..4u8,
            vec(candidate(), 0..4),
        ),
    )
        .prop_map(
            |(
                (corr, request_id, decode_worker, prefill_worker),
                (dp_rank, overlap, cost, fb, candidates),
            )| {
                ResponseMsg::Decision(Decision {
                    corr,
                    request_id,
                    decode_worker,
                    prefill_worker,
                    dp_rank,
                    overlap,
                    cost,
                    fallback: Fallback::from_u8(fb).unwrap(),
                    candidates,
                })
            },
        );
    prop_oneof![
        any::<u16>().prop_map(|server_version| ResponseMsg::HelloAck { server_version }),
        decision,
        any::<u64>().prop_map(|corr| ResponseMsg::Ack { corr }),
        (any::<u64>(), any::<u16>(), text()).prop_map(|(corr, code, message)| ResponseMsg::Error {
            corr,
            code,
            message
        }),
    ]
}

/// Round trip of a few messages through a stream split at `split` (scaled to length).
fn check_roundtrip<M: Msg>(msgs: &[M], split: usize) {
    let stream: Vec<u8> = msgs.iter().flat_map(encoded).collect();
    let split = split % (stream.len() + 1);
    assert_eq!(decode_stream::<M>(&stream, split), msgs);
}

/// If `payload` decodes as kind `k`, it must re-encode to exactly the same frame.
fn check_canonical<M: Msg>(k: u8, payload: &[u8]) {
    let frame = Frame::new(k, payload.to_vec());
    if let Ok(m) = M::dec(&frame) {
        let mut out = BytesMut::new();
        m.enc(&mut out);
        assert_eq!(Frame::from_encoded(&out), Some(frame));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn events_roundtrip(msgs in vec(event(), 1..4), split in any::<usize>()) {
        check_roundtrip(&msgs, split);
    }

    #[test]
    fn worker_bound_roundtrip(msgs in vec(worker_bound(), 1..4), split in any::<usize>()) {
        check_roundtrip(&msgs, split);
    }

    #[test]
    fn requests_roundtrip(msgs in vec(request(), 1..4), split in any::<usize>()) {
        check_roundtrip(&msgs, split);
    }

    #[test]
    fn responses_roundtrip(msgs in vec(response(), 1..4), split in any::<usize>()) {
        check_roundtrip(&msgs, split);
    }

    #[test]
    fn hash_list_chunks_concatenate_to_the_list(items in vec(any::<u64>(), 0..40), per in 0usize..9) {
        let list = HashList::from_slice(&items);
        let chunks: Vec<HashList> = list.chunks(per).collect();
        prop_assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= per.max(1)));
        let joined: Vec<u64> = chunks.iter().flat_map(|c| c.to_vec()).collect();
        prop_assert_eq!(joined, items);
    }

    #[test]
    fn arbitrary_payloads_never_panic_and_are_canonical(k in any::<u8>(), payload in vec(any::<u8>(), 0..64)) {
        check_canonical::<EventMsg>(k, &payload);
        check_canonical::<WorkerBound>(k, &payload);
        check_canonical::<RequestMsg>(k, &payload);
        check_canonical::<ResponseMsg>(k, &payload);
    }

    #[test]
    fn mutated_frames_never_panic_and_are_canonical(
        m in request(), r in response(), e in event(), at in any::<usize>(), v in any::<u8>()
    ) {
        for bytes in [encoded(&m), encoded(&r), encoded(&e)] {
            let f = Frame::from_encoded(&bytes).unwrap();
            if f.payload.is_empty() { continue; }
            let mut p = f.payload.to_vec();
            let i = at % p.len();
            p[i] = v;
            check_canonical::<EventMsg>(f.kind, &p);
            check_canonical::<RequestMsg>(f.kind, &p);
            check_canonical::<ResponseMsg>(f.kind, &p);
        }
    }
}
