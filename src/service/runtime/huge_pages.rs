//! Transparent huge pages, turned off for the process at start.
//!
//! With THP on (`always`, many distributions' default), the first touch of a 2 MiB
//! aligned range the allocator had never used, or had handed back, faults in and zeroes
//! a whole huge page. The router's memory churns in bursts (a long prompt's body and
//! ids, an engine event's token ids), so that zeroing lands on request and event paths:
//! on the token-id replay it was ~6 % of the router's CPU. With THP off a fault zeroes
//! only the 4 KiB page touched.
//!
//! Guarantees: one `prctl(PR_SET_THP_DISABLE)` before any executor starts, for every
//! thread of the process; it never fails the start (a kernel without the call keeps its
//! setting, and says so in one line). An operator who sets mimalloc's own
//! `MIMALLOC_ALLOW_THP` decides instead: then nothing is changed here.

/// Turns THP off for this process unless `MIMALLOC_ALLOW_THP` is set; returns whether
/// it did.
pub fn disable() -> bool {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return false;
    }
    // SAFETY: prctl with integer arguments only; no memory is passed.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r != 0 {
        eprintln!(
            "kvroute: transparent huge pages stay as the kernel sets them (prctl: {})",
            std::io::Error::last_os_error()
        );
    }
    r == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_reads_back_disabled() {
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            return;
        }
        assert!(super::disable());
        // SAFETY: prctl with integer arguments only.
        let now = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(now, 1);
    }
}
