//! Reachability of a ZMQ engine's event endpoint (`[[engines]]`), which decides whether
//! its worker is routed to: in Kubernetes an engine pod is replaced or rescheduled, and
//! its DNS name points elsewhere or nowhere for a while.
//!
//! Guarantees: while the engine's subscription is up the worker is routable; once it
//! has been down (connection lost, or every connect attempt failing, the DNS name
//! included: `zmtp::Conn::connect` resolves the endpoint afresh on each attempt) for
//! `heartbeat_timeout_ms`, the worker is `down` (out of routing, `engine_issue` says
//! why in `GET /v1/workers`) until a subscription is up again, which brings it back
//! without anyone's help. Each transition is one log line.

use crate::service::runtime::shared::Shared;
use crate::types::WorkerSlot;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One engine's reachability, kept by its subscriber thread.
pub struct Reach {
    /// Since when no subscription has been up (from the thread's start).
    lost_at: Option<Instant>,
    /// Whether this thread last marked the worker down.
    down: bool,
    timeout: Duration,
}

impl Reach {
    pub fn new(timeout: Duration) -> Reach {
        Reach {
            lost_at: Some(Instant::now()),
            down: false,
            timeout,
        }
    }

    /// The subscription is up: the worker is routable. Returns the line to log when
    /// it was down.
    pub fn connected(&mut self, sh: &Shared, slot: WorkerSlot) -> Option<String> {
        let since = self.lost_at.take();
        if let Some(c) = sh.cells(slot) {
            c.engine_unreachable.store(false, Ordering::Release);
        }
        if !std::mem::take(&mut self.down) {
            return None;
        }
        let ms = since.map_or(0, |t| t.elapsed().as_millis());
        Some(format!("reachable again after {ms} ms: back in routing"))
    }

    /// The subscription is not up (lost, or a connect attempt failed): past the
    /// time-out the worker is down. Returns the line to log when it goes down.
    pub fn failed(&mut self, sh: &Shared, slot: WorkerSlot) -> Option<String> {
        let since = *self.lost_at.get_or_insert_with(Instant::now);
        if since.elapsed() < self.timeout {
            return None;
        }
        // Every time, not only at the transition: a removal and re-registration of
        // the worker meanwhile starts its cells afresh.
        if let Some(c) = sh.cells(slot) {
            c.engine_unreachable.store(true, Ordering::Release);
        }
        if std::mem::replace(&mut self.down, true) {
            return None;
        }
        Some(format!(
            "unreachable for {} ms: down (out of routing) until it answers again",
            since.elapsed().as_millis()
        ))
    }
}
