//! Start-up checks of what glommio's executors need from the kernel and the process
//! limits, made before any executor starts: io_uring (the three system calls and the
//! opcodes glommio submits) and the locked-memory limit (`RLIMIT_MEMLOCK`).
//!
//! Guarantees: each check costs a few system calls (one ring of one entry, closed at
//! once) and never panics; a refusal is one line naming the cause and the fix, which
//! `kvroute serve` prints before it exits 2. Without these checks a container runtime's
//! default seccomp profile (Docker, containerd, podman and Kubernetes' `RuntimeDefault`
//! block io_uring) made every core panic inside glommio at start.

use std::io;

/// The soft `RLIMIT_MEMLOCK` glommio's reactor insists on (its `MIN_MEMLOCK_LIMIT`).
pub const MIN_MEMLOCK_BYTES: u64 = 512 << 10;

/// `IORING_REGISTER_PROBE`.
const REGISTER_PROBE: libc::c_uint = 8;
/// `IO_URING_OP_SUPPORTED` in a probe op's flags.
const OP_SUPPORTED: u16 = 1;
/// Probe ops asked for (the kernel fills at most this many).
const PROBE_OPS: usize = 256;

/// The io_uring opcodes glommio submits (`GLOMMIO_URING_OPS`), by number and name.
const GLOMMIO_OPS: &[(u8, &str)] = &[
    (0, "NOP"),
    (1, "READV"),
    (2, "WRITEV"),
    (3, "FSYNC"),
    (4, "READ_FIXED"),
    (5, "WRITE_FIXED"),
    (6, "POLL_ADD"),
    (7, "POLL_REMOVE"),
    (9, "SENDMSG"),
    (10, "RECVMSG"),
    (11, "TIMEOUT"),
    (12, "TIMEOUT_REMOVE"),
    (13, "ACCEPT"),
    (15, "LINK_TIMEOUT"),
    (16, "CONNECT"),
    (17, "FALLOCATE"),
    (18, "OPENAT"),
    (19, "CLOSE"),
    (21, "STATX"),
    (22, "READ"),
    (23, "WRITE"),
    (26, "SEND"),
    (27, "RECV"),
];

/// Runs every check: `Err` is the one-line refusal.
pub fn check() -> Result<(), String> {
    io_uring()?;
    memlock()
}

/// The fix for a refused io_uring system call, in one sentence.
const SECCOMP_FIX: &str = "in a container this is the runtime's default seccomp profile, \
     which blocks io_uring: run with the profile kvroute ships, deploy/seccomp/kvroute.json \
     (podman/docker --security-opt seccomp=kvroute.json; Kubernetes securityContext \
     seccompProfile type Localhost, see docs/DEPLOY.md)";

