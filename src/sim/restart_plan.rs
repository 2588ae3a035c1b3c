//! A router restart planned in the middle of a real-time run: how to restart
//! ([`RouterRestart`]), when ([`RestartPlan`]), what happened ([`RestartStats`]) and the
//! frontend's state while it happens ([`RestartState`]). A leaf of `sim`: the
//! real-time router ([`super::ServiceRouter`]) holds this state, and
//! `service_restart` carries the restart out.

use serde::Serialize;
use std::collections::VecDeque;
use std::time::Instant;

/// Stops and restarts the router the run talks to.
pub trait RouterRestart {
    /// Starts the restart (stop, then start on the same addresses); may return before
    /// the new router is up.
    fn begin(&mut self) -> Result<(), String>;
    /// Whether the restarted router accepts connections; errors if it failed to start.
    fn is_up(&mut self) -> Result<bool, String>;
    /// False for a dry run: the same measurement points, no restart (a baseline).
    fn restarts(&self) -> bool {
        true
    }
}

/// When to restart, and how.
pub struct RestartPlan {
    /// Model time (µs) of the restart: before the first timed call at or after it.
    pub at_us: u64,
    pub restart: Box<dyn RouterRestart>,
}

/// What happened around the restart.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RestartStats {
    /// Model time the restart began at (None: not reached).
    pub at_us: Option<u64>,
    /// Model time the router was reachable again.
    pub back_at_us: Option<u64>,
    /// Wall time the router was unreachable, ms.
    pub downtime_ms: f64,
    /// Route calls made while it was down (those requests got no answer).
    pub lost_routes: u64,
    /// Lifecycle calls held while it was down and replayed afterwards.
    pub replayed_lifecycle: u64,
    /// Replayed lifecycle calls the restarted router refused (e.g. unknown request).
    pub replay_failures: u64,
    /// Workers that re-announced their blocks on reconnect.
    pub resyncs: u64,
}

/// A lifecycle call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Life {
    FirstToken,
    Progress(u32),
    Finish,
}

/// The frontend's restart state.
#[derive(Default)]
pub struct RestartState {
    pub(super) plan: Option<RestartPlan>,
    pub(super) began: Option<Instant>,
    pub(super) last_try: Option<Instant>,
    /// Connections already re-established during this restart (the frontend's is
    /// `""`): a failed reconnect is retried without reconnecting them again.
    pub(super) done: std::collections::HashSet<String>,
    pub(super) held: VecDeque<(Life, String)>,
    pub stats: RestartStats,
}

impl RestartState {
    /// Between the start of the restart and the reconnect.
    pub fn is_down(&self) -> bool {
        self.began.is_some()
    }
}
