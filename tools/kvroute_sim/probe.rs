//! `kvroute-sim probe`: how often this machine stretches a short piece of work past a
//! bound while a benchmark runs on it. The control for a router's decision latency on
//! a shared machine (docs/PERFORMANCE.md, "Router-tier cost").
//!
//! One thread per CPU of `--cpus` (default: the process's affinity mask), pinned to it (as `kvroute serve` pins its cores).
//! Each wakes `--rate` times a second, runs `--work-us` of its own CPU time (a spin,
//! measured with `CLOCK_THREAD_CPUTIME_ID`) and records the wall time that took: any
//! excess is time the thread was runnable and not running, or stalled. A decision of
//! the same CPU length on the same CPUs at the same moment waits the same way, so the
//! probe's share over 1 ms is the floor of the decisions' share on that machine.
//!
//! Every second the summary so far is written to `--out` (JSON, replaced whole: a
//! reader never sees half a file): `samples`, `work_us`, `over_1ms` (a share),
//! `p50_us`, `p99_us`, `max_us`. Runs until killed, or for `--seconds`.
//!
//! Guarantees: at most `MAX_SAMPLES` samples are kept per thread (later ones are
//! counted, not stored); a CPU it may not run on is an error at start, not a silent
//! unpinned thread.

use clap::Args;
use kvroute::service::runtime::{cpu_clock, pinning};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Samples kept per thread (an hour at 250 a second).
pub const MAX_SAMPLES: usize = 1 << 20;

#[derive(Args)]
pub struct ProbeArgs {
    /// CPUs to run on, one pinned thread each (comma-separated; default: every CPU of
    /// the process's affinity mask).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// CPU time of each piece of work, µs.
    #[arg(long, default_value_t = 150)]
    work_us: u64,
    /// Pieces of work per second, per thread.
    #[arg(long, default_value_t = 50)]
    rate: u32,
    /// Where the summary is written every second (JSON).
    #[arg(long)]
    out: PathBuf,
    /// Stop after this many seconds (0: run until killed).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

pub fn run(a: ProbeArgs) -> Result<(), String> {
    if a.rate == 0 || a.work_us == 0 {
        return Err("--rate and --work-us must be positive".into());
    }
    let period = Duration::from_secs(1) / a.rate;
    let work = Duration::from_micros(a.work_us);
    if work >= period {
        return Err(format!(
            "--work-us {} leaves no idle time at --rate {}",
            a.work_us, a.rate
        ));
    }
    let cpus = if a.cpus.is_empty() {
        pinning::allowed_cpus()
    } else {
        a.cpus.clone()
    };
    if cpus.is_empty() {
        return Err("no CPU to run on (the affinity mask could not be read)".into());
    }
    let kept: Vec<Arc<Mutex<Vec<u32>>>> = cpus.iter().map(|_| Arc::default()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // The sampling threads end with this function (with `--seconds`), or with the
    // process.
    struct Stop(Arc<AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop = Stop(stop.clone());
    for (&cpu, samples) in cpus.iter().zip(&kept) {
        let (samples, stop) = (samples.clone(), stop.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("probe-{cpu}"))
            .spawn(move || {
                let pinned = pinning::pin_current_thread(cpu);
                let ok = pinned.is_ok();
                let _ = tx.send(pinned);
                if ok {
                    sample_loop(period, work, &samples, &stop);
                }
            })
            .map_err(|e| format!("probe thread: {e}"))?;
        rx.recv()
            .map_err(|_| format!("probe thread for CPU {cpu} ended"))??;
    }
    let start = Instant::now();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        write_summary(&a.out, a.work_us, &kept)?;
        if a.seconds > 0 && start.elapsed() >= Duration::from_secs(a.seconds) {
            return Ok(());
        }
    }
}

fn sample_loop(period: Duration, work: Duration, samples: &Mutex<Vec<u32>>, stop: &AtomicBool) {
    let mut next = Instant::now() + period;
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) {
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        next += period;
        let (wall0, cpu0) = (Instant::now(), cpu_clock::now());
        // The wall bound only guards against a CPU clock that does not advance.
        while cpu_clock::now().saturating_sub(cpu0) < work
            && wall0.elapsed() < Duration::from_secs(1)
        {
            for _ in 0..64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let wall = wall0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
        if let Ok(mut s) = samples.lock() {
            if s.len() < MAX_SAMPLES {
                s.push(wall);
            }
        }
        // A late wake-up does not bunch the next pieces together.
        let now = Instant::now();
        if next < now {
            next = now + period;
        }
    }
}

/// The summary of every thread's samples so far, written to `out` whole.
fn write_summary(
    out: &std::path::Path,
    work_us: u64,
    kept: &[Arc<Mutex<Vec<u32>>>],
) -> Result<(), String> {
    let mut all: Vec<u32> = Vec::new();
    for k in kept {
        if let Ok(s) = k.lock() {
            all.extend_from_slice(&s);
        }
    }
    let json = summary(all, work_us).to_string();
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, json).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, out).map_err(|e| format!("{}: {e}", out.display()))
}

/// The summary of wall times `all` (µs) of pieces of `work_us` of CPU.
fn summary(mut all: Vec<u32>, work_us: u64) -> serde_json::Value {
    all.sort_unstable();
    let q = |p: f64| {
        let i = ((all.len().saturating_sub(1)) as f64 * p).round() as usize;
        all.get(i).copied().unwrap_or(0)
    };
    let over = all.iter().filter(|&&w| w > 1000).count();
    serde_json::json!({
        "samples": all.len(),
        "work_us": work_us,
        "over_1ms": if all.is_empty() { 0.0 } else { over as f64 / all.len() as f64 },
        "p50_us": q(0.5),
        "p99_us": q(0.99),
        "max_us": all.last().copied().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_pieces_over_one_millisecond() {
        let mut walls: Vec<u32> = vec![150; 97];
        walls.extend([1000, 1001, 5000]);
        let s = summary(walls, 150);
        assert_eq!(s["samples"], 100);
        assert_eq!(s["over_1ms"], 0.02);
        assert_eq!(s["p50_us"], 150);
        assert_eq!(s["p99_us"], 1001);
        assert_eq!(s["max_us"], 5000);
        assert_eq!(summary(Vec::new(), 150)["over_1ms"], 0.0);
    }

    /// A piece takes at least its CPU time in wall time, and the summary file appears.
    #[test]
    fn a_short_run_writes_its_summary() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("p.json");
        run(ProbeArgs {
            cpus: vec![0],
            work_us: 100,
            rate: 100,
            out: out.clone(),
            seconds: 1,
        })
        .unwrap();
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert!(s["samples"].as_u64().unwrap() > 0, "{s}");
        assert!(s["p50_us"].as_u64().unwrap() >= 100, "{s}");
    }
}
