//! Fuzz target: arbitrary bytes as the payload of a `Hello` in both protocols.
//!
//! The handshake is the first thing an unauthenticated peer controls, so it gets its
//! own target: magic/version checks, the auth token and the whole `WorkerSpec` must
//! never panic, and an accepted `Hello` must re-encode to the same payload.
#![no_main]

use bytes::BytesMut;
use kvroute::codec::{kind, EventMsg, Frame, RequestMsg};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let ev = Frame::new(kind::EV_HELLO, data.to_vec());
    if let Ok(msg) = EventMsg::decode(&ev) {
        assert!(matches!(msg, EventMsg::Hello(_)));
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(Frame::from_encoded(&out).as_ref(), Some(&ev));
    }
    let rq = Frame::new(kind::RQ_HELLO, data.to_vec());
    if let Ok(msg) = RequestMsg::decode(&rq) {
        assert!(matches!(msg, RequestMsg::Hello { .. }));
        let mut out = BytesMut::new();
        msg.encode(&mut out);
        assert_eq!(Frame::from_encoded(&out).as_ref(), Some(&rq));
    }
});
