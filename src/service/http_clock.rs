//! Deadlines of one HTTP connection, decided from what it is doing: pure, so the rules
//! are unit-tested here; `hyper_io` feeds it the connection's reads, writes and request
//! boundaries and fails a read or write that outlives its deadline.
//!
//! hyper 1's own `header_read_timeout` needs a `Send + Sync` timer, which glommio's are
//! not, and it has no keep-alive idle or body timeout; so the deadlines are enforced at
//! the I/O adapter, where every byte passes. The rules:
//! - **Head**: a request head must be complete `header_ms` after its first byte (for a
//!   connection's first request: after the connection opened), however slowly it
//!   trickles in: a slowloris client is cut at the deadline.
//! - **Idle**: a keep-alive connection with no new request for `idle_ms` after its last
//!   response left (the last byte written) is closed.
//! - **Body / response**: while a request is in progress, a read or a write that has made
//!   no progress for `body_ms` fails. Any byte moved resets it, so slow but steady
//!   uploads and downloads (a large `/metrics` to a slow scraper) are never cut.
//! - While the handler computes (no read or write waiting), nothing times out.

/// The three timeouts, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub header_ms: u64,
    pub idle_ms: u64,
    pub body_ms: u64,
}

/// Where the connection is between requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No byte of the next request yet, since `since_ms`; `first`: no request yet.
    Waiting { since_ms: u64, first: bool },
    /// Part of a request head has arrived; it must be complete by `since_ms +
    /// header_ms` (`since_ms`: its first byte, or the connection's opening).
    Head { since_ms: u64, first: bool },
    /// A request is being handled: from its complete head until its response body has
    /// been handed to hyper in full.
    Busy { since_ms: u64 },
}

/// What the connection did last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    pub phase: Phase,
    /// Last byte read / written (ms; 0 = never).
    pub last_read_ms: u64,
    pub last_write_ms: u64,
    /// Since when a write has been waiting for the socket, if one is.
    pub write_blocked_ms: Option<u64>,
}

impl Clock {
    /// A connection opened at `now_ms`.
    pub fn new(now_ms: u64) -> Clock {
        Clock {
            phase: Phase::Waiting {
                since_ms: now_ms,
                first: true,
            },
            last_read_ms: 0,
            last_write_ms: 0,
            write_blocked_ms: None,
        }
    }

    /// `n > 0` bytes were read at `now_ms`.
    pub fn on_read(&mut self, now_ms: u64) {
        self.last_read_ms = now_ms;
        if let Phase::Waiting { since_ms, first } = self.phase {
            self.phase = Phase::Head {
                since_ms: if first { since_ms } else { now_ms },
                first,
            };
        }
    }

    /// `n > 0` bytes were written at `now_ms`.
    pub fn on_write(&mut self, now_ms: u64) {
        self.last_write_ms = now_ms;
        self.write_blocked_ms = None;
    }

    /// A write found the socket full at `now_ms`.
    pub fn on_write_blocked(&mut self, now_ms: u64) {
        self.write_blocked_ms.get_or_insert(now_ms);
    }

    /// hyper handed a complete request head to the service.
    pub fn on_request(&mut self, now_ms: u64) {
        self.phase = Phase::Busy { since_ms: now_ms };
    }

    /// The response body has been taken by hyper in full (it may still be flushing).
    pub fn on_response_done(&mut self, now_ms: u64) {
        self.phase = Phase::Waiting {
            since_ms: now_ms,
            first: false,
        };
    }

    /// When a read still waiting must fail.
    pub fn read_deadline(&self, t: &Timeouts) -> u64 {
        match self.phase {
            Phase::Waiting {
                since_ms,
                first: true,
            } => since_ms + t.header_ms,
            // A response may still be leaving: idleness counts from its last byte.
            Phase::Waiting { since_ms, .. } => since_ms.max(self.last_write_ms) + t.idle_ms,
            Phase::Head { since_ms, .. } => since_ms + t.header_ms,
            Phase::Busy { since_ms } => since_ms.max(self.last_read_ms) + t.body_ms,
        }
    }

    /// When a write still waiting must fail (`None`: no write is waiting).
    pub fn write_deadline(&self, t: &Timeouts) -> Option<u64> {
        self.write_blocked_ms.map(|b| b + t.body_ms)
    }

    /// No request completed yet on this connection (its "handshake").
    pub fn before_first_request(&self) -> bool {
        matches!(
            self.phase,
            Phase::Waiting { first: true, .. } | Phase::Head { first: true, .. }
        )
    }

    /// Since when the connection has had no request in progress (`None`: one is).
    pub fn idle_since(&self) -> Option<u64> {
        match self.phase {
            Phase::Waiting { since_ms, .. } => Some(since_ms.max(self.last_write_ms)),
            Phase::Head { since_ms, .. } => Some(since_ms),
            Phase::Busy { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header_ms: 1000,
        idle_ms: 5000,
        body_ms: 2000,
    };

    #[test]
    fn first_head_counts_from_the_connection_and_trickling_does_not_extend_it() {
        let mut c = Clock::new(100);
        assert_eq!(c.read_deadline(&T), 1100);
        c.on_read(600);
        assert_eq!(c.read_deadline(&T), 1100);
        c.on_read(1000);
        assert_eq!(c.read_deadline(&T), 1100, "slowloris bytes do not help");
        assert!(c.before_first_request());
    }

    #[test]
    fn keep_alive_idle_then_next_head_from_its_first_byte() {
        let mut c = Clock::new(0);
        c.on_read(10);
        c.on_request(20);
        assert_eq!(c.idle_since(), None);
        c.on_response_done(30);
        c.on_write(40);
        assert!(!c.before_first_request());
        assert_eq!(c.read_deadline(&T), 40 + 5000);
        c.on_read(3000);
        assert_eq!(c.read_deadline(&T), 3000 + 1000);
    }

    #[test]
    fn steady_body_is_never_cut_but_a_stalled_one_is() {
        let mut c = Clock::new(0);
        c.on_read(1);
        c.on_request(2);
        for t in (500..20_000).step_by(1500) {
            c.on_read(t);
            assert!(c.read_deadline(&T) > t + 1000);
        }
        assert_eq!(c.read_deadline(&T), 18_500 + 2000);
    }

    #[test]
    fn a_slow_response_keeps_the_connection_while_bytes_move() {
        let mut c = Clock::new(0);
        c.on_request(1);
        c.on_response_done(2);
        c.on_write_blocked(3);
        assert_eq!(c.write_deadline(&T), Some(2003));
        c.on_write(1500);
        assert_eq!(c.write_deadline(&T), None);
        c.on_write_blocked(1600);
        c.on_write_blocked(2500);
        assert_eq!(c.write_deadline(&T), Some(3600));
        // Idle time counts from the last byte of the response.
        c.on_write(9000);
        assert_eq!(c.read_deadline(&T), 14_000);
    }
}
