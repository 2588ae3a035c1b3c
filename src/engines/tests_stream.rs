//! Unit tests of the stream state machine (gaps, replay, restarts) and frame parsing.

use super::adapter::{Adapter, Change};
use super::stream::{parse_multipart, Session, Step, END_SEQ};
use super::tests::{batch_pos, ints, stored_pos, toks};
use rmpv::Value;

fn payload_store(hash: u64, base: u32) -> Vec<u8> {
    batch_pos(vec![stored_pos(
        ints(&[hash]),
        Value::Nil,
        &toks(4, base),
        4,
        None,
    )])
}

fn stored_count(out: &[Change]) -> usize {
    out.iter()
        .filter(|c| matches!(c, Change::Stored { .. }))
        .count()
}

#[test]
fn stream_without_replay_clears_on_gap_and_restart() {
    let mut s = Session::new(Adapter::new(4, 100, None), false, Some(0));
    let mut out = Vec::new();
    assert_eq!(s.live(5, &payload_store(1, 0), &mut out), Step::Done);
    assert_eq!(s.next_seq(), Some(6), "first message is the baseline");
    assert_eq!(s.live(6, &payload_store(2, 10), &mut out), Step::Done);
    assert_eq!(s.live(6, &payload_store(2, 10), &mut out), Step::Done);
    assert_eq!(s.counters.duplicates, 1);
    assert_eq!(s.live(9, &payload_store(3, 20), &mut out), Step::Done);
    assert_eq!(s.counters.gaps, 1);
    assert_eq!(s.counters.clears, 1);
    assert_eq!(out[2], Change::Cleared { tier: None });
    assert_eq!(s.adapter.len(), 1);
    assert_eq!(s.live(0, &payload_store(4, 30), &mut out), Step::Done);
    assert_eq!(s.counters.restarts, 1);
    assert_eq!(s.next_seq(), Some(1));
    assert_eq!(s.live(1, b"\x01garbage", &mut out), Step::Done);
    assert_eq!(s.counters.bad_payloads, 1);
    assert_eq!(
        s.next_seq(),
        Some(2),
        "a bad payload still consumes its sequence number"
    );
}

#[test]
fn stream_replays_gaps_and_skips_overlap() {
    let mut s = Session::new(Adapter::new(4, 100, None), true, None);
    let mut out = Vec::new();
    assert_eq!(s.live(0, &payload_store(1, 0), &mut out), Step::Done);
    assert_eq!(
        s.live(3, &payload_store(4, 30), &mut out),
        Step::Replay { from: 1 }
    );
    assert!(
        s.replayed(0, &payload_store(1, 0), &mut out),
        "overlap is skipped"
    );
    assert!(s.replayed(1, &payload_store(2, 10), &mut out));
    assert!(s.replayed(2, &payload_store(3, 20), &mut out));
    assert!(s.replayed(3, &payload_store(4, 30), &mut out));
    s.replay_done(true, 3, &payload_store(4, 30), &mut out);
    assert_eq!(s.next_seq(), Some(4));
    assert_eq!(stored_count(&out), 4);
    assert_eq!(s.counters.clears, 0);
    assert_eq!(
        (
            s.counters.gaps,
            s.counters.replays,
            s.counters.replayed_batches
        ),
        (1, 1, 3)
    );
    // Live messages that the replay already covered are duplicates.
    assert_eq!(s.live(3, &payload_store(4, 30), &mut out), Step::Done);
    assert_eq!(
        s.counters.duplicates, 3,
        "seq 0 in the replay, the trigger, then live 3"
    );
    // A replay whose buffer has a hole fails and clears the worker.
    assert_eq!(
        s.live(10, &payload_store(9, 90), &mut out),
        Step::Replay { from: 4 }
    );
    assert!(!s.replayed(7, &payload_store(8, 80), &mut out));
    s.replay_done(true, 10, &payload_store(9, 90), &mut out);
    assert_eq!(s.counters.replay_failures, 1);
    assert_eq!(s.counters.clears, 1);
    assert_eq!(s.next_seq(), Some(11));
    assert_eq!(s.adapter.len(), 1);
    // A timed-out replay (no end marker) also fails.
    assert_eq!(
        s.live(13, &payload_store(5, 50), &mut out),
        Step::Replay { from: 11 }
    );
    s.replay_done(false, 13, &payload_store(5, 50), &mut out);
    assert_eq!(s.counters.clears, 2);
}

