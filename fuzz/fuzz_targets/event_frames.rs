//! Fuzz target: arbitrary bytes as an event-protocol stream.
//!
//! Every frame the `FrameDecoder` yields is decoded as a worker → router `EventMsg` and
//! as a router → worker `WorkerBound`. Whatever decodes must re-encode to the very same
//! frame (the encoding is canonical) and decode again to an equal value. Any panic is a
//! bug: the codec must turn every byte string into a message, `Ok(None)` or an error.
#![no_main]

use bytes::BytesMut;
use kvroute::codec::{EventMsg, Frame, FrameDecoder, WorkerBound};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dec = FrameDecoder::new(64 * 1024);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = dec.decode(&mut buf) {
        if let Ok(msg) = EventMsg::decode(&frame) {
            let mut out = BytesMut::new();
            msg.encode(&mut out);
            let again = Frame::from_encoded(&out).expect("encoder wrote one frame");
            assert_eq!(again, frame, "EventMsg encoding is not canonical");
            assert_eq!(EventMsg::decode(&again).expect("re-decode"), msg);
            if let EventMsg::Stored { hashes, .. } | EventMsg::Removed { hashes, .. } = &msg {
                assert_eq!(hashes.iter().count(), hashes.len());
            }
        }
        if let Ok(msg) = WorkerBound::decode(&frame) {
            let mut out = BytesMut::new();
            msg.encode(&mut out);
            let again = Frame::from_encoded(&out).expect("encoder wrote one frame");
            assert_eq!(again, frame, "WorkerBound encoding is not canonical");
            assert_eq!(WorkerBound::decode(&again).expect("re-decode"), msg);
        }
    }
});
