//! Per-worker circuit breaker (pure state machine; the driver keeps one per worker
//! per core and runs the probes).
//!
//! Closed: requests flow; `threshold` consecutive failures open it. Open: the worker
//! gets no proxied request for `open_ms`. Then the next routing attempt turns it
//! half-open and asks for one probe (`GET {url}/health`): success closes it, failure
//! reopens it for another `open_ms`. A success of a request in flight at any time
//! closes it too (the worker answered).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed {
        failures: u32,
    },
    Open {
        until_ms: u64,
    },
    /// A probe is running.
    HalfOpen,
}

/// What routing may do with the worker now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allow {
    Yes,
    No,
    /// No, and start the one probe now (the breaker is half-open from here).
    Probe,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    pub state: State,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            state: State::Closed { failures: 0 },
        }
    }
}

impl Breaker {
    pub fn allow(&mut self, now_ms: u64) -> Allow {
        match self.state {
            State::Closed { .. } => Allow::Yes,
            State::HalfOpen => Allow::No,
            State::Open { until_ms } if now_ms >= until_ms => {
                self.state = State::HalfOpen;
                Allow::Probe
            }
            State::Open { .. } => Allow::No,
        }
    }

    pub fn on_success(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    /// A failed request or probe; true if this opened the breaker.
    pub fn on_failure(&mut self, now_ms: u64, threshold: u32, open_ms: u64) -> bool {
        let open = State::Open {
            until_ms: now_ms.saturating_add(open_ms),
        };
        match self.state {
            State::Closed { failures } if failures + 1 >= threshold => {
                self.state = open;
                true
            }
            State::Closed { failures } => {
                self.state = State::Closed {
                    failures: failures + 1,
                };
                false
            }
            State::HalfOpen => {
                self.state = open;
                true
            }
            // Already open (a request sent before it opened failed too).
            State::Open { .. } => false,
        }
    }

    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_at_the_threshold_probes_after_the_interval_and_closes_on_success() {
        let mut b = Breaker::default();
        assert!(!b.on_failure(0, 3, 100));
        assert!(!b.on_failure(0, 3, 100));
        assert_eq!(b.allow(0), Allow::Yes);
        assert!(b.on_failure(10, 3, 100));
        assert_eq!(b.allow(50), Allow::No);
        assert_eq!(b.allow(110), Allow::Probe);
        // Half-open: one probe only.
        assert_eq!(b.allow(111), Allow::No);
        assert!(b.on_failure(120, 3, 100));
        assert_eq!(b.allow(200), Allow::No);
        assert_eq!(b.allow(220), Allow::Probe);
        b.on_success();
        assert_eq!(b.allow(221), Allow::Yes);
        assert!(b.is_closed());
    }

    #[test]
    fn a_success_resets_the_count() {
        let mut b = Breaker::default();
        b.on_failure(0, 2, 100);
        b.on_success();
        assert!(!b.on_failure(0, 2, 100));
        assert!(b.is_closed());
    }
}
