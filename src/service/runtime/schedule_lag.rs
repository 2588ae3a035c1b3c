//! The schedule-lag probe: a timer task on each core that asks to wake every
//! [`PERIOD`] and records how late it actually ran, in
//! `kvroute_core_schedule_lag_seconds` (same buckets as the decision latency).
//!
//! It is the control for the decision latency: a routing task on a core waits for
//! the same things this timer waits for (the core's other tasks, a slice of ingest,
//! the OS running another thread on the core's CPU). When the two tails match, the
//! decision tail is the core's scheduling, not the routing work.
//!
//! Each tick also applies the messages other cores queued without waking this one
//! (`Core::catch_up`): a parked core's active blocks, which the status page reads,
//! are never more than a [`PERIOD`] behind (`GET /v1/workers` and `/metrics` wait
//! for every core's queue instead: `routing::control::applied_everywhere`).
//!
//! Guarantees: one wake-up per [`PERIOD`] per core (no busy loop); it stops once the
//! service is stopping.

use super::core::Core;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often the probe asks to wake: 10 samples a second per core, enough for a
/// p99 over a minute, while an idle core's wake-ups (each a pass through glommio's
/// rings, tens of µs) stay a small cost.
pub const PERIOD: Duration = Duration::from_millis(100);

/// Runs the probe on the calling core until the service stops.
pub async fn probe_loop(core: Rc<Core>) {
    let lag = &core.shared.metrics.schedule_lag;
    loop {
        let asked = Instant::now();
        glommio::timer::sleep(PERIOD).await;
        if core.shared.stopping.load(Ordering::Relaxed) {
            return;
        }
        lag.observe(late_by(asked.elapsed()).as_secs_f64());
        core.catch_up();
    }
}

/// How much later than [`PERIOD`] a wake-up that came `elapsed` after the ask ran.
fn late_by(elapsed: Duration) -> Duration {
    elapsed.saturating_sub(PERIOD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_is_what_exceeds_the_period() {
        assert_eq!(late_by(PERIOD), Duration::ZERO);
        assert_eq!(late_by(PERIOD / 2), Duration::ZERO);
        assert_eq!(
            late_by(PERIOD + Duration::from_micros(300)),
            Duration::from_micros(300)
        );
    }
}
