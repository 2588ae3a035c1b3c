//! The scheduler slice of the cores' threads (`core_slice_us`): how long the kernel's
//! fair scheduler (EEVDF, Linux 6.12 and later) lets a core's thread run before a
//! waiting thread of the same machine takes its CPU, set per thread with
//! `sched_setattr` (`sched_runtime` of a normal, `SCHED_OTHER` thread; no privilege
//! needed). On a machine whose CPUs the router shares with its workers or clients,
//! a decision that starts late in a short slice is preempted for the other thread's
//! whole slice; a longer one lets the run that started with a request's arrival
//! finish (docs/PERFORMANCE.md "Token-id replay").
//!
//! Guarantees: only the calling thread changes, and only its slice (policy stays
//! `SCHED_OTHER`, nice 0); a kernel that refuses the call leaves the thread as it was,
//! and the error names the reason (the caller logs it and goes on). Kernels before
//! 6.12 accept the call and keep their own slice.

use crate::settings::CORE_SLICE_US;

/// `struct sched_attr` (include/uapi/linux/sched/types.h), its first version's size.
#[repr(C)]
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

/// Sets the calling thread's slice to `us` µs (`settings::CORE_SLICE_US`).
pub fn set_current(us: u64) -> Result<(), String> {
    if !CORE_SLICE_US.contains(&us) {
        return Err(format!("slice {us} µs: outside {CORE_SLICE_US:?}"));
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: 0,
        priority: 0,
        runtime: us * 1_000,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
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

/// Thread `tid`'s slice in µs as the kernel reports it (`sched_getattr`; 0 = the
/// calling thread), or `None` if the kernel reports none (before Linux 6.12 a normal
/// thread's `sched_runtime` reads 0) or refuses the call.
pub fn get(tid: i32) -> Option<u64> {
    let mut attr = SchedAttr {
        size: 0,
        policy: 0,
        flags: 0,
        nice: 0,
        priority: 0,
        runtime: 0,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
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
    (rc == 0 && attr.runtime != 0).then_some(attr.runtime / 1_000)
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
                Err(e) => assert!(e.starts_with("sched_setattr: "), "{e}"),
            }
        })
        .join()
        .unwrap();
    }
}