#[test]
fn stream_initial_sync_replays_history() {
    let mut s = Session::new(Adapter::new(4, 100, None), true, None);
    let mut out = Vec::new();
    assert_eq!(
        s.live(7, &payload_store(8, 70), &mut out),
        Step::Replay { from: 0 }
    );
    // The engine's buffer starts at 5: accepted, the worker was empty anyway.
    assert!(s.replayed(5, &payload_store(6, 50), &mut out));
    assert!(s.replayed(6, &payload_store(7, 60), &mut out));
    s.replay_done(true, 7, &payload_store(8, 70), &mut out);
    assert_eq!(stored_count(&out), 3);
    assert_eq!(s.counters.clears, 0);
    assert_eq!(s.next_seq(), Some(8));
    // Initial sync that fails before applying anything does not clear.
    let mut s = Session::new(Adapter::new(4, 100, None), true, None);
    out.clear();
    assert_eq!(
        s.live(7, &payload_store(8, 70), &mut out),
        Step::Replay { from: 0 }
    );
    s.replay_done(false, 7, &payload_store(8, 70), &mut out);
    assert_eq!(s.counters.clears, 0);
    assert_eq!(stored_count(&out), 1);
}

#[test]
fn multipart_frames_parse_from_the_end() {
    let seq = 7u64.to_be_bytes();
    let live: [&[u8]; 3] = [b"", &seq, b"pay"];
    assert_eq!(parse_multipart(&live), Ok((7, &b"pay"[..])));
    let replay: [&[u8]; 4] = [b"", b"topic", &seq, b"pay"];
    assert_eq!(parse_multipart(&replay), Ok((7, &b"pay"[..])));
    let end = (-1i64).to_be_bytes();
    let e: [&[u8]; 3] = [b"", &end, b""];
    assert_eq!(parse_multipart(&e), Ok((END_SEQ, &b""[..])));
    let bad: [&[u8]; 2] = [b"abc", b"x"];
    assert!(parse_multipart(&bad).is_err());
    assert!(parse_multipart::<&[u8]>(&[]).is_err());
}

#[test]
fn notes_say_what_happened_and_what_was_done() {
    use super::notes::Note;
    let mut s = Session::new(Adapter::new(4, 100, None), false, None);
    let mut out = Vec::new();
    s.live(0, &payload_store(1, 0), &mut out);
    s.live(2, &payload_store(2, 10), &mut out);
    match s.notes.pop() {
        Some(Note::Gap {
            expected: 1,
            got: 2,
            action,
        }) => assert!(action.contains("cleared"), "{action}"),
        other => panic!("{other:?}"),
    }
    s.live(3, b"\xc1", &mut out);
    let n = s.notes.pop().expect("bad payload note");
    assert_eq!(n.reason(), "bad_payload");
    assert!(n.describe().contains("seq 3"), "{}", n.describe());
    // A mismatched block size: refused, counted, noted once per batch.
    let p = batch_pos(vec![stored_pos(
        ints(&[9]),
        Value::Nil,
        &toks(16, 0),
        16,
        None,
    )]);
    out.clear();
    s.live(4, &p, &mut out);
    assert!(out.is_empty(), "nothing stored: {out:?}");
    assert_eq!(s.adapter.stats.block_size_mismatch, 1);
    assert_eq!(
        s.notes.pop(),
        Some(Note::BlockSizeMismatch {
            engine: 16,
            router: 4
        })
    );
    // A failed replay names the driver's reason and says the worker was cleared.
    let mut r = Session::new(Adapter::new(4, 100, None), true, None);
    r.live(0, &payload_store(1, 0), &mut out);
    assert_eq!(
        r.live(2, &payload_store(2, 10), &mut out),
        Step::Replay { from: 1 }
    );
    r.set_replay_error("cannot connect to the replay endpoint");
    r.replay_done(false, 2, &payload_store(2, 10), &mut out);
    let notes: Vec<Note> = std::iter::from_fn(|| r.notes.pop()).collect();
    assert!(
        notes.contains(&Note::ReplayFailed {
            from: 1,
            why: "cannot connect to the replay endpoint",
            cleared: true
        }),
        "{notes:?}"
    );
}
