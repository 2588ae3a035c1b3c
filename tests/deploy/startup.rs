//! Start-up of `kvroute serve` where platforms run it, through the real binary: io_uring
//! refused by a seccomp filter (as a container runtime's default profile does), a
//! locked-memory limit below glommio's minimum, cores that cannot start for lack of
//! file descriptors, and pinning under `taskset` (a cgroup cpuset's affinity mask).
//!
//! The seccomp filter and the limits are installed in the child between fork and exec
//! (`pre_exec`), so no container is needed; CI also runs the image under podman's
//! default profile (`.ci/container`).

use crate::common::run::{serve, Run, BIN};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// Asserts a refused start: exit code 2 within `within`, no panic, and a last line
/// starting `kvroute:` that contains every one of `needles`.
fn assert_refused(r: &mut Run, t0: Instant, within: Duration, needles: &[&str]) {
    let st = r.exit_or_listen(within);
    let err = r.stderr();
    assert_eq!(st.and_then(|s| s.code()), Some(2), "{err:?}");
    assert!(t0.elapsed() < within, "took {:?}", t0.elapsed());
    assert!(!err.iter().any(|l| l.contains("panicked")), "{err:?}");
    let last = err.last().cloned().unwrap_or_default();
    assert!(last.starts_with("kvroute: "), "{err:?}");
    for n in needles {
        assert!(last.contains(n), "{n:?} not in {last:?}");
    }
}

// --- a seccomp filter refusing io_uring, as a container runtime's default profile ---

const IO_URING_SETUP: u32 = 425;
const IO_URING_ENTER: u32 = 426;
const IO_URING_REGISTER: u32 = 427;
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump_eq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    // BPF_JMP | BPF_JEQ | BPF_K
    libc::sock_filter {
        code: 0x05 | 0x10,
        jt,
        jf,
        k,
    }
}

/// A classic-BPF seccomp program answering `errno` to the io_uring system calls in
/// `blocked` and allowing everything else.
fn filter(blocked: &[u32], errno: i32) -> Vec<libc::sock_filter> {
    // BPF_LD | BPF_W | BPF_ABS
    const LD_W_ABS: u16 = 0x20;
    const RET_K: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO: u32 = 0x0005_0000;
    let n = blocked.len() as u8;
    let mut p = vec![
        // seccomp_data.arch; another architecture (a compat call) is allowed.
        stmt(LD_W_ABS, 4),
        jump_eq(AUDIT_ARCH, 0, n + 1),
        // seccomp_data.nr
        stmt(LD_W_ABS, 0),
    ];
    for (i, nr) in blocked.iter().enumerate() {
        // Matched: jump to the ERRNO return after the ALLOW one.
        p.push(jump_eq(*nr, n - i as u8, 0));
    }
    p.push(stmt(RET_K, ALLOW));
    p.push(stmt(RET_K, ERRNO | (errno as u32 & 0xffff)));
    p
}

