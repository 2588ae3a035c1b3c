//! One engine endpoint's event stream, sans I/O: sequence numbers, gaps, replay,
//! engine restarts, and the parsing of ZMQ multipart messages.
//!
//! Messages carry an 8-byte big-endian sequence number, from 0. For each live message
//! [`Session::live`] either applies it or asks the caller to replay from the first
//! missing sequence number; the caller then feeds the replayed messages to
//! [`Session::replayed`] and reports the end with [`Session::replay_done`], which also
//! handles the message that revealed the gap. Rules:
//! - the first message is accepted as the baseline; if it is not seq 0 and a replay
//!   endpoint exists, the buffered history is replayed first (initial sync);
//! - seq == expected: apply; seq < expected: duplicate (replay overlap), skipped;
//! - seq > expected: gap → replay if available, else the worker is cleared (counted)
//!   and the stream continues from this message;
//! - seq 0, or a jump back of more than [`RESTART_BACKJUMP`]: the engine restarted →
//!   clear the worker and continue from this message;
//! - the first message of a fresh connection ([`Session::reconnected`]) with seq below
//!   the expected one: the engine restarted while kvroute was away (it may have
//!   published seq 0 before kvroute reconnected) → clear the worker, then sync from
//!   the replay endpoint from seq 0 (its buffer still holds the new history), or, with
//!   none, continue from this message;
//! - a batch tagged with another data-parallel rank than the entry's `dp_rank` is
//!   refused (counted, noted once per worker: each rank publishes on the base port +
//!   its rank) and the driver shows the worker's engine warning ([`Session::dp_mismatch`]);
//! - a replay that fails (timeout, hole in the engine's buffer, no end marker) clears
//!   the worker unless nothing had been applied yet.
//!
//! Every gap, failed replay, restart, undecodable payload and block-size mismatch is
//! also recorded as a [`Note`] in [`Session::notes`] (bounded), saying what was done, for
//! the driver to log (rate-limited).

use super::adapter::{Adapter, Change};
use super::notes::{Note, Notes};
use super::vllm::for_each_event_if;

/// Sequence number of the replay end marker (-1 as 8 bytes big-endian).
pub const END_SEQ: u64 = u64::MAX;

/// A backwards jump larger than this is an engine restart, not a replay duplicate.
pub const RESTART_BACKJUMP: u64 = 1 << 16;

/// Counters of one stream (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamCounters {
    pub batches: u64,
    pub events: u64,
    pub skipped_events: u64,
    pub bad_payloads: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub replays: u64,
    pub replayed_batches: u64,
    pub replay_failures: u64,
    pub clears: u64,
    pub restarts: u64,
    pub dp_rank_mismatch: u64,
}

