//! The scheduler slice of the cores' threads (`core_slice_us`): how long the kernel's
//! fair scheduler (EEVDF, Linux 6.12 and later) lets a core's thread run before a
//! waiting thread of the same machine takes its CPU, set per thread with
//! `sched_setattr` (`sched_runtime` of a normal, `SCHED_OTHER` thread; no privilege
//! needed). On a machine whose CPUs the router shares with its workers or clients,
//! a decision that starts late in a short slice is preempted for the other thread's
//! whole slice; a longer one lets the run that started with a request's arrival
//! finish (docs/PERFORMANCE.md "Token-id replay").
//!
//! Guarantees: only the calling thread changes, and only its slice (its policy and
//! nice value stay as they were); a kernel that refuses the call leaves it as it was,
//! and the error names the reason (the caller logs it and goes on). Kernels before
//! 6.12 accept the call and keep their own slice.

use crate::settings::CORE_SLICE_US;

/// `struct sched_attr` (include/uapi/linux/sched/types.h), its first version's size.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Thread `tid`'s scheduling attributes (`sched_getattr`; 0 = the calling thread).
fn read(tid: i32) -> Result<SchedAttr, String> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: `attr` is a live `sched_attr` of `size` bytes for the kernel to fill.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut attr as *mut SchedAttr,
            size,
            0,
        )
    };
    if rc != 0 {
        return Err(format!(
            "sched_getattr: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(attr)
}

/// Sets the calling thread's slice to `us` µs (`settings::CORE_SLICE_US`), keeping its
/// policy and nice value. Only a thread of the fair scheduler (`SCHED_OTHER`,
/// `SCHED_BATCH`) has such a slice; any other is left as it is, with an error.
pub fn set_current(us: u64) -> Result<(), String> {
    if !CORE_SLICE_US.contains(&us) {
        return Err(format!("slice {us} µs: outside {CORE_SLICE_US:?}"));
    }
    let mut attr = read(0)?;
    let policy = attr.policy as i32;
    if policy != libc::SCHED_OTHER && policy != libc::SCHED_BATCH {
        return Err(format!("policy {policy} is not the fair scheduler's"));
    }
    attr.size = std::mem::size_of::<SchedAttr>() as u32;
    attr.flags = 0;
    attr.runtime = us * 1_000;
    // SAFETY: `attr` is a live, fully initialised `sched_attr` whose `size` field
    // names its own size; pid 0 is the calling thread; flags 0.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if rc != 0 {
        return Err(format!(
            "sched_setattr: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Thread `tid`'s slice in µs as the kernel reports it (0 = the calling thread), or
/// `None` if the kernel reports none (before Linux 6.12 a normal thread's
/// `sched_runtime` reads 0) or refuses the call.
pub fn get(tid: i32) -> Option<u64> {
    let attr = read(tid).ok()?;
    (attr.runtime != 0).then_some(attr.runtime / 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_out_of_range_is_refused_before_the_kernel_sees_it() {
        assert!(set_current(CORE_SLICE_US.start() - 1).is_err());
        assert!(set_current(CORE_SLICE_US.end() + 1).is_err());
    }

    #[test]
    fn a_slice_in_range_is_set_on_a_thread_of_its_own() {
        // On a thread of its own, so the test runner's thread keeps its slice.
        std::thread::spawn(|| {
            // A sandbox may forbid the call; it must then say why, not panic.
            match set_current(3_000) {
                // A kernel that reports slices reports this one.
                Ok(()) => assert!(matches!(get(0), None | Some(3_000)), "{:?}", get(0)),
                Err(e) => assert!(e.starts_with("sched_"), "{e}"),
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_slice_leaves_the_threads_nice_value_as_it_was() {
        std::thread::spawn(|| {
            // SAFETY: gettid has no arguments; setpriority and getpriority name this
            // thread by its id (a higher nice value needs no privilege).
            let (before, after) = unsafe {
                let tid = libc::gettid() as libc::id_t;
                assert_eq!(libc::setpriority(libc::PRIO_PROCESS, tid, 5), 0);
                let before = libc::getpriority(libc::PRIO_PROCESS, tid);
                let set = set_current(3_000);
                (before, (set, libc::getpriority(libc::PRIO_PROCESS, tid)))
            };
            assert_eq!(before, 5);
            if after.0.is_ok() {
                assert_eq!(after.1, 5, "nice kept");
            }
        })
        .join()
        .unwrap();
    }
}
