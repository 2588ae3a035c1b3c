//! Replica bookkeeping that decides, without I/O, what to do with the log:
//! - [`Dedup`]: whether a record from the stream is new (per origin incarnation and
//!   worker, sequence numbers only grow), so redeliveries and duplicates are no-ops;
//! - [`Health`]: the replica's cluster state machine — connecting, catching up
//!   (not ready), ready, degraded (NATS unreachable or publishes failing; still ready:
//!   routing goes on with the local state) — and what `/readyz` says about it.
//!
//! Guarantees: `Dedup` holds at most its capacity of (origin, worker) pairs; when it
//! forgets one, a later duplicate of that pair is applied again, which is harmless
//! because index changes are idempotent when replayed in order (a replayed suffix of
//! a worker's changes ends in the same state). A replica is ready once it has applied
//! the stream up to the last sequence the stream held when it first connected, and
//! stays ready from then on (a NATS outage degrades it, it does not unready it).

use std::collections::HashMap;

/// What a record from the stream is to its receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Published by this very incarnation: already applied when its ingest accepted it.
    Own,
    /// Seen before (redelivery, or a republish JetStream did not deduplicate).
    Duplicate,
    /// Apply it. `gap`: records of this (origin, worker) are missing before it (lost
    /// by the publisher's full buffer, or aged out of the stream).
    Apply { gap: bool },
}

/// Last sequence seen per (origin, worker).
pub struct Dedup {
    me: String,
    last: HashMap<(String, String), u64>,
    cap: usize,
}

impl Dedup {
    pub fn new(me: &str, cap: usize) -> Dedup {
        Dedup {
            me: me.to_string(),
            last: HashMap::new(),
            cap: cap.max(1),
        }
    }

    pub fn judge(&mut self, origin: &str, worker: &str, seq: u64) -> Verdict {
        if origin == self.me {
            return Verdict::Own;
        }
        let key = (origin.to_string(), worker.to_string());
        match self.last.get_mut(&key) {
            Some(last) if seq <= *last => Verdict::Duplicate,
            Some(last) => {
                let gap = seq > *last + 1;
                *last = seq;
                Verdict::Apply { gap }
            }
            None => {
                if self.last.len() >= self.cap {
                    // Bounded: forget everything (see the module doc for why it is safe).
                    self.last.clear();
                }
                self.last.insert(key, seq);
                // A first record seen mid-stream (catch-up from a snapshot) is no gap.
                Verdict::Apply { gap: false }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// The replica's cluster phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Never reached NATS since start: not ready (the log may hold what we lack).
    Connecting,
    /// Connected; applying the stream up to `target`.
    CatchingUp,
    /// Caught up and connected.
    Ready,
    /// Caught up once, NATS unreachable or publishes failing now: routing on local
    /// state, ingest applied locally and buffered for publication.
    Degraded,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Connecting => "connecting",
            Phase::CatchingUp => "catching_up",
            Phase::Ready => "ready",
            Phase::Degraded => "degraded",
        }
    }

    /// Gauge value of `kvroute_cluster_state`.
    pub fn code(self) -> i64 {
        match self {
            Phase::Connecting => 0,
            Phase::CatchingUp => 1,
            Phase::Ready => 2,
            Phase::Degraded => 3,
        }
    }
}

/// Inputs of the phase, as the driver observes them.
#[derive(Clone, Debug, Default)]
pub struct Health {
    pub connected: bool,
    /// The stream's last sequence when the replica first connected (`None` before).
    pub target: Option<u64>,
    /// Highest stream sequence applied (or skipped as own / duplicate).
    pub applied: u64,
    pub caught_up: bool,
    /// The last publish attempt failed (NATS up but JetStream refusing, or timeouts).
    pub publish_failing: bool,
    /// Records waiting to be published.
    pub backlog: u64,
    /// Records dropped because the publish buffer was full (reconciled by resync).
    pub dropped: u64,
    /// The peers' in-flight requests were taken over (load sync) at start.
    pub load_synced: bool,
}

impl Health {
    /// Connected and the stream's last sequence is known.
    pub fn on_connected(&mut self, stream_last: u64) {
        self.connected = true;
        if self.target.is_none() {
            self.target = Some(stream_last);
        }
        self.check();
    }

