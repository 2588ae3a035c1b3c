//! A router restart in the middle of a real-time run ([`ServiceRouter`]), to measure
//! what a warm restart costs: decisions lost while the router is down, and the hit rate
//! right before and right after.
//!
//! At the planned model time the frontend asks a [`RouterRestart`] to stop the router
//! (gracefully) and start it again on the same addresses, then carries on:
//! - while the router is down, route calls fail (counted as lost decisions: those
//!   requests are never run), lifecycle calls are kept and replayed in order once the
//!   router is back (a frontend retries them), and cache events are dropped but
//!   remembered (each simulated worker keeps the set of blocks it holds);
//! - once the router is up again the frontend reconnects, and every worker reconnects
//!   with its unchanged epoch: if the router's resume point (`next_seq`) is not where
//!   the worker is, or events were dropped, the worker re-announces its blocks
//!   (`ResyncBegin`, `Stored`…, `ResyncEnd`, protocol §3.3).

use super::restart_plan::{Life, RestartStats};
use super::router_impls::ServiceRouter;
use crate::client::{EventPublisher, RequestClient};
use crate::types::Tier;
use std::time::{Duration, Instant};

/// How often a down router is probed (wall time).
const RETRY_EVERY: Duration = Duration::from_millis(10);

/// Most hashes per re-announced `Stored` frame (well under the 1 MiB frame limit).
const RESYNC_CHUNK: usize = 65_536;

impl ServiceRouter {
    /// What happened around the planned restart.
    pub fn restart_stats(&self) -> &RestartStats {
        &self.restart.stats
    }

    /// Begins the planned restart once model time reaches it; reconnects once the
    /// router is back.
    pub(super) fn restart_step(&mut self, now_us: u64) -> Result<(), String> {
        if self.restart.began.is_none() && self.restart.stats.at_us.is_none() {
            let due = self
                .restart
                .plan
                .as_ref()
                .is_some_and(|p| now_us >= p.at_us);
            if !due {
                return Ok(());
            }
            self.restart.stats.at_us = Some(now_us);
            if let Some(p) = self.restart.plan.as_mut() {
                if !p.restart.restarts() {
                    self.restart.stats.back_at_us = Some(now_us);
                    return Ok(());
                }
                p.restart.begin()?;
            }
            self.restart.began = Some(Instant::now());
        }
        let Some(began) = self.restart.began else {
            return Ok(());
        };
        if self
            .restart
            .last_try
            .is_some_and(|t| t.elapsed() < RETRY_EVERY)
        {
            return Ok(());
        }
        self.restart.last_try = Some(Instant::now());
        let up = match self.restart.plan.as_mut() {
            Some(p) => p.restart.is_up()?,
            None => true,
        };
        // Not up yet, or up but not answering yet: still down (calls are held or
        // lost, pacing goes on) until the bound.
        let res = if up {
            self.reconnect()
        } else {
            Err("not up".into())
        };
        if let Err(e) = res {
            if began.elapsed() > Duration::from_secs(120) {
                return Err(format!("the router did not come back within 120 s: {e}"));
            }
            return Ok(());
        }
        self.restart.stats.downtime_ms = began.elapsed().as_secs_f64() * 1e3;
        self.restart.stats.back_at_us = Some(now_us);
        self.restart.began = None;
        Ok(())
    }

    /// Reconnects the frontend and every worker (same epoch), re-announcing blocks where
    /// the router's resume point says events were lost; replays held lifecycle calls.
    fn reconnect(&mut self) -> Result<(), String> {
        if !self.restart.done.contains("") {
            self.api = RequestClient::connect(&self.api_addr, &self.auth_token)
                .map_err(|e| format!("reconnect frontend: {e}"))?;
            self.restart.done.insert(String::new());
        }
        let mut ids: Vec<String> = self.pubs.keys().cloned().collect();
        ids.sort();
        for id in ids {
            if self.restart.done.contains(&id) {
                continue;
            }
            let Some(p) = self.pubs.get_mut(&id) else {
                continue;
            };
            let before = p.conn.seq();
            p.conn = EventPublisher::connect(&self.events_addr, p.spec.clone(), &self.auth_token)
                .map_err(|e| format!("reconnect worker {id}: {e}"))?;
            if p.conn.seq() != before || p.lost {
                let mut blocks: Vec<u64> = p.blocks.iter().copied().collect();
                blocks.sort_unstable();
                p.conn.resync_begin();
                for chunk in blocks.chunks(RESYNC_CHUNK) {
                    p.conn.stored(Tier::Device, None, chunk);
                }
                p.conn.resync_end();
                p.lost = false;
                self.restart.stats.resyncs += 1;
            }
            p.conn
                .flush()
                .map_err(|e| format!("reconnect worker {id}: {e}"))?;
            self.restart.done.insert(id);
        }
        self.restart.done.clear();
        while let Some((op, id)) = self.restart.held.pop_front() {
            self.restart.stats.replayed_lifecycle += 1;
            if self.call(op, &id).is_err() {
                self.restart.stats.replay_failures += 1;
            }
        }
        Ok(())
    }

    fn call(&mut self, op: Life, id: &str) -> Result<(), String> {
        let replica = self.replica_of(id);
        if matches!(op, Life::Finish) {
            self.routed_on_forget(id);
        }
        let api = self.client(replica);
        match op {
            Life::FirstToken => api.first_token(id),
            Life::Progress(n) => api.progress(id, n),
            Life::Finish => api.finish(id),
        }
        .map_err(|e| e.to_string())
    }

    /// A lifecycle call now, or held for after the restart.
    pub(super) fn lifecycle(&mut self, op: Life, id: &str) -> Result<(), String> {
        if self.restart.is_down() {
            self.restart.held.push_back((op, id.to_string()));
            return Ok(());
        }
        self.call(op, id)
    }
}
