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
//!   downloads (a large `/metrics` to a slow scraper) are never cut.
//! - **Body rate**: a request body must also keep an average of `body_min_rate` bytes
//!   per second from its head, with one second of slack: a read still waiting for body
//!   bytes fails at `head + 1 s + bytes_so_far / rate`. A body trickled to hold the
//!   connection (a byte every few seconds) is cut after about a second; a real upload
//!   is orders of magnitude above the rate.
//! - While the handler computes (no read or write waiting), nothing times out.
//!
//! A read waiting while a request is in progress, before its response exists, is a
//! read of the request body: the servers run hyper with `half_close(true)`, so hyper
//! reads nothing else until the response is written. Such a connection is
//! [`Activity::Body`](crate::service::net::slots::Activity::Body) for its slot, displaceable for a
//! new connection (`slots`).

/// The three timeouts, in milliseconds, and the body rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub header_ms: u64,
    pub idle_ms: u64,
    pub body_ms: u64,
    /// Bytes per second a request body must average (0 = no rate rule).
    pub body_min_rate: u64,
}

/// Slack of the body rate: a body may start this long after its head.
pub const BODY_RATE_SLACK_MS: u64 = 1000;

/// Why a read failed at its deadline (a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Header,
    Idle,
    /// No byte for `body_ms`.
    BodyStalled,
    /// Behind the body rate.
    BodyTooSlow,
}

