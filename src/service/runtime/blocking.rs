//! The executors' blocking threads (glommio `spawn_blocking`: long tokenizations,
//! status-page builds) run below the executors' priority.
//!
//! Why: a blocking thread is unbound and shares the CPUs with the executors it serves.
//! At equal priority a multi-millisecond tokenization gets a full time slice while an
//! executor holding a stream's next chunk waits behind it (docs/PERFORMANCE.md, part 2:
//! ITL p99 ~9 → ~7 ms). At nice 10 (weight 110 against 1,024) the kernel lets the
//! executor preempt it at once, and the blocking work still gets whatever CPU the
//! executors leave, so it is slowed under contention, never starved.
//!
//! Guarantees: every closure handed to [`run`] runs at that priority; one
//! `setpriority` per thread (the first closure it runs); a failure (a seccomp filter,
//! say) leaves the normal priority, which nothing depends on.

/// Nice value of a blocking thread.
pub const BLOCKING_NICE: i32 = 10;

/// Runs `f` on this executor's blocking thread (glommio `spawn_blocking`), below the
/// executors' priority. Every blocking job of the service goes through here.
pub async fn run<F, R>(f: F) -> R
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    glommio::executor()
        .spawn_blocking(move || {
            lower_priority_once();
            f()
        })
        .await
}

/// Lowers the calling thread's priority to [`BLOCKING_NICE`] the first time it runs
/// here ([`run`] calls it first in every closure).
fn lower_priority_once() {
    thread_local!(static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    DONE.with(|d| {
        if !d.replace(true) {
            // SAFETY: plain syscalls about the calling thread; no memory is passed.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                let _ = libc::setpriority(libc::PRIO_PROCESS, tid, BLOCKING_NICE);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_thread_runs_at_the_blocking_nice_value_once_lowered() {
        let nice = std::thread::spawn(|| {
            super::lower_priority_once();
            super::lower_priority_once();
            // SAFETY: reads the calling thread's nice value.
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::getpriority(libc::PRIO_PROCESS, tid)
            }
        })
        .join()
        .unwrap();
        // Without the call the thread keeps the process's nice value (0 in CI); a test
        // run already above nice 10 cannot go back down, hence `>=`.
        assert!(nice >= super::BLOCKING_NICE, "{nice}");
    }
}
