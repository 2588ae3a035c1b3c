//! Which upstream failures are retried on another worker, and the backoff.
//!
//! Only failures before the first response byte reached the client are retried (the
//! request can then be sent again whole): connect refused / timed out, a connection
//! reset or closed before the response head, no response head within the request
//! timeout, a 5xx status. Every one of them also counts against the worker's breaker.
//! A 429 is the worker saying it is at its limit (`Busy`): it is retried on another
//! worker like a 5xx but is no health failure (no breaker, the pool is kept), and when
//! every worker tried said so the client gets a 429 with `retry-after`, never a 502.
//! Any other 4xx is the client's problem and is forwarded as is.

use std::time::Duration;

/// An upstream failure before the response started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    Connect,
    ConnectTimeout,
    /// Reset / closed before the response head.
    Reset,
    /// No response head in time.
    Timeout,
    /// A 5xx answer.
    Status(u16),
    /// A 429 answer (the worker is at its limit), with its `retry-after` in seconds
    /// (1 when it gave none, at most [`MAX_RETRY_AFTER_S`]).
    Busy(u32),
    /// The worker has no usable URL.
    NoUrl,
}

impl Failure {
    /// Metric label (`kvroute_proxy_upstream_errors_total{kind}`).
    pub fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::ConnectTimeout => "connect_timeout",
            Failure::Reset => "reset",
            Failure::Timeout => "timeout",
            Failure::Status(_) => "status_5xx",
            Failure::Busy(_) => "busy",
            Failure::NoUrl => "no_url",
        }
    }
}

/// Whether status `s` is a worker failure (retried) rather than an answer.
pub fn is_failure_status(s: u16) -> bool {
    (500..600).contains(&s)
}

/// Whether the failure says the worker is overloaded rather than unhealthy (no
/// breaker failure, its pooled connections are kept).
pub fn is_busy(f: Failure) -> bool {
    matches!(f, Failure::Busy(_))
}

/// The longest `retry-after` passed on to a client (seconds).
pub const MAX_RETRY_AFTER_S: u32 = 60;

/// A worker's 429 as a [`Failure::Busy`], from its `retry-after` header value if it
/// has one in seconds (an HTTP date or garbage counts as absent: 1 s).
pub fn busy(retry_after: Option<&[u8]>) -> Failure {
    let s = retry_after
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(1);
    Failure::Busy(s.clamp(1, MAX_RETRY_AFTER_S))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub retries: u32,
    pub backoff_ms: u64,
}

impl Policy {
    /// The wait before attempt `attempt` (1 = the first retry): `backoff_ms` doubled
    /// per further retry, capped at 1 s; `None` once the retries are used up.
    pub fn backoff(&self, attempt: u32) -> Option<Duration> {
        if attempt == 0 || attempt > self.retries {
            return None;
        }
        let ms = self
            .backoff_ms
            .saturating_mul(1u64 << (attempt - 1).min(16))
            .min(1000);
        Some(Duration::from_millis(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_stops_after_the_retries() {
        let p = Policy {
            retries: 3,
            backoff_ms: 25,
        };
        assert_eq!(p.backoff(0), None);
        assert_eq!(p.backoff(1), Some(Duration::from_millis(25)));
        assert_eq!(p.backoff(3), Some(Duration::from_millis(100)));
        assert_eq!(p.backoff(4), None);
        let big = Policy {
            retries: 16,
            backoff_ms: 60_000,
        };
        assert_eq!(big.backoff(16), Some(Duration::from_millis(1000)));
        assert!(is_failure_status(503) && !is_failure_status(429));
        assert_eq!(Failure::Status(500).label(), "status_5xx");
    }

    #[test]
    fn a_workers_429_is_busy_with_a_bounded_retry_after() {
        assert_eq!(busy(None), Failure::Busy(1));
        assert_eq!(busy(Some(b" 7 ")), Failure::Busy(7));
        assert_eq!(busy(Some(b"0")), Failure::Busy(1));
        assert_eq!(busy(Some(b"86400")), Failure::Busy(MAX_RETRY_AFTER_S));
        assert_eq!(
            busy(Some(b"Wed, 21 Oct 2015 07:28:00 GMT")),
            Failure::Busy(1)
        );
        assert!(is_busy(Failure::Busy(3)) && !is_busy(Failure::Status(503)));
        assert_eq!(Failure::Busy(1).label(), "busy");
    }
}