impl Expiry {
    pub fn label(self) -> &'static str {
        match self {
            Expiry::Header => "http_header_timeout",
            Expiry::Idle => "http_idle_timeout",
            Expiry::BodyStalled => "http_body_timeout",
            Expiry::BodyTooSlow => "http_body_too_slow",
        }
    }
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
    /// been handed to hyper in full. `body_bytes`: bytes read since the head;
    /// `responding`: the handler has produced its response (reads no longer carry its
    /// body).
    Busy {
        since_ms: u64,
        body_bytes: u64,
        responding: bool,
    },
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
    /// A read is waiting for the peer (cleared by the next byte read).
    pub read_waiting: bool,
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
            read_waiting: false,
        }
    }

    /// `n > 0` bytes were read at `now_ms`.
    pub fn on_read(&mut self, now_ms: u64, n: usize) {
        self.last_read_ms = now_ms;
        self.read_waiting = false;
        match self.phase {
            Phase::Waiting { since_ms, first } => {
                self.phase = Phase::Head {
                    since_ms: if first { since_ms } else { now_ms },
                    first,
                };
            }
            Phase::Busy {
                ref mut body_bytes, ..
            } => *body_bytes = body_bytes.saturating_add(n as u64),
            Phase::Head { .. } => {}
        }
    }

    /// A read found nothing to read and waits for the peer.
    pub fn on_read_waiting(&mut self) {
        self.read_waiting = true;
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
        self.phase = Phase::Busy {
            since_ms: now_ms,
            body_bytes: 0,
            responding: false,
        };
        self.read_waiting = false;
    }

    /// The handler produced its response: the request body is no longer being read.
    pub fn on_responding(&mut self) {
        if let Phase::Busy { responding, .. } = &mut self.phase {
            *responding = true;
        }
    }

    /// The response body has been taken by hyper in full (it may still be flushing).
    pub fn on_response_done(&mut self, now_ms: u64) {
        self.phase = Phase::Waiting {
            since_ms: now_ms,
            first: false,
        };
        self.read_waiting = false;
    }

    /// When a read still waiting must fail.
    pub fn read_deadline(&self, t: &Timeouts) -> u64 {
        self.read_expiry(t).0
    }

    /// When a read still waiting must fail, and why it would.
    pub fn read_expiry(&self, t: &Timeouts) -> (u64, Expiry) {
        match self.phase {
            Phase::Waiting {
                since_ms,
                first: true,
            } => (since_ms + t.header_ms, Expiry::Header),
            // A response may still be leaving: idleness counts from its last byte.
            Phase::Waiting { since_ms, .. } => {
                (since_ms.max(self.last_write_ms) + t.idle_ms, Expiry::Idle)
            }
            Phase::Head { since_ms, .. } => (since_ms + t.header_ms, Expiry::Header),
            Phase::Busy { since_ms, .. } => {
                let stalled = since_ms.max(self.last_read_ms) + t.body_ms;
                match self.body_due(t) {
                    Some(due) if due < stalled => (due, Expiry::BodyTooSlow),
                    _ => (stalled, Expiry::BodyStalled),
                }
            }
        }
    }

    /// While the request body is being read (a request in progress, no response yet):
    /// when the body falls behind `body_min_rate` unless more bytes come. `None`
    /// otherwise, or with no rate rule.
    pub fn body_due(&self, t: &Timeouts) -> Option<u64> {
        match self.phase {
            Phase::Busy {
                since_ms,
                body_bytes,
                responding: false,
            } if t.body_min_rate > 0 => {
                let earned = body_bytes.saturating_mul(1000) / t.body_min_rate;
                Some(
                    since_ms
                        .saturating_add(BODY_RATE_SLACK_MS)
                        .saturating_add(earned),
                )
            }
            _ => None,
        }
    }

    /// Reading a request body and waiting for the peer: the deadline the read fails
    /// at (`None` when the connection is doing anything else).
    pub fn waiting_for_body(&self, t: &Timeouts) -> Option<u64> {
        match self.phase {
            Phase::Busy {
                responding: false, ..
            } if self.read_waiting => Some(self.read_deadline(t)),
            _ => None,
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

    /// Since when the connection has had no request in progress (`None`: one is, or
    /// its last response is still leaving: a write waits for the socket). A connection
    /// displaced for being idle closes without flushing, so until its response is out
    /// it is not idle.
    pub fn idle_since(&self) -> Option<u64> {
        if self.write_blocked_ms.is_some() {
            return None;
        }
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
        body_min_rate: 0,
    };
    const RATE: Timeouts = Timeouts {
        body_min_rate: 1000,
        ..T
    };

    #[test]
    fn first_head_counts_from_the_connection_and_trickling_does_not_extend_it() {
        let mut c = Clock::new(100);
        assert_eq!(c.read_deadline(&T), 1100);
        c.on_read(600, 1);
        assert_eq!(c.read_deadline(&T), 1100);
        c.on_read(1000, 1);
        assert_eq!(c.read_deadline(&T), 1100, "slowloris bytes do not help");
        assert!(c.before_first_request());
    }

    #[test]
    fn keep_alive_idle_then_next_head_from_its_first_byte() {
        let mut c = Clock::new(0);
        c.on_read(10, 1);
        c.on_request(20);
        assert_eq!(c.idle_since(), None);
        c.on_response_done(30);
        c.on_write_blocked(31);
        assert_eq!(c.idle_since(), None, "its response is still leaving");
        c.on_write(40);
        assert_eq!(c.idle_since(), Some(40));
        assert!(!c.before_first_request());
        assert_eq!(c.read_deadline(&T), 40 + 5000);
        c.on_read(3000, 1);
        assert_eq!(c.read_deadline(&T), 3000 + 1000);
    }

    #[test]
    fn steady_body_is_never_cut_but_a_stalled_one_is() {
        let mut c = Clock::new(0);
        c.on_read(1, 1);
        c.on_request(2);
        for t in (500..20_000).step_by(1500) {
            c.on_read(t, 1);
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

    #[test]
    fn a_trickled_body_falls_behind_the_rate_and_a_real_upload_does_not() {
        let mut c = Clock::new(0);
        c.on_read(1, 1);
        c.on_request(10);
        // One byte earns 1 ms at 1000 B/s: the read fails a second after the head.
        c.on_read(500, 1);
        assert_eq!(c.read_expiry(&RATE), (1011, Expiry::BodyTooSlow));
        // Without a rate, only the stall timeout.
        assert_eq!(c.read_expiry(&T), (2500, Expiry::BodyStalled));
        // 64 KiB a second stays far ahead of the rate, the stall timeout binds.
        let mut up = Clock::new(0);
        up.on_request(0);
        for s in 1..30u64 {
            up.on_read(s * 1000, 64 << 10);
            let (d, why) = up.read_expiry(&RATE);
            assert_eq!((d, why), (s * 1000 + 2000, Expiry::BodyStalled));
        }
    }

    #[test]
    fn only_a_read_waiting_for_the_body_counts_as_reading_it() {
        let mut c = Clock::new(0);
        c.on_read(1, 100);
        c.on_request(2);
        assert_eq!(c.waiting_for_body(&RATE), None, "no read waiting yet");
        c.on_read_waiting();
        assert_eq!(c.waiting_for_body(&RATE), Some(1002));
        c.on_read(300, 1000);
        assert_eq!(c.waiting_for_body(&RATE), None);
        c.on_read_waiting();
        assert_eq!(c.waiting_for_body(&RATE), Some(2002));
        // Once the response exists, a read is no longer the body's, and no rate applies.
        c.on_responding();
        assert_eq!(c.waiting_for_body(&RATE), None);
        assert_eq!(c.body_due(&RATE), None);
        assert_eq!(c.read_expiry(&RATE), (2300, Expiry::BodyStalled));
        c.on_response_done(400);
        assert_eq!(c.waiting_for_body(&RATE), None);
    }
}
