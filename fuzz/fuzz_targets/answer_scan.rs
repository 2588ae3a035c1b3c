//! Fuzz target: arbitrary bytes as an upstream answer, scanned for the lifecycle.
//!
//! Byte 0 picks the chunk size (1–128) and whether choices carry `delta` (an SSE
//! event) or `message` (a whole answer); the rest is one document, fed to
//! `proxy::jscan::Scan` chunk by chunk and, as SSE lines, to `proxy::track::Tracker`.
//! The scan must answer what `proxy::event::read` answers for the whole document
//! (or accept a number beyond f64's range that serde_json refuses, its one documented
//! difference), and nothing may panic.
#![no_main]

use kvroute::proxy::{event, jscan::Scan, track::Tracker};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, doc)) = data.split_first() else {
        return;
    };
    let size = usize::from(sel % 128) + 1;
    let delta = sel >= 128;
    let mut scan = Scan::new(delta);
    for chunk in doc.chunks(size) {
        scan.feed(chunk);
    }
    let got = scan.finish();
    let want = event::read(doc, delta);
    if got != want {
        let range = serde_json::from_slice::<serde_json::Value>(doc)
            .is_err_and(|e| e.to_string().contains("number out of range"));
        assert!(want.is_none() && range, "{got:?} != {want:?}");
    }
    // The same bytes as an SSE body and as a JSON body: never a panic.
    for sse in [true, false] {
        let mut t = Tracker::new(sse);
        for chunk in doc.chunks(size) {
            t.feed(chunk);
        }
        t.finish();
        let _ = t.tokens();
    }
});
