//! Round trips of hand-picked messages: encode back to back, feed the stream split at
//! every byte boundary, decode, compare.

use bytes::BytesMut;

use super::*;

#[test]
fn event_messages_roundtrip_through_split_streams() {
    assert_stream_roundtrip(&event_samples());
}

#[test]
fn worker_bound_messages_roundtrip_through_split_streams() {
    assert_stream_roundtrip(&worker_bound_samples());
}

#[test]
fn request_messages_roundtrip_through_split_streams() {
    assert_stream_roundtrip(&request_samples());
}

#[test]
fn response_messages_roundtrip_through_split_streams() {
    assert_stream_roundtrip(&response_samples());
}

#[test]
fn byte_at_a_time_feeding_decodes_everything() {
    let msgs = event_samples();
    let stream: Vec<u8> = msgs.iter().flat_map(encoded).collect();
    let mut dec = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for b in stream {
        buf.extend_from_slice(&[b]);
        if let Some(f) = dec.decode(&mut buf).unwrap() {
            got.push(EventMsg::decode(&f).unwrap());
        }
    }
    assert_eq!(got, msgs);
}

#[test]
fn slice_encoders_match_the_enum_encoders() {
    let hashes = [3u64, 1 << 40, u64::MAX];
    let mut a = BytesMut::new();
    EventMsg::encode_stored(&mut a, 9, Tier::Host, Some(17), &hashes);
    EventMsg::encode_removed(&mut a, 10, Tier::Disk, &hashes);
    let mut b = BytesMut::new();
    EventMsg::Stored {
        seq: 9,
        tier: Tier::Host,
        parent: Some(17),
        hashes: HashList::from_slice(&hashes),
    }
    .encode(&mut b);
    EventMsg::Removed {
        seq: 10,
        tier: Tier::Disk,
        hashes: hashes[..].into(),
    }
    .encode(&mut b);
    assert_eq!(a, b);
}

