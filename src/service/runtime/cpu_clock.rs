//! The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): what a core's thread
//! has run, excluding the time the OS ran something else on its CPU.
//!
//! It is the second control for the decision latency (`routing::router`): a
//! decision's own CPU time, measured around its synchronous steps, is the routing
//! work; its wall-clock time beyond that is waiting (another core's answer, or the
//! OS, as `schedule_lag` shows).
//!
//! Each reading is a system call (~1 µs, and a lock of the CPU's run queue), so the
//! decision measures itself on one decision in [`SAMPLE_EVERY`] per core
//! ([`sampled`]): three readings per request were ~3 % of the router's CPU at 64
//! connections.
//!
//! Guarantees: monotonic per thread; never fails visibly (an error reads as zero, a
//! kernel without the clock makes the control read zero, not the service fail).

use std::cell::Cell;
use std::time::Duration;

/// One call of [`sampled`] in this many per thread reads the clock.
pub const SAMPLE_EVERY: u32 = 8;

thread_local! {
    static TURN: Cell<u32> = const { Cell::new(0) };
}

/// [`now`] on one call in [`SAMPLE_EVERY`] on this thread (the first included), else
/// `None`.
pub fn sampled() -> Option<Duration> {
    let turn = TURN.with(|t| {
        let v = t.get();
        t.set(if v + 1 >= SAMPLE_EVERY { 0 } else { v + 1 });
        v
    });
    (turn == 0).then(now)
}

/// CPU time the calling thread has used so far.
pub fn now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_one_call_in_every_few() {
        let hits = (0..super::SAMPLE_EVERY * 5)
            .filter(|_| super::sampled().is_some())
            .count();
        assert_eq!(hits, 5);
    }

    #[test]
    fn counts_this_threads_work_and_not_its_sleep() {
        let t0 = super::now();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let slept = super::now() - t0;
        let mut x = 0u64;
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let worked = super::now() - t0 - slept;
        assert!(x > 0);
        assert!(slept < std::time::Duration::from_millis(15), "{slept:?}");
        assert!(worked > slept, "{worked:?} vs {slept:?}");
    }
}
