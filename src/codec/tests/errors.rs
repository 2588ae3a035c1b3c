//! Every way bytes can be wrong: truncation, oversize, bad UTF-8, count mismatch,
//! unknown kinds, trailing bytes, bad magic/version, out-of-range enum bytes, and
//! encode-side limits.

use bytes::{BufMut, BytesMut};

use super::*;

/// Decodes a frame, discarding the value.
type DecodeFn = fn(&Frame) -> Result<(), CodecError>;

/// Payloads of every sample message, with the decoder to use.
fn all_sample_frames() -> Vec<(Frame, DecodeFn)> {
    fn frames<M: Msg>(msgs: Vec<M>) -> Vec<(Frame, DecodeFn)> {
        msgs.iter()
            .map(|m| {
                let f = Frame::from_encoded(&encoded(m)).unwrap();
                let d: DecodeFn = |f| M::dec(f).map(|_| ());
                (f, d)
            })
            .collect()
    }
    let mut v = frames(event_samples());
    v.extend(frames(worker_bound_samples()));
    v.extend(frames(request_samples()));
    v.extend(frames(response_samples()));
    v
}

#[test]
fn every_truncation_is_incomplete_or_an_error_never_a_panic() {
    for (frame, decode) in all_sample_frames() {
        // A short stream: the frame decoder waits.
        let mut bytes = BytesMut::new();
        bytes.put_u32_le(frame.payload.len() as u32 + 1);
        bytes.put_u8(frame.kind);
        bytes.put_slice(&frame.payload);
        for n in 0..bytes.len() {
            let mut b = BytesMut::from(&bytes[..n]);
            assert_eq!(
                FrameDecoder::default().decode(&mut b),
                Ok(None),
                "prefix {n}"
            );
        }
        // A short payload inside a complete frame: the message decoder rejects it.
        for n in 0..frame.payload.len() {
            let cut = Frame::new(frame.kind, frame.payload.slice(..n));
            let err = decode(&cut).expect_err("a strict prefix must not decode");
            assert!(
                matches!(err, CodecError::Malformed { kind, .. } if kind == frame.kind),
                "kind {:#x} cut at {n}: {err}",
                frame.kind
            );
        }
        decode(&frame).unwrap();
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    for (frame, decode) in all_sample_frames() {
        let mut p = frame.payload.to_vec();
        p.push(0);
        let err = decode(&Frame::new(frame.kind, p)).unwrap_err();
        assert!(
            matches!(
                err,
                CodecError::Malformed {
                    problem: Problem::TrailingBytes(1) | Problem::CountMismatch { .. },
                    ..
                }
            ),
            "{err}"
        );
    }
    let f = Frame::new(kind::RS_ACK, vec![0; 9]);
    assert_eq!(
        ResponseMsg::decode(&f),
        Err(CodecError::Malformed {
            kind: kind::RS_ACK,
            offset: 8,
            field: "end of message",
            problem: Problem::TrailingBytes(1)
        })
    );
}

#[test]
fn each_decoder_accepts_exactly_its_own_kinds() {
    let mut accepted = [0usize; 4];
    for k in 0..=255u8 {
        let f = Frame::new(k, Vec::new());
        let known = [
            !matches!(EventMsg::decode(&f), Err(CodecError::UnknownKind(x)) if x == k),
            !matches!(WorkerBound::decode(&f), Err(CodecError::UnknownKind(x)) if x == k),
            !matches!(RequestMsg::decode(&f), Err(CodecError::UnknownKind(x)) if x == k),
            !matches!(ResponseMsg::decode(&f), Err(CodecError::UnknownKind(x)) if x == k),
        ];
        assert!(
            known.iter().filter(|&&b| b).count() <= 1,
            "kind {k:#x} is ambiguous"
        );
        for (i, b) in known.iter().enumerate() {
            accepted[i] += *b as usize;
        }
    }
    assert_eq!(accepted, [7, 3, 5, 4]);
}

#[test]
fn hash_count_must_match_the_remaining_bytes_exactly() {
    let mut p = BytesMut::new();
    p.put_u64_le(1); // seq
    p.put_u8(0); // tier
    p.put_u8(0); // no parent
    let head = p.len();
    for (count, items) in [(3u32, 2usize), (1, 2), (u32::MAX, 1), (0, 1), (2, 0)] {
        let mut q = BytesMut::from(&p[..]);
        q.put_u32_le(count);
        (0..items).for_each(|i| q.put_u64_le(i as u64));
        let err = EventMsg::decode(&Frame::new(kind::EV_STORED, q.freeze())).unwrap_err();
        assert_eq!(
            err,
            CodecError::Malformed {
                kind: kind::EV_STORED,
                offset: head,
                field: "hashes",
                problem: Problem::CountMismatch {
                    count: count as u64,
                    item_size: 8,
                    remaining: items * 8
                }
            }
        );
    }
    // A partial item is a mismatch too.
    let mut q = BytesMut::from(&p[..]);
    q.put_u32_le(1);
    q.put_slice(&[0; 7]);
    assert!(EventMsg::decode(&Frame::new(kind::EV_STORED, q.freeze())).is_err());
}

#[test]
fn string_list_count_larger_than_payload_fails_cheaply() {
    let mut p = BytesMut::new();
    p.put_u64_le(1); // corr
    p.put_u16_le(1);
    p.put_u8(b'r'); // request_id
    p.put_u16_le(0); // model
    p.put_slice(&[0, 0, 0, 0, 0, 0, 0]); // mode, explain, isl, osl, allow, pin, dp
    p.put_u16_le(u16::MAX); // tolerations count, but no strings follow
    let err = RequestMsg::decode(&Frame::new(kind::RQ_ROUTE, p.freeze())).unwrap_err();
    assert!(
        matches!(
            err,
            CodecError::Malformed {
                field: "tolerations",
                problem: Problem::Truncated { need: 2, have: 0 },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_utf8_names_the_field_and_offset() {
    let mut p = BytesMut::new();
    p.put_u64_le(5);
    p.put_u16_le(3);
    p.put_slice(&[b'o', 0xff, b'k']);
    let err = RequestMsg::decode(&Frame::new(kind::RQ_DEREGISTER, p.freeze())).unwrap_err();
    assert_eq!(
        err,
        CodecError::Malformed {
            kind: kind::RQ_DEREGISTER,
            offset: 10,
            field: "worker_id",
            problem: Problem::InvalidUtf8 { valid_up_to: 1 }
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("worker_id") && text.contains("offset 10"),
        "{text}"
    );
}

fn hello_payload(magic: &[u8; 4], version: u16) -> BytesMut {
    let mut p = BytesMut::new();
    p.put_slice(magic);
    p.put_u16_le(version);
    p.put_u16_le(0); // empty auth token
    p
}

#[test]
fn hello_checks_magic_then_version() {
    let f = Frame::new(kind::RQ_HELLO, hello_payload(b"KVRQ", 1).freeze());
    assert_eq!(
        RequestMsg::decode(&f),
        Ok(RequestMsg::Hello {
            auth_token: String::new()
        })
    );
    let f = Frame::new(kind::RQ_HELLO, hello_payload(b"KVRE", 1).freeze());
    assert!(matches!(
        RequestMsg::decode(&f),
        Err(CodecError::Malformed {
            field: "magic",
            problem: Problem::BadMagic(m),
            ..
        }) if &m == b"KVRE"
    ));
    let f = Frame::new(kind::RQ_HELLO, hello_payload(b"KVRQ", 2).freeze());
    assert_eq!(
        RequestMsg::decode(&f),
        Err(CodecError::UnsupportedVersion {
            got: 2,
            supported: 1
        })
    );
    // A v2 event Hello is rejected on its version even if the rest is unparseable.
    let f = Frame::new(kind::EV_HELLO, hello_payload(b"KVRE", 7).freeze());
    assert!(matches!(
        EventMsg::decode(&f),
        Err(CodecError::UnsupportedVersion { got: 7, .. })
    ));
}

/// Overwrites byte `at` of sample `msg`'s payload with `v` and decodes.
fn poke<M: Msg>(msg: &M, at: usize, v: u8) -> Result<M, CodecError> {
    let f = Frame::from_encoded(&encoded(msg)).unwrap();
    let mut p = f.payload.to_vec();
    p[at] = v;
    M::dec(&Frame::new(f.kind, p))
}

fn invalid(field: &'static str, offset: usize, v: u64) -> impl Fn(&CodecError) -> bool {
    move |e| {
        matches!(e, CodecError::Malformed { field: f, offset: o, problem: Problem::InvalidValue(x), .. }
            if *f == field && *o == offset && *x == v)
    }
}

#[test]
fn out_of_range_enum_and_flag_bytes_are_invalid_values() {
    let stored = EventMsg::Stored {
        seq: 1,
        tier: Tier::Host,
        parent: None,
        hashes: HashList::default(),
    };
    assert!(invalid("tier", 8, 3)(&poke(&stored, 8, 3).unwrap_err()));
    assert!(invalid("parent", 9, 2)(&poke(&stored, 9, 2).unwrap_err()));
    let cleared = EventMsg::Cleared {
        seq: 1,
        tier: Some(Tier::Disk),
    };
    assert!(invalid("tier", 9, 9)(&poke(&cleared, 9, 9).unwrap_err()));
    let reg = RequestMsg::Register {
        corr: 1,
        spec: WorkerSpec::new("ab"),
    };
    // corr 8 + id (2 + 2) → role at 12, device at 13.
    assert!(invalid("spec.role", 12, 4)(&poke(&reg, 12, 4).unwrap_err()));
    assert!(invalid("spec.device", 13, 2)(
        &poke(&reg, 13, 2).unwrap_err()
    ));
    let route = RequestMsg::Route(Route {
        mode: Some(Mode::Kv),
        ..Route::new(1, "", Prompt::from_tokens(&[]))
    });
    // corr 8, request_id 2, model 2 → mode flag at 12, mode at 13, explain at 14.
    assert!(invalid("mode", 13, 6)(&poke(&route, 13, 6).unwrap_err()));
    assert!(invalid("explain", 14, 2)(&poke(&route, 14, 2).unwrap_err()));
    let f = Frame::from_encoded(&encoded(&route)).unwrap();
    let kind_at = f.payload.len() - 5;
    // 0..=7 are prompt kinds (bit 0 hashes, bit 1 LoRA name, bit 2 salt); 8 is not.
    assert!(invalid("prompt_kind", kind_at, 8)(
        &poke(&route, kind_at, 8).unwrap_err()
    ));
    let life = RequestMsg::Lifecycle {
        corr: 1,
        op: LifecycleOp::Finish,
        request_id: String::new(),
        output_tokens: 0,
    };
    assert!(invalid("op", 8, 4)(&poke(&life, 8, 4).unwrap_err()));
    let dec = ResponseMsg::Decision(Decision::default());
    // corr 8, 2 × empty string 4, no prefill 1, dp 4, overlap 16, cost 8 → fallback 41.
    assert!(invalid("fallback", 41, 4)(&poke(&dec, 41, 4).unwrap_err()));
}

#[test]
fn oversized_frame_is_rejected_before_its_body_arrives() {
    let hashes = vec![7u64; 1000];
    let mut full = BytesMut::new();
    EventMsg::encode_stored(&mut full, 0, Tier::Device, None, &hashes);
    let mut dec = FrameDecoder::new(4096);
    let mut header_only = BytesMut::from(&full[..4]);
    assert_eq!(
        dec.decode(&mut header_only),
        Err(CodecError::Oversized {
            len: full.len() - 4,
            max: 4096
        })
    );
    assert_eq!(
        FrameDecoder::new(full.len() - 4)
            .decode(&mut full)
            .map(|f| f.is_some()),
        Ok(true)
    );
}

#[test]
fn documented_hash_capacity_of_a_default_frame_is_exact() {
    let fits = |n: usize, parent: Option<u64>| {
        let mut out = BytesMut::new();
        EventMsg::encode_stored(&mut out, 0, Tier::Device, parent, &vec![0; n]);
        FrameDecoder::default().decode(&mut out).is_ok()
    };
    assert!(fits(131_070, None) && !fits(131_071, None));
    assert!(fits(131_069, Some(1)) && !fits(131_070, Some(1)));
    let removed = |n: usize| {
        let mut out = BytesMut::new();
        EventMsg::encode_removed(&mut out, 0, Tier::Device, &vec![0; n]);
        out.len() - 4 <= DEFAULT_MAX_FRAME
    };
    assert!(removed(131_070) && !removed(131_071));
}

#[test]
fn too_large_fields_fail_to_encode_and_leave_the_buffer_alone() {
    let mut out = BytesMut::from(&b"prior"[..]);
    let long = "x".repeat(MAX_STRING_LEN + 1);
    let msg = RequestMsg::Deregister {
        corr: 1,
        worker_id: long.clone(),
    };
    assert_eq!(
        msg.try_encode(&mut out),
        Err(CodecError::TooLarge {
            field: "worker_id",
            len: MAX_STRING_LEN + 1,
            max: MAX_STRING_LEN
        })
    );
    assert_eq!(&out[..], b"prior");
    let mut spec = WorkerSpec::new("w");
    spec.taints = vec![String::new(); 70_000];
    let hello = EventMsg::Hello(EventHello {
        auth_token: String::new(),
        spec,
    });
    assert!(matches!(
        hello.try_encode(&mut out),
        Err(CodecError::TooLarge {
            field: "spec.taints",
            ..
        })
    ));
    assert_eq!(&out[..], b"prior");
    // The longest legal string is fine.
    let ok = RequestMsg::Deregister {
        corr: 1,
        worker_id: long[1..].to_string(),
    };
    ok.try_encode(&mut out).unwrap();
    assert_eq!(out.len(), 5 + 4 + 1 + 8 + 2 + MAX_STRING_LEN);
}

#[test]
#[should_panic(expected = "cannot encode field `pin`")]
fn encode_panics_on_too_large_fields() {
    let route = Route {
        pin: Some("p".repeat(MAX_STRING_LEN + 1)),
        ..Route::new(1, "r", Prompt::from_tokens(&[]))
    };
    RequestMsg::Route(route).encode(&mut BytesMut::new());
}

#[test]
fn error_messages_are_truncated_at_a_char_boundary() {
    let message = "é".repeat(40_000); // 80 000 bytes
    for msg in [
        ResponseMsg::Error {
            corr: 1,
            code: 9,
            message: message.clone(),
        },
        ResponseMsg::Error {
            corr: 1,
            code: 9,
            message: format!("x{message}"),
        },
    ] {
        let f = Frame::from_encoded(&encoded(&msg)).unwrap();
        let ResponseMsg::Error { message: got, .. } = ResponseMsg::decode(&f).unwrap() else {
            panic!("not an Error");
        };
        assert!(got.len() <= MAX_STRING_LEN && got.len() >= MAX_STRING_LEN - 1);
        assert!(got.chars().skip(1).all(|c| c == 'é'));
    }
    let wb = WorkerBound::Error {
        code: 1,
        message: message.clone(),
    };
    let f = Frame::from_encoded(&encoded(&wb)).unwrap();
    assert!(WorkerBound::decode(&f).is_ok());
}

#[test]
fn error_codes_follow_the_protocol_table() {
    use crate::codec::ErrorCode;
    let hello = |magic: &[u8], version: u16| {
        let mut p = BytesMut::new();
        p.put_slice(magic);
        p.put_u16_le(version);
        p.put_u16_le(0);
        Frame::new(kind::RQ_HELLO, p.freeze())
    };
    let own = &kind::RESPONSES[..];
    let code = |f: &Frame| RequestMsg::decode(f).unwrap_err().error_code(own);
    assert_eq!(code(&hello(b"KVRX", 1)), ErrorCode::BadRequest);
    assert_eq!(code(&hello(b"KVRQ", 2)), ErrorCode::UnsupportedVersion);
    assert_eq!(
        code(&Frame::new(
            kind::RQ_ROUTE,
            bytes::Bytes::from_static(&[1, 2])
        )),
        ErrorCode::BadRequest
    );
    assert_eq!(
        code(&Frame::new(0x7f, bytes::Bytes::new())),
        ErrorCode::BadRequest
    );
    assert_eq!(
        code(&Frame::new(kind::RS_ACK, bytes::Bytes::new())),
        ErrorCode::ProtocolViolation
    );
    assert_eq!(
        CodecError::EmptyFrame.error_code(own),
        ErrorCode::BadRequest
    );
    assert_eq!(
        CodecError::Oversized { len: 9, max: 1 }.error_code(own),
        ErrorCode::BadRequest
    );
}
