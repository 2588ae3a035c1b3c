//! Fuzz target: arbitrary bytes as a request-protocol stream.
//!
//! Every frame is decoded as a frontend → router `RequestMsg` and as a router →
//! frontend `ResponseMsg`; whatever decodes must re-encode to the same frame and decode
//! again to an equal value (NaN costs are compared bit for bit through the bytes).
#![no_main]

use bytes::BytesMut;
use kvroute::codec::{Frame, FrameDecoder, RequestMsg, ResponseMsg};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dec = FrameDecoder::new(64 * 1024);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = dec.decode(&mut buf) {
        if let Ok(msg) = RequestMsg::decode(&frame) {
            let mut out = BytesMut::new();
            msg.encode(&mut out);
            let again = Frame::from_encoded(&out).expect("encoder wrote one frame");
            assert_eq!(again, frame, "RequestMsg encoding is not canonical");
            assert_eq!(RequestMsg::decode(&again).expect("re-decode"), msg);
        }
        if let Ok(msg) = ResponseMsg::decode(&frame) {
            let mut out = BytesMut::new();
            msg.encode(&mut out);
            let again = Frame::from_encoded(&out).expect("encoder wrote one frame");
            // Byte equality covers NaN floats, which `==` on the message would not.
            assert_eq!(again, frame, "ResponseMsg encoding is not canonical");
            assert!(ResponseMsg::decode(&again).is_ok());
        }
    }
});
