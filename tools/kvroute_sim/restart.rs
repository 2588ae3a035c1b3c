//! `run --restart-at-secs`: the router the tool spawned is stopped (SIGTERM, graceful:
//! it writes its `--state-dir` snapshot) and started again on the same addresses and
//! state directory, on a helper thread while the run goes on; then the hit rate in a
//! window before the restart is compared with the same window after it.

use crate::runner::{Ports, Spawned};
use kvroute::config::Mode;
use kvroute::sim::{hit_rate_between, Report, RouterRestart};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Further attempts at starting the restarted router after a failed one.
const START_RETRIES: usize = 10;

/// Restarts a spawned router (see the module docs).
pub struct SpawnedRestart {
    pub bin: String,
    pub mode: Mode,
    pub knobs: Vec<(String, String)>,
    pub extra: Vec<String>,
    pub ports: Ports,
    /// The running router; replaced by the restarted one.
    pub current: Arc<Mutex<Option<Spawned>>>,
    up: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<String>>>,
}

impl SpawnedRestart {
    pub fn new(
        bin: &str,
        mode: Mode,
        knobs: &[(String, String)],
        extra: Vec<String>,
        ports: Ports,
        current: Arc<Mutex<Option<Spawned>>>,
    ) -> SpawnedRestart {
        SpawnedRestart {
            bin: bin.to_string(),
            mode,
            knobs: knobs.to_vec(),
            extra,
            ports,
            current,
            up: Arc::new(AtomicBool::new(false)),
            failed: Arc::new(Mutex::new(None)),
        }
    }
}

impl RouterRestart for SpawnedRestart {
    fn begin(&mut self) -> Result<(), String> {
        let (bin, mode, knobs) = (self.bin.clone(), self.mode, self.knobs.clone());
        let (extra, ports) = (self.extra.clone(), self.ports.clone());
        let (current, up, failed) = (self.current.clone(), self.up.clone(), self.failed.clone());
        std::thread::spawn(move || {
            // Dropping the old router sends SIGTERM and waits for it to exit.
            let old = current.lock().ok().and_then(|mut c| c.take());
            let t0 = std::time::Instant::now();
            drop(old);
            let stopped_ms = t0.elapsed().as_millis();
            if stopped_ms > 1000 {
                eprintln!("kvroute-sim: the router took {stopped_ms} ms to stop");
            }
            // A start can fail for a moment after the stop (a port still held); retry a
            // few times before giving up.
            let mut started = Spawned::start_on(&bin, mode, &knobs, &extra, &ports);
            for _ in 0..START_RETRIES {
                let Err(e) = &started else { break };
                eprintln!("kvroute-sim: restarting the router: {e}; retrying");
                std::thread::sleep(std::time::Duration::from_millis(200));
                started = Spawned::start_on(&bin, mode, &knobs, &extra, &ports);
            }
            match started {
                Ok(s) => {
                    if let Ok(mut c) = current.lock() {
                        *c = Some(s);
                    }
                    up.store(true, Ordering::Release);
                }
                Err(e) => {
                    if let Ok(mut f) = failed.lock() {
                        *f = Some(e);
                    }
                }
            }
        });
        Ok(())
    }

    fn is_up(&mut self) -> Result<bool, String> {
        if let Some(e) = self.failed.lock().ok().and_then(|mut f| f.take()) {
            return Err(format!("restarting the router: {e}"));
        }
        Ok(self.up.load(Ordering::Acquire))
    }
}

/// `--restart-dry-run`: the same measurement points without restarting (a baseline).
pub struct DryRun;

impl RouterRestart for DryRun {
    fn begin(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn is_up(&mut self) -> Result<bool, String> {
        Ok(true)
    }
    fn restarts(&self) -> bool {
        false
    }
}

/// The restart lines of the report: stats, and the hit rate in `window_us` of model
/// time before the restart and after the router was back.
pub fn summary(r: &Report, stats: &kvroute::sim::RestartStats, window_us: u64) -> String {
    let Some(at) = stats.at_us else {
        return format!("{}: the run ended before the planned restart", r.name());
    };
    let back = stats.back_at_us.unwrap_or(at);
    let (before, nb) = hit_rate_between(&r.hit_samples, at.saturating_sub(window_us), at);
    let (after, na) = hit_rate_between(&r.hit_samples, back, back.saturating_add(window_us));
    let s = |us: u64| us as f64 / 1e6;
    format!(
        "{name}: {what} at {at:.1} s (model), router back after {down:.0} ms wall (model {back:.1} s): \
         {lost} decisions lost, {rep} lifecycle calls replayed ({fail} refused), {rs} workers re-announced\n\
         {name}: hit rate {before:.1}% in [{b0:.1}, {at:.1}) s ({nb} req) vs {after:.1}% in [{back:.1}, {a1:.1}) s ({na} req); whole run {all:.1}%",
        name = r.name(),
        what = if stats.downtime_ms > 0.0 { "restart" } else { "no restart (dry run)" },
        at = s(at),
        down = stats.downtime_ms,
        back = s(back),
        lost = stats.lost_routes,
        rep = stats.replayed_lifecycle,
        fail = stats.replay_failures,
        rs = stats.resyncs,
        before = before * 100.0,
        b0 = s(at.saturating_sub(window_us)),
        after = after * 100.0,
        a1 = s(back.saturating_add(window_us)),
        all = r.hit_rate * 100.0,
    )
}