/// Sets up one ring, asks which opcodes it supports and enters it once.
fn io_uring() -> Result<(), String> {
    // `struct io_uring_params` is 120 bytes; zeroed asks for the defaults.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup reads and writes `params`, a live buffer of the size the
    // kernel expects; it returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            1 as libc::c_uint,
            params.as_mut_ptr(),
        )
    };
    if fd < 0 {
        return Err(refused("io_uring_setup", io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by the kernel and is owned here.
    let ring = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&ring);
    // `struct io_uring_probe`: a 16-byte header, then 8 bytes per op.
    let mut probe = vec![0u8; 16 + PROBE_OPS * 8];
    // SAFETY: the kernel writes at most 16 + nr_args * 8 bytes into `probe`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            fd,
            REGISTER_PROBE,
            probe.as_mut_ptr(),
            PROBE_OPS as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(refused("io_uring_register", io::Error::last_os_error()));
    }
    let missing: Vec<&str> = GLOMMIO_OPS
        .iter()
        .filter(|(op, _)| !op_supported(&probe, *op))
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "io_uring lacks operations kvroute needs ({}): the kernel is too old, Linux >= 5.8 is needed",
            missing.join(", ")
        ));
    }
    // Nothing to submit, nothing to wait for: returns 0 unless the call is refused.
    // SAFETY: io_uring_enter with no submissions and a null signal mask reads no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            fd,
            0 as libc::c_uint,
            0 as libc::c_uint,
            0 as libc::c_uint,
            std::ptr::null::<libc::sigset_t>(),
            0usize,
        )
    };
    if r < 0 {
        return Err(refused("io_uring_enter", io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether the probe reply marks opcode `op` supported.
fn op_supported(probe: &[u8], op: u8) -> bool {
    let last_op = probe[0];
    let i = 16 + op as usize * 8;
    op <= last_op
        && probe
            .get(i..i + 4)
            .is_some_and(|o| o[0] == op && u16::from_ne_bytes([o[2], o[3]]) & OP_SUPPORTED != 0)
}

/// The refusal line for io_uring system call `call` failing with `e`.
fn refused(call: &str, e: io::Error) -> String {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| s != "0");
    let why = match (e.raw_os_error(), disabled) {
        (Some(libc::EPERM), Some(v)) => format!(
            "the sysctl kernel.io_uring_disabled is {v}: set it to 0 (or add kvroute's group to kernel.io_uring_group when it is 1)"
        ),
        (Some(libc::ENOSYS) | Some(libc::EPERM), _) => SECCOMP_FIX.to_string(),
        _ => "kvroute needs io_uring (Linux >= 5.8)".to_string(),
    };
    format!("io_uring is not available: {call} failed: {e}; {why}")
}

/// Raises the soft locked-memory limit to the hard one (and the hard one to
/// [`MIN_MEMLOCK_BYTES`] when the process may), then checks it.
fn memlock() -> Result<(), String> {
    raise_memlock();
    let (soft, hard) = memlock_limits();
    if soft >= MIN_MEMLOCK_BYTES {
        return Ok(());
    }
    // Succeeds only with CAP_SYS_RESOURCE.
    let lim = libc::rlimit {
        rlim_cur: MIN_MEMLOCK_BYTES as libc::rlim_t,
        rlim_max: (hard as libc::rlim_t).max(MIN_MEMLOCK_BYTES as libc::rlim_t),
    };
    // SAFETY: setrlimit reads a live struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } == 0 {
        return Ok(());
    }
    Err(memlock_refusal(soft, hard))
}

/// `(soft, hard)` `RLIMIT_MEMLOCK` in bytes (`u64::MAX` for unlimited).
fn memlock_limits() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a live struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return (0, 0);
    }
    // `rlim_t` is narrower than u64 on some 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let bytes = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            v as u64
        }
    };
    (bytes(lim.rlim_cur), bytes(lim.rlim_max))
}

/// The refusal line for a locked-memory limit of `soft` (hard `hard`) bytes.
pub fn memlock_refusal(soft: u64, hard: u64) -> String {
    format!(
        "the locked-memory limit (RLIMIT_MEMLOCK) is {} KiB (hard limit {} KiB) and kvroute's \
         io_uring executors need at least {} KiB: raise it (ulimit -l {}; podman/docker \
         --ulimit memlock={}:{}; systemd LimitMEMLOCK={}K), or grant CAP_SYS_RESOURCE so \
         kvroute raises it itself",
        soft / 1024,
        hard / 1024,
        MIN_MEMLOCK_BYTES / 1024,
        MIN_MEMLOCK_BYTES / 1024,
        MIN_MEMLOCK_BYTES,
        MIN_MEMLOCK_BYTES,
        MIN_MEMLOCK_BYTES / 1024,
    )
}

/// Raises RLIMIT_MEMLOCK's soft limit to the hard limit (io_uring registers memory).
pub fn raise_memlock() {
    // SAFETY: plain libc calls on a stack-allocated struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_passes_and_the_probe_reads_its_reply() {
        // Tests run where kvroute serves: io_uring is there.
        check().unwrap();
        let mut probe = vec![0u8; 16 + PROBE_OPS * 8];
        probe[0] = 3;
        probe[16 + 3 * 8] = 3;
        probe[16 + 3 * 8 + 2] = OP_SUPPORTED as u8;
        assert!(op_supported(&probe, 3));
        assert!(!op_supported(&probe, 2), "not flagged");
        assert!(!op_supported(&probe, 4), "past last_op");
    }

    #[test]
    fn refusals_are_one_line_naming_the_fix() {
        let m = refused("io_uring_setup", io::Error::from_raw_os_error(libc::ENOSYS));
        assert!(m.contains("deploy/seccomp/kvroute.json"), "{m}");
        let m = memlock_refusal(64 << 10, 64 << 10);
        assert!(m.contains("64 KiB") && m.contains("ulimit -l 512"), "{m}");
        assert!(!m.contains('\n'));
    }
}
