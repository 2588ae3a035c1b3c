//! Threads of the mixed runs: pinned to distinct CPUs, waiting by spinning.
//!
//! Why: a shard owner and the thread handing it a query are on different cores in the
//! service (one glommio executor per core, each busy-polling while it has work). With
//! both threads left to the OS on a 2-core machine, a query often waited for a
//! scheduler tick (ms) instead of one ingest slice (µs): the harness measured the OS,
//! not the router (docs/PERFORMANCE.md, "Side by side with Dynamo"). Pinning the two threads to two CPUs
//! and spinning keeps both running, as the service's executors do.
//!
//! Guarantees: pinning is best effort (on a failure, or with fewer than two allowed
//! CPUs, threads stay unpinned and [`pair`] says so); [`spin_until`] never parks, and
//! falls back to yielding only after [`SPIN_BEFORE_YIELD`] so a descheduled peer
//! (another process on its CPU) can still make progress.

use std::time::{Duration, Instant};

/// How long [`spin_until`] spins before it also yields the CPU between checks.
pub const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(200);

/// CPUs this process may run on.
pub fn allowed() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Two distinct CPUs for the owner (ingest) and the asker (query) threads, if there
/// are two.
pub fn pair() -> Option<(usize, usize)> {
    let a = allowed();
    (a.len() >= 2).then(|| (a[0], a[1]))
}

/// Pins the calling thread to `cpu` (best effort; returns whether it worked).
pub fn pin(cpu: Option<usize>) -> bool {
    let Some(cpu) = cpu else { return false };
    // SAFETY: as in `allowed`; the set holds one CPU below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Spins until `done()` holds; after [`SPIN_BEFORE_YIELD`] also yields between checks.
#[inline]
pub fn spin_until(mut done: impl FnMut() -> bool) {
    let mut n = 0u32;
    let mut since: Option<Instant> = None;
    while !done() {
        n = n.wrapping_add(1);
        std::hint::spin_loop();
        if n.is_multiple_of(1024) {
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() >= SPIN_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }
}

/// Spins for `us` microseconds (the asker's gap between two queries).
pub fn spin_for(us: u64) {
    let t = Instant::now();
    let d = Duration::from_micros(us);
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The calling thread's kernel id (for [`Watch`]).
pub fn tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Whether the OS kept a thread off its CPU: the run-queue wait time of threads, from
/// `/proc/self/task/<tid>/schedstat` (CONFIG_SCHEDSTATS / SCHED_INFO: "run-ns wait-ns
/// slices"). Read around each query (off the clock): a query during which any watched
/// thread waited on a run queue (was preempted by another process, or yielded to
/// one) is *disturbed* — its latency is the OS's, not the index's. Both sides are
/// judged the same way; the printed tables give all queries and the undisturbed ones.
pub struct Watch {
    files: Vec<std::fs::File>,
}

impl Watch {
    /// Watches the threads `tids`; `None` if a schedstat file cannot be opened.
    pub fn new(tids: &[i32]) -> Option<Watch> {
        if std::env::var_os("VS_NO_WATCH").is_some() {
            return None; // every query counts as undisturbed (to see what the reads cost)
        }
        let files = tids
            .iter()
            .map(|t| std::fs::File::open(format!("/proc/self/task/{t}/schedstat")))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        Some(Watch { files })
    }

    /// Sum of the watched threads' run-queue wait, ns (`u64::MAX` if a read fails, so
    /// a failure counts as disturbed).
    pub fn wait_ns(&self) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut sum = 0u64;
        let mut buf = [0u8; 96];
        for f in &self.files {
            let Ok(n) = f.read_at(&mut buf, 0) else {
                return u64::MAX;
            };
            let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
            let Some(w) = text
                .split_ascii_whitespace()
                .nth(1)
                .and_then(|w| w.parse::<u64>().ok())
            else {
                return u64::MAX;
            };
            sum = sum.wrapping_add(w);
        }
        sum
    }
}

/// Latencies of one run's queries, split by [`Watch`].
#[derive(Default)]
pub struct Lat {
    /// Every query, ns.
    pub all: Vec<u64>,
    /// The queries during which no watched thread waited on a run queue, ns.
    pub clean: Vec<u64>,
}

impl Lat {
    pub fn push(&mut self, ns: u64, disturbed: bool) {
        self.all.push(ns);
        if !disturbed {
            self.clean.push(ns);
        }
    }
}

/// The machine's floor for any hand-off between the two CPUs: round trips of one
/// cache line (the asker stores `i`, the peer, spinning, stores `i` back), timed on
/// the asker, `n` times, 1 µs apart; split by [`Watch`] like the queries.
pub fn ping_pong(cpus: Option<(usize, usize)>, n: usize) -> Lat {
    use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
    #[repr(align(128))]
    struct Line(AtomicU64);
    let (ask, ack) = (Line(AtomicU64::new(0)), Line(AtomicU64::new(0)));
    let peer_tid = AtomicI32::new(0);
    let mut lat = Lat::default();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            pin(cpus.map(|c| c.0));
            peer_tid.store(tid(), Ordering::Release);
            loop {
                let v = ask.0.load(Ordering::Acquire);
                if v == u64::MAX {
                    return;
                }
                if v != ack.0.load(Ordering::Relaxed) {
                    ack.0.store(v, Ordering::Release);
                }
                std::hint::spin_loop();
            }
        });
        pin(cpus.map(|c| c.1));
        spin_until(|| peer_tid.load(Ordering::Acquire) != 0);
        let watch = Watch::new(&[peer_tid.load(Ordering::Acquire), tid()]);
        for i in 1..=n as u64 {
            let before = watch.as_ref().map(|w| w.wait_ns());
            let t = Instant::now();
            ask.0.store(i, Ordering::Release);
            spin_until(|| ack.0.load(Ordering::Acquire) == i);
            let ns = t.elapsed().as_nanos() as u64;
            lat.push(ns, watch.as_ref().map(|w| w.wait_ns()) != before);
            spin_for(1);
        }
        ask.0.store(u64::MAX, Ordering::Release);
    });
    lat
}