    pub fn on_disconnected(&mut self) {
        self.connected = false;
    }

    /// A stream record at `seq` was handled.
    pub fn on_applied(&mut self, seq: u64) {
        self.applied = self.applied.max(seq);
        self.check();
    }

    /// The stream has nothing past what was applied (an empty pull at the tail).
    pub fn on_tail(&mut self) {
        if self.target.is_some() && self.connected {
            self.caught_up = true;
        }
    }

    fn check(&mut self) {
        if let Some(t) = self.target {
            if self.applied >= t {
                self.caught_up = true;
            }
        }
    }

    pub fn phase(&self) -> Phase {
        if !self.caught_up || !self.load_synced {
            if self.target.is_none() {
                Phase::Connecting
            } else {
                Phase::CatchingUp
            }
        } else if !self.connected || self.publish_failing {
            Phase::Degraded
        } else {
            Phase::Ready
        }
    }

    /// `/readyz`: ready (200) once caught up with the log and the peers' load, with
    /// the detail either way.
    pub fn ready(&self) -> bool {
        self.caught_up && self.load_synced
    }

    pub fn detail(&self) -> serde_json::Value {
        let p = self.phase();
        serde_json::json!({
            "state": p.name(),
            "connected": self.connected,
            "applied_seq": self.applied,
            "catch_up_target": self.target,
            "publish_backlog": self.backlog,
            "publish_dropped": self.dropped,
            "publish_failing": self.publish_failing,
            "load_synced": self.load_synced,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_drops_own_duplicates_and_sees_gaps() {
        let mut d = Dedup::new("me/1", 8);
        assert_eq!(d.judge("me/1", "w", 1), Verdict::Own);
        assert_eq!(d.judge("a/1", "w", 5), Verdict::Apply { gap: false });
        assert_eq!(d.judge("a/1", "w", 5), Verdict::Duplicate);
        assert_eq!(d.judge("a/1", "w", 4), Verdict::Duplicate);
        assert_eq!(d.judge("a/1", "w", 6), Verdict::Apply { gap: false });
        assert_eq!(d.judge("a/1", "w", 9), Verdict::Apply { gap: true });
        // Another worker, another incarnation of the same replica: separate sequences.
        assert_eq!(d.judge("a/1", "v", 1), Verdict::Apply { gap: false });
        assert_eq!(d.judge("a/2", "w", 1), Verdict::Apply { gap: false });
        assert_eq!(d.len(), 3);
    }

    #[test]
    fn dedup_stays_bounded() {
        let mut d = Dedup::new("me", 4);
        for i in 0..100u64 {
            d.judge("a", &format!("w{i}"), 1);
            assert!(d.len() <= 4);
        }
    }

    #[test]
    fn phases() {
        let mut h = Health::default();
        assert_eq!(h.phase(), Phase::Connecting);
        assert!(!h.ready());
        h.on_connected(10);
        h.load_synced = true;
        assert_eq!(h.phase(), Phase::CatchingUp);
        h.on_applied(9);
        assert!(!h.ready());
        h.on_applied(10);
        assert_eq!(h.phase(), Phase::Ready);
        h.on_disconnected();
        assert_eq!(h.phase(), Phase::Degraded);
        assert!(h.ready(), "an outage degrades, it does not unready");
        // Reconnecting does not move the catch-up target.
        h.on_connected(500);
        assert_eq!(h.target, Some(10));
        assert_eq!(h.phase(), Phase::Ready);
        h.publish_failing = true;
        assert_eq!(h.phase(), Phase::Degraded);
    }

    #[test]
    fn not_ready_before_the_load_sync() {
        let mut h = Health::default();
        h.on_connected(0);
        assert_eq!(h.phase(), Phase::CatchingUp);
        assert!(!h.ready());
        h.load_synced = true;
        assert!(h.ready());
    }

    #[test]
    fn empty_stream_is_caught_up_at_once() {
        let mut h = Health {
            load_synced: true,
            ..Default::default()
        };
        h.on_connected(0);
        assert!(h.ready());
        let mut h = Health {
            load_synced: true,
            ..Default::default()
        };
        h.on_connected(7);
        h.on_tail();
        assert!(
            h.ready(),
            "records aged out below the target: the tail says done"
        );
    }
}
