//! Which upstream failures are retried on another worker, and the backoff.
//!
//! Only failures before the first response byte reached the client are retried (the
//! request can then be sent again whole): connect refused / timed out, a connection
//! reset or closed before the response head, no response head within the request
//! timeout, a 5xx status. Every one of them also counts against the worker's breaker.
//! A 4xx is the client's problem and is forwarded as is.

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
            Failure::NoUrl => "no_url",
        }
    }
}

/// Whether status `s` is a worker failure (retried) rather than an answer.
pub fn is_failure_status(s: u16) -> bool {
    (500..600).contains(&s)
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
}
