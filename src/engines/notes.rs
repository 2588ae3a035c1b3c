//! What happened on an engine stream, in words, and how often to say it.
//!
//! The sans-I/O [`Session`](super::stream::Session) records a [`Note`] for every event
//! an operator must hear about (a gap and what was done about it, a failed replay, a
//! payload that could not be decoded, events refused for a block-size mismatch); the
//! driver drains them and logs them through a [`LogLimiter`].
//!
//! Guarantees: the pending notes are bounded ([`MAX_PENDING`]; further ones are only
//! counted as suppressed); the limiter emits at most one line per reason per window and
//! reports how many of that reason it suppressed meanwhile, so a hostile or broken
//! engine cannot flood the log, and no reason ever goes unmentioned for longer than one
//! window while it keeps happening.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Notes kept between two drains; more are dropped (and counted by the limiter's caller
/// as suppressed).
pub const MAX_PENDING: usize = 64;

/// One thing worth a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// A sequence gap: `expected` was next, `got` arrived; `action` says what was done.
    Gap {
        expected: u64,
        got: u64,
        action: &'static str,
    },
    /// A replay from `from` did not complete; `cleared`: the worker's blocks were
    /// dropped as a result.
    ReplayFailed {
        from: u64,
        why: &'static str,
        cleared: bool,
    },
    /// The engine restarted (sequence went back); the worker was cleared.
    Restart { expected: u64, got: u64 },
    /// A payload at `seq` was not a decodable batch; it was skipped.
    BadPayload { seq: u64, why: String },
    /// `BlockStored` events carrying a block size other than the router's were refused.
    BlockSizeMismatch { engine: u32, router: u32 },
    /// `BlockStored` events whose lookahead differs from the router's were refused.
    LookaheadMismatch { engine: usize, router: usize },
    /// An event named a medium neither engine defines (said once per worker).
    UnknownMedium { medium: String, tier: &'static str },
    /// A batch of another data-parallel rank than the entry's was refused.
    DpRankMismatch { entry: u32, batch: u32 },
}

impl Note {
    /// A short stable key per kind of note (the rate-limit key).
    pub fn reason(&self) -> &'static str {
        match self {
            Note::Gap { .. } => "gap",
            Note::ReplayFailed { .. } => "replay_failed",
            Note::Restart { .. } => "restart",
            Note::BadPayload { .. } => "bad_payload",
            Note::BlockSizeMismatch { .. } => "block_size_mismatch",
            Note::LookaheadMismatch { .. } => "lookahead_mismatch",
            Note::UnknownMedium { .. } => "unknown_medium",
            Note::DpRankMismatch { .. } => "dp_rank_mismatch",
        }
    }

    /// The log line's text (without the worker prefix).
    pub fn describe(&self) -> String {
        match self {
            Note::Gap {
                expected,
                got,
                action,
            } => format!("sequence gap: expected {expected}, got {got}; {action}"),
            Note::ReplayFailed { from, why, cleared } => format!(
                "replay from {from} failed ({why}); {}",
                if *cleared {
                    "cleared the worker's blocks, continuing from the live stream"
                } else {
                    "nothing was applied yet, continuing from the live stream"
                }
            ),
            Note::Restart { expected, got } => format!(
                "engine restarted (expected seq {expected}, got {got}); cleared the worker's blocks"
            ),
            Note::BadPayload { seq, why } => {
                format!("malformed payload at seq {seq} skipped: {why}")
            }
            Note::BlockSizeMismatch { engine, router } => format!(
                "BlockStored with block_size {engine} but the router hashes blocks of {router} tokens; \
                 refused (set the router's block_size to the engine's)"
            ),
            Note::LookaheadMismatch { engine, router } => format!(
                "BlockStored with {engine} lookahead tokens per block but the router hashes \
                 {router} (lookahead_tokens); refused (set lookahead_tokens to the engine's)"
            ),
            Note::UnknownMedium { medium, tier } => format!(
                "medium {medium:?} is neither vLLM's nor SGLang's; its blocks are credited \
                 as {tier} (engine_unknown_medium_tier); counted as unknown_medium"
            ),
            Note::DpRankMismatch { entry, batch } => format!(
                "batch of data-parallel rank {batch} on the endpoint of rank {entry}; refused \
                 (each rank publishes on the base port + its rank: point this entry at the \
                 rank-{entry} port, or set its dp_rank to {batch})"
            ),
        }
    }
}

/// A bounded queue of notes.
#[derive(Debug, Default)]
pub struct Notes {
    q: VecDeque<Note>,
    /// Notes dropped because the queue was full (since the last drain).
    pub dropped: u64,
}

impl Notes {
    pub fn push(&mut self, n: Note) {
        if self.q.len() >= MAX_PENDING {
            self.dropped += 1;
        } else {
            self.q.push_back(n);
        }
    }

    pub fn pop(&mut self) -> Option<Note> {
        self.q.pop_front()
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    reason: &'static str,
    last: Instant,
    suppressed: u64,
}

/// At most one line per reason per `window` (one limiter per worker).
#[derive(Debug)]
pub struct LogLimiter {
    window: Duration,
    slots: Vec<Slot>,
}

impl LogLimiter {
    pub fn new(window: Duration) -> LogLimiter {
        LogLimiter {
            window,
            slots: Vec::new(),
        }
    }

    /// Whether a line for `reason` may be emitted at `now`; if so, how many lines of
    /// that reason were suppressed since the last one.
    pub fn allow(&mut self, reason: &'static str, now: Instant) -> Option<u64> {
        match self.slots.iter_mut().find(|s| s.reason == reason) {
            None => {
                self.slots.push(Slot {
                    reason,
                    last: now,
                    suppressed: 0,
                });
                Some(0)
            }
            Some(s) if now.saturating_duration_since(s.last) >= self.window => {
                let n = s.suppressed;
                s.last = now;
                s.suppressed = 0;
                Some(n)
            }
            Some(s) => {
                s.suppressed += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_reason_per_window_with_suppressed_count() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(Duration::from_secs(10));
        assert_eq!(l.allow("gap", t0), Some(0));
        assert_eq!(l.allow("bad_payload", t0), Some(0));
        for _ in 0..5 {
            assert_eq!(l.allow("gap", t0 + Duration::from_secs(1)), None);
        }
        assert_eq!(l.allow("gap", t0 + Duration::from_secs(10)), Some(5));
        let mut n = Notes::default();
        for i in 0..(MAX_PENDING as u64 + 3) {
            n.push(Note::BadPayload {
                seq: i,
                why: "x".into(),
            });
        }
        assert_eq!(n.len(), MAX_PENDING);
        assert_eq!(n.dropped, 3);
    }
}
