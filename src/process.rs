//! Stopping a child `kvroute serve` the way an operator would: SIGTERM (graceful
//! shutdown and shutdown snapshot), a bounded wait, then SIGKILL so a hung child never
//! outlives its parent. Shared by the load tools and the integration tests.

use std::process::Child;
use std::time::{Duration, Instant};

/// Sends SIGTERM to `child` (graceful shutdown); does not wait.
pub fn sigterm(child: &Child) {
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
}

/// Waits up to `grace` for `child` to exit, then kills it and reaps it.
pub fn wait_or_kill(child: &mut Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGTERM, then [`wait_or_kill`] with `grace`.
pub fn terminate(child: &mut Child, grace: Duration) {
    sigterm(child);
    wait_or_kill(child, grace);
}