/// What the caller must do after a live message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Done,
    /// Replay from this sequence number, then call `replay_done`.
    Replay {
        from: u64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Replaying {
    expected: u64,
    initial: bool,
    hole: bool,
}

/// State of one endpoint's stream.
pub struct Session {
    next: Option<u64>,
    replay_available: bool,
    replaying: Option<Replaying>,
    applied_any: bool,
    dp_rank: Option<u32>,
    pub adapter: Adapter,
    pub counters: StreamCounters,
    /// What happened, in words, for the driver to log.
    pub notes: Notes,
    /// Why the current replay failed, as told by the driver (`set_replay_error`).
    replay_error: Option<&'static str>,
    /// Block-size mismatches already reported as notes.
    mismatch_noted: u64,
    /// Lookahead mismatches already reported as notes.
    lookahead_noted: u64,
    /// The unknown medium was reported (once per worker).
    medium_noted: bool,
    /// The next live message is the first of a new connection.
    fresh: bool,
    /// The rank of the last batch refused for its dp rank (None: the last was accepted
    /// or none was refused); the worker's engine warning.
    pub dp_mismatch: Option<u32>,
    dp_noted: bool,
}

impl Session {
    /// `dp_rank`: if set, batches announcing another rank are refused and counted.
    pub fn new(adapter: Adapter, replay_available: bool, dp_rank: Option<u32>) -> Session {
        Session {
            next: None,
            replay_available,
            replaying: None,
            applied_any: false,
            dp_rank,
            adapter,
            counters: StreamCounters::default(),
            notes: Notes::default(),
            replay_error: None,
            mismatch_noted: 0,
            lookahead_noted: 0,
            medium_noted: false,
            fresh: false,
            dp_mismatch: None,
            dp_noted: false,
        }
    }

    /// The driver opened a new connection to the engine: a first message whose sequence
    /// number is below the expected one then means the engine restarted (module docs).
    pub fn reconnected(&mut self) {
        self.fresh = true;
    }

    /// The driver's reason for a replay failure (connect failed, timed out, ...), used
    /// in the note `replay_done` records.
    pub fn set_replay_error(&mut self, why: &'static str) {
        self.replay_error.get_or_insert(why);
    }

    /// Next sequence number expected (None before the first message).
    pub fn next_seq(&self) -> Option<u64> {
        self.next
    }

    /// Forgets the stream position and the adapter state (the worker was re-registered).
    pub fn reset(&mut self) {
        self.next = None;
        self.replaying = None;
        self.applied_any = false;
        self.adapter.clear();
    }

    /// A message from the live (SUB) stream.
    pub fn live(&mut self, seq: u64, payload: &[u8], out: &mut Vec<Change>) -> Step {
        if seq == END_SEQ {
            self.counters.bad_payloads += 1;
            return Step::Done;
        }
        let fresh = std::mem::take(&mut self.fresh);
        match self.next {
            Some(n) if fresh && seq < n => {
                self.counters.restarts += 1;
                self.notes.push(Note::Restart {
                    expected: n,
                    got: seq,
                });
                self.clear(out);
                self.next = None;
                self.applied_any = false;
                if self.replay_available {
                    return self.start_replay(0, true);
                }
                self.apply(seq, payload, out);
                self.next = Some(seq + 1);
            }
            None => {
                if seq > 0 && self.replay_available {
                    return self.start_replay(0, true);
                }
                self.apply(seq, payload, out);
                self.next = Some(seq + 1);
            }
            Some(n) if seq == n => {
                self.apply(seq, payload, out);
                self.next = Some(seq + 1);
            }
            Some(n) if seq > n => {
                self.counters.gaps += 1;
                if self.replay_available {
                    self.notes.push(Note::Gap {
                        expected: n,
                        got: seq,
                        action: "replaying the missing messages",
                    });
                    return self.start_replay(n, false);
                }
                self.notes.push(Note::Gap {
                    expected: n,
                    got: seq,
                    action: "no replay endpoint: cleared the worker's blocks, continuing from this message",
                });
                self.clear(out);
                self.apply(seq, payload, out);
                self.next = Some(seq + 1);
            }
            Some(n) => {
                if seq == 0 || n - seq > RESTART_BACKJUMP {
                    self.counters.restarts += 1;
                    self.notes.push(Note::Restart {
                        expected: n,
                        got: seq,
                    });
                    self.clear(out);
                    self.apply(seq, payload, out);
                    self.next = Some(seq + 1);
                } else {
                    self.counters.duplicates += 1;
                }
            }
        }
        Step::Done
    }

    fn start_replay(&mut self, from: u64, initial: bool) -> Step {
        self.counters.replays += 1;
        self.replay_error = None;
        self.replaying = Some(Replaying {
            expected: from,
            initial,
            hole: false,
        });
        Step::Replay { from }
    }

    /// A replayed message (not the end marker). Returns false once the replay is
    /// unusable (a hole in the engine's buffer); the caller should stop and report.
    pub fn replayed(&mut self, seq: u64, payload: &[u8], out: &mut Vec<Change>) -> bool {
        let Some(mut r) = self.replaying else {
            return false;
        };
        if r.hole {
            return false;
        }
        if seq < r.expected {
            self.counters.duplicates += 1;
        } else if seq == r.expected || (r.initial && !self.applied_any) {
            // An initial sync may start wherever the engine's buffer starts.
            self.counters.replayed_batches += 1;
            self.apply(seq, payload, out);
            r.expected = seq + 1;
        } else {
            r.hole = true;
        }
        self.replaying = Some(r);
        !r.hole
    }

    /// End of a replay. `complete`: the end marker arrived. `seq`/`payload`: the live
    /// message that triggered it, handled now.
    pub fn replay_done(&mut self, complete: bool, seq: u64, payload: &[u8], out: &mut Vec<Change>) {
        let Some(r) = self.replaying.take() else {
            return;
        };
        let ok = complete && !r.hole && seq <= r.expected;
        if ok {
            if seq == r.expected {
                self.apply(seq, payload, out);
                self.next = Some(seq + 1);
            } else {
                self.counters.duplicates += 1;
                self.next = Some(r.expected);
            }
            return;
        }
        self.counters.replay_failures += 1;
        let why = if r.hole {
            "hole in the engine's replay buffer"
        } else if !complete {
            self.replay_error
                .unwrap_or("no end marker (timeout or connection lost)")
        } else {
            "the replay ended before the live message that revealed the gap"
        };
        self.notes.push(Note::ReplayFailed {
            from: if r.initial { 0 } else { r.expected },
            why,
            cleared: self.applied_any,
        });
        self.replay_error = None;
        if self.applied_any {
            self.clear(out);
        }
        self.apply(seq, payload, out);
        self.next = Some(seq + 1);
    }

    fn clear(&mut self, out: &mut Vec<Change>) {
        self.counters.clears += 1;
        self.adapter.clear();
        out.push(Change::Cleared { tier: None });
    }

    fn apply(&mut self, seq: u64, payload: &[u8], out: &mut Vec<Change>) {
        self.counters.batches += 1;
        let adapter = &mut self.adapter;
        let want = self.dp_rank;
        let accept = |got: Option<u32>| match (want, got) {
            (Some(w), Some(g)) => w == g,
            _ => true,
        };
        // Each event is applied as it is decoded: memory is one event, not the batch.
        let apply = |ev| {
            adapter.apply(&ev, out);
            super::vllm::recycle(ev);
        };
        match for_each_event_if(payload, accept, apply) {
            Ok(b) if b.refused => {
                self.counters.dp_rank_mismatch += 1;
                let got = b.dp_rank.unwrap_or_default();
                self.dp_mismatch = Some(got);
                if !std::mem::replace(&mut self.dp_noted, true) {
                    self.notes.push(Note::DpRankMismatch {
                        entry: want.unwrap_or_default(),
                        batch: got,
                    });
                }
            }
            Ok(b) => {
                self.dp_mismatch = None;
                self.counters.skipped_events += b.skipped as u64;
                self.counters.events += b.events as u64;
                self.applied_any = true;
                let m = self.adapter.stats.block_size_mismatch;
                if m > self.mismatch_noted {
                    self.mismatch_noted = m;
                    self.notes.push(Note::BlockSizeMismatch {
                        engine: self.adapter.last_mismatch,
                        router: self.adapter.router_block_size(),
                    });
                }
                let m = self.adapter.stats.lookahead_mismatch;
                if m > self.lookahead_noted {
                    self.lookahead_noted = m;
                    self.notes.push(Note::LookaheadMismatch {
                        engine: self.adapter.last_lookahead,
                        router: self.adapter.lookahead(),
                    });
                }
                if !self.medium_noted {
                    if let Some(m) = self.adapter.unknown_medium.clone() {
                        self.medium_noted = true;
                        self.notes.push(Note::UnknownMedium {
                            medium: m,
                            tier: self.adapter.unknown_tier().name(),
                        });
                    }
                }
            }
            Err(e) => {
                self.counters.bad_payloads += 1;
                self.notes.push(Note::BadPayload {
                    seq,
                    why: e.to_string(),
                });
            }
        }
    }
}

/// Why a multipart message was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    TooFewFrames,
    BadSeq,
}

/// `(seq, payload)` of a live `[topic, seq, payload]` message or a replayed
/// `[delimiter?, topic?, seq, payload]` one: the last two frames, whatever precedes them.
pub fn parse_multipart<F: AsRef<[u8]>>(frames: &[F]) -> Result<(u64, &[u8]), FrameError> {
    let n = frames.len();
    if n < 2 {
        return Err(FrameError::TooFewFrames);
    }
    let seq = frames[n - 2].as_ref();
    let seq: [u8; 8] = seq.try_into().map_err(|_| FrameError::BadSeq)?;
    Ok((u64::from_be_bytes(seq), frames[n - 1].as_ref()))
}

/// The replay request: the start sequence, 8 bytes big-endian.
pub fn replay_request(from: u64) -> [u8; 8] {
    from.to_be_bytes()
}