#[test]
fn hash_list_is_a_zero_copy_view_of_the_frame() {
    let hashes: Vec<u64> = (0..64u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let mut buf = BytesMut::new();
    EventMsg::encode_stored(&mut buf, 0, Tier::Device, None, &hashes);
    let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
    let EventMsg::Stored { hashes: list, .. } = EventMsg::decode(&frame).unwrap() else {
        panic!("not a Stored");
    };
    assert_eq!(list.len(), 64);
    assert_eq!(list.get(5), Some(hashes[5]));
    assert_eq!(list.get(64), None);
    assert_eq!(list.get(usize::MAX), None);
    assert_eq!(list.iter().len(), 64);
    assert_eq!(list.iter().next_back(), hashes.last().copied());
    assert_eq!(list.to_vec(), hashes);
    // Same memory: the list's bytes are the tail of the frame payload.
    let payload = frame.payload.as_ptr_range();
    let items = list.as_le_bytes().as_ptr_range();
    assert_eq!(items.end, payload.end);
    assert_eq!(items.start as usize, payload.end as usize - 64 * 8);
}

#[test]
fn route_prompt_is_zero_copy_too() {
    let mut buf = BytesMut::new();
    RequestMsg::Route(Route::new(1, "r", Prompt::from_tokens(&[7, 8, 9]))).encode(&mut buf);
    let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
    let RequestMsg::Route(r) = RequestMsg::decode(&frame).unwrap() else {
        panic!("not a Route");
    };
    let Prompt::Tokens(t) = &r.prompt else {
        panic!("not tokens");
    };
    assert_eq!(t.to_vec(), vec![7, 8, 9]);
    assert_eq!(
        t.as_le_bytes().as_ptr_range().end,
        frame.payload.as_ptr_range().end
    );
}

#[test]
fn nan_cost_bits_survive() {
    let weird = f64::from_bits(0x7ff8_dead_beef_0001);
    let msg = ResponseMsg::Decision(Decision {
        cost: weird,
        ..Decision::default()
    });
    let frame = Frame::from_encoded(&encoded(&msg)).unwrap();
    let ResponseMsg::Decision(d) = ResponseMsg::decode(&frame).unwrap() else {
        panic!("not a Decision");
    };
    assert_eq!(d.cost.to_bits(), weird.to_bits());
}

#[test]
fn accessors_report_kind_seq_and_corr() {
    for m in event_samples() {
        let bytes = encoded(&m);
        assert_eq!(bytes[4], m.kind());
        assert_eq!(m.seq().is_none(), matches!(m, EventMsg::Hello(_)));
    }
    assert_eq!(EventMsg::ResyncEnd { seq: 5 }.seq(), Some(5));
    let corrs: Vec<Option<u64>> = request_samples().iter().map(|m| m.corr()).collect();
    assert_eq!(
        corrs,
        vec![
            None,
            Some(11),
            Some(12),
            Some(13),
            Some(17),
            Some(19),
            Some(20),
            Some(18),
            Some(14),
            Some(15),
            Some(16)
        ]
    );
    let corrs: Vec<Option<u64>> = response_samples().iter().map(|m| m.corr()).collect();
    assert_eq!(corrs, vec![None, Some(11), Some(0), Some(3), Some(4)]);
}

#[test]
fn error_codes_are_distinct_and_stable() {
    for (i, c) in ErrorCode::ALL.iter().enumerate() {
        assert_eq!(c.as_u16() as usize, i + 1);
        assert_eq!(ErrorCode::from_u16(c.as_u16()), Some(*c));
        assert!(!c.name().is_empty());
        assert!((400..600).contains(&c.http_status()));
    }
    assert_eq!(ErrorCode::from_u16(0), None);
    assert_eq!(ErrorCode::Overloaded.http_status(), 429);
}

#[test]
fn enum_byte_helpers_invert() {
    for v in 0..=255u8 {
        if let Some(op) = LifecycleOp::from_u8(v) {
            assert_eq!(op.as_u8(), v);
        }
        if let Some(f) = Fallback::from_u8(v) {
            assert_eq!(f.as_u8(), v);
        }
        if let Some(s) = Stage::from_u8(v) {
            assert_eq!(s.as_u8(), v);
        }
    }
    assert_eq!(LifecycleOp::from_u8(4), None);
    assert_eq!(Fallback::from_u8(4), None);
    assert_eq!(Stage::from_u8(3), None);
}

#[test]
fn the_spec_url_extension_roundtrips_and_is_absent_when_unset() {
    let mut with = full_spec();
    with.url = Some("http://10.0.0.5:8000".into());
    let msgs = vec![
        RequestMsg::Register {
            corr: 3,
            spec: with.clone(),
        },
        RequestMsg::Register {
            corr: 4,
            spec: full_spec(),
        },
    ];
    assert_stream_roundtrip(&msgs);
    assert_stream_roundtrip(&[EventMsg::Hello(EventHello {
        auth_token: "t".into(),
        spec: with.clone(),
    })]);
    // Unset: the old layout exactly (the frame ends after `spec.epoch`); set: one tag
    // byte and the string after it.
    let old = encoded(&msgs[1]);
    let new = encoded(&RequestMsg::Register {
        corr: 4,
        spec: with,
    });
    let url = b"http://10.0.0.5:8000";
    assert_eq!(new.len(), old.len() + 1 + 2 + url.len());
    assert!(new.ends_with(url));
    // An unknown extension tag is refused, not skipped.
    let mut bad = new.clone();
    let tag = bad.len() - url.len() - 3;
    assert_eq!(bad[tag], 0x01);
    bad[tag] = 0x7f;
    let mut dec = FrameDecoder::default();
    let mut buf = BytesMut::from(&bad[..]);
    let f = dec.decode(&mut buf).unwrap().unwrap();
    assert!(RequestMsg::decode(&f).is_err());
    // The URL tag twice is refused too: the last one winning would decode two byte
    // strings to one spec (the encoding must stay canonical; found by `event_frames`).
    let mut buf = BytesMut::from(&new[..]);
    let f = dec.decode(&mut buf).unwrap().unwrap();
    assert!(RequestMsg::decode(&f).is_ok());
    let mut twice = f.payload.to_vec();
    twice.extend_from_slice(&[0x01, 0, 0]);
    assert!(RequestMsg::decode(&Frame::new(f.kind, twice)).is_err());
}