/// Installs `prog` in the child before exec (no_new_privs, then the filter).
fn with_seccomp(c: &mut Command, prog: Vec<libc::sock_filter>) {
    // SAFETY: the closure only makes two prctl calls (async-signal-safe) on memory
    // owned by the closure.
    unsafe {
        c.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn io_uring_refused_by_a_seccomp_filter_exits_2_naming_the_profile() {
    let all = [IO_URING_SETUP, IO_URING_ENTER, IO_URING_REGISTER];
    // ENOSYS is what podman's and containerd's default profiles answer; EPERM is
    // Docker's older one. A profile that lets the ring be set up but not entered or
    // probed is refused too.
    for (blocked, errno, call) in [
        (&all[..], libc::ENOSYS, "io_uring_setup"),
        (&all[..], libc::EPERM, "io_uring_setup"),
        (&[IO_URING_ENTER][..], libc::ENOSYS, "io_uring_enter"),
        (&[IO_URING_REGISTER][..], libc::EPERM, "io_uring_register"),
    ] {
        let mut c = serve(&["--cores", "2"]);
        with_seccomp(&mut c, filter(blocked, errno));
        let t0 = Instant::now();
        let mut r = Run::spawn(c);
        assert_refused(
            &mut r,
            t0,
            Duration::from_secs(5),
            &[
                "io_uring is not available",
                call,
                "deploy/seccomp/kvroute.json",
            ],
        );
    }
}

/// `CAP_SYS_RESOURCE` (linux/capability.h).
const CAP_SYS_RESOURCE: libc::c_int = 24;

#[test]
fn a_locked_memory_limit_below_512_kib_exits_2_naming_the_fix() {
    let mut c = serve(&["--cores", "1"]);
    // SAFETY: prctl and setrlimit are async-signal-safe and touch only a local.
    unsafe {
        c.pre_exec(|| {
            // Without CAP_SYS_RESOURCE kvroute cannot raise the hard limit itself (a
            // process that is not root never has it; drop it for root too).
            let _ = libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0);
            let lim = libc::rlimit {
                rlim_cur: 64 << 10,
                rlim_max: 64 << 10,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let t0 = Instant::now();
    let mut r = Run::spawn(c);
    assert_refused(
        &mut r,
        t0,
        Duration::from_secs(5),
        &["RLIMIT_MEMLOCK", "64 KiB", "ulimit -l", "--ulimit memlock="],
    );
}

/// With a file-descriptor limit just too low, some core cannot build its executor
/// while the other can: every limit from too few to enough must end in a start or in
/// exit 2 with one line naming the core, never a panic or a hang; the core that did
/// start is stopped with the process.
#[test]
fn a_core_that_cannot_start_is_named_and_the_started_cores_stop() {
    // Limits at which one core failed while the other had started (which core loses
    // the race for the last descriptors varies).
    let mut one_failed = Vec::new();
    let mut started_in_a_row = 0;
    for limit in 12u64..=96 {
        let mut c = serve(&["--cores", "2", "--pin-cores", "false"]);
        // SAFETY: setrlimit is async-signal-safe.
        unsafe {
            c.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let t0 = Instant::now();
        let mut r = Run::spawn(c);
        match r.exit_or_listen(Duration::from_secs(20)) {
            None => {
                assert_eq!(r.stop().code(), Some(0), "limit {limit}: {:?}", r.stderr());
                started_in_a_row += 1;
                if started_in_a_row == 3 {
                    break;
                }
            }
            Some(st) => {
                started_in_a_row = 0;
                let err = r.stderr();
                assert_eq!(st.code(), Some(2), "limit {limit}: {err:?}");
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "limit {limit}: {:?}",
                    t0.elapsed()
                );
                assert!(!err.iter().any(|l| l.contains("panicked")), "{err:?}");
                let last = err.last().cloned().unwrap_or_default();
                assert!(last.starts_with("kvroute: "), "limit {limit}: {err:?}");
                // An executor that could not be built (not a listener that could not
                // be handed to a core before its executor was spawned).
                let executor = !last.contains("dup listener");
                if last.contains(" did not start: ") && executor && !last.contains("more core(s)") {
                    one_failed.push((limit, last));
                }
            }
        }
    }
    assert_eq!(started_in_a_row, 3, "kvroute never started");
    eprintln!("one core failed, the other stopped: {one_failed:?}");
    assert!(
        one_failed.iter().any(|(_, l)| l.contains("kvroute: core ")),
        "no limit made one core fail while the other started"
    );
}

// --- pinning inside an affinity mask ---

/// `Cpus_allowed_list` of each executor thread of `pid`. glommio names an executor's
/// thread after it (`kvroute-core-N-M`, cut to 15 bytes); the executor's blocking
/// thread, started later, inherits the name: the lowest thread id of a name is the
/// executor.
fn core_threads_cpus(pid: u32) -> Vec<(String, String)> {
    let mut tasks: Vec<(u32, String, String)> = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    for t in dir.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let comm = comm.trim().to_string();
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        if let Some(l) = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        {
            tasks.push((tid, comm, l.trim().to_string()));
        }
    }
    tasks.sort();
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<(String, String)> = tasks
        .into_iter()
        .filter(|(_, comm, _)| comm.starts_with("kvroute-core-") && seen.insert(comm.clone()))
        .map(|(_, comm, cpus)| (comm, cpus))
        .collect();
    out.sort();
    out
}

#[test]
fn under_taskset_c_1_the_executor_is_pinned_to_cpu_1() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 || Command::new("taskset").arg("-V").output().is_err() {
        eprintln!("SKIPPED: needs two CPUs and taskset (util-linux)");
        return;
    }
    let mut c = Command::new("taskset");
    c.args(["-c", "1", BIN, "serve", "--pin-cores", "true"])
        .args(["--events-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0"])
        .args(["--http-addr", "127.0.0.1:0", "--proxy-addr", "127.0.0.1:0"]);
    let mut r = Run::spawn(c);
    assert_eq!(
        r.exit_or_listen(Duration::from_secs(20)),
        None,
        "did not start"
    );
    let err = r.stderr();
    // The default core count follows the mask: one executor, on CPU 1, logged.
    assert!(
        err.iter()
            .any(|l| l.contains("affinity mask CPUs 1: core 0 -> CPU 1")),
        "{err:?}"
    );
    let out = r.stdout();
    assert!(out.iter().any(|l| l.contains("on 1 core(s)")), "{out:?}");
    let threads = core_threads_cpus(r.child.id());
    assert_eq!(threads.len(), 1, "{threads:?}");
    assert_eq!(threads[0].1, "1", "{threads:?}");
    assert_eq!(r.stop().code(), Some(0));
}

#[test]
fn more_cores_than_the_mask_has_cpus_wrap_around_it() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 || Command::new("taskset").arg("-V").output().is_err() {
        eprintln!("SKIPPED: needs two CPUs and taskset (util-linux)");
        return;
    }
    let mut c = Command::new("taskset");
    c.args(["-c", "1", BIN, "serve", "--cores", "2"])
        .args(["--events-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0"])
        .args(["--http-addr", "127.0.0.1:0", "--proxy-addr", "127.0.0.1:0"]);
    let mut r = Run::spawn(c);
    assert_eq!(
        r.exit_or_listen(Duration::from_secs(20)),
        None,
        "did not start"
    );
    let threads = core_threads_cpus(r.child.id());
    assert_eq!(threads.len(), 2, "{threads:?}");
    assert!(threads.iter().all(|(_, c)| c == "1"), "{threads:?}");
    let err = r.stderr();
    assert!(
        err.iter()
            .any(|l| l.contains("core 0 -> CPU 1, core 1 -> CPU 1")),
        "{err:?}"
    );
    assert_eq!(r.stop().code(), Some(0));
}
