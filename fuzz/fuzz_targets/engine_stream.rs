//! Fuzz target: arbitrary bytes through the engine message path — the ZMTP frame
//! decoder, multipart parsing, the stream state machine and the msgpack batch decoder
//! with the adapter behind it.
//!
//! Input: byte 0 picks the chunk size the stream is fed in (0 = all at once); the rest
//! is (a) a ZMTP byte stream after the greeting and (b) also a msgpack payload by
//! itself. Also tried as a greeting and as a command body.
//!
//! Checked:
//! - no panic anywhere; the decoder never consumes more than it was given and never
//!   holds more than the message limit; feeding the stream in chunks yields exactly the
//!   items (or the error) of feeding it byte by byte;
//! - every message goes through `parse_multipart` and `Session::live` / `replayed` /
//!   `replay_done` (replays driven by the stream itself, ended by an `END_SEQ`
//!   message); the adapter's invariants hold after every step and its map stays within
//!   its capacity;
//! - `decode_batch` and `for_each_event` agree on every payload.
#![no_main]

use kvroute::engines::adapter::Adapter;
use kvroute::engines::stream::{parse_multipart, Session, Step, END_SEQ};
use kvroute::engines::vllm::{decode_batch, for_each_event};
use kvroute::zmtp::codec::{parse_command, parse_greeting, Decoder, Item, Limits};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_message_bytes: 4096,
    max_frames: 4,
};

fn items(data: &[u8], chunk: usize) -> (Vec<Item>, bool) {
    let mut d = Decoder::new(LIMITS);
    let mut out = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        let mut rest = piece;
        while !rest.is_empty() {
            match d.decode(rest) {
                Ok((n, item)) => {
                    assert!(n <= rest.len(), "consumed more than given");
                    assert!(d.buffered() <= LIMITS.max_message_bytes);
                    rest = &rest[n..];
                    if let Some(i) = item {
                        out.push(i);
                    } else {
                        assert!(rest.is_empty(), "stopped early without an item");
                    }
                }
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fn check_batch(payload: &[u8]) {
    let a = decode_batch(payload);
    let mut n = 0;
    let b = for_each_event(payload, |_| n += 1);
    match (&a, &b) {
        (Ok(batch), Ok(s)) => {
            assert_eq!(batch.events.len(), n);
            assert_eq!(s.events, n);
            assert_eq!(batch.skipped, s.skipped);
        }
        (Err(x), Err(y)) => assert_eq!(x, y),
        _ => panic!("decode_batch and for_each_event disagree"),
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_greeting(data);
    let _ = parse_command(data);
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    check_batch(stream);
    let chunk = if chunk == 0 { stream.len() } else { chunk as usize };
    let (whole, err_whole) = items(stream, chunk);
    let (bytewise, err_bytewise) = items(stream, 1);
    assert_eq!(whole, bytewise, "chunking changed the items");
    assert_eq!(err_whole, err_bytewise, "chunking changed the outcome");

    let adapter = Adapter::new(4, 16, None).with_router_block_size(4);
    let mut s = Session::new(adapter, true, Some(0));
    let mut out = Vec::new();
    let mut replaying: Option<(u64, Vec<u8>)> = None;
    for item in whole {
        let Item::Message(frames) = item else {
            continue;
        };
        let Ok((seq, payload)) = parse_multipart(&frames) else {
            continue;
        };
        check_batch(payload);
        match replaying.take() {
            Some((live_seq, live_payload)) => {
                if seq == END_SEQ {
                    s.replay_done(payload.is_empty(), live_seq, &live_payload, &mut out);
                } else if s.replayed(seq, payload, &mut out) {
                    replaying = Some((live_seq, live_payload));
                } else {
                    s.replay_done(false, live_seq, &live_payload, &mut out);
                }
            }
            None => {
                if let Step::Replay { .. } = s.live(seq, payload, &mut out) {
                    replaying = Some((seq, payload.to_vec()));
                }
            }
        }
        s.adapter.check_invariants().expect("adapter invariants");
        assert!(s.adapter.len() <= 16);
        while s.notes.pop().is_some() {}
        out.clear();
    }
    if let Some((seq, payload)) = replaying {
        s.replay_done(false, seq, &payload, &mut out);
        s.adapter.check_invariants().expect("adapter invariants");
    }
});
