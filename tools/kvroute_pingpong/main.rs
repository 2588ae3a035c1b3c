//! `kvroute-pingpong`: what does the runtime cost per round trip?
//!
//! Starts a 64-byte echo server on loopback in one of several runtimes and measures
//! round trips from blocking client threads. It answers the performance issue's
//! question "glommio's defaults vs a plain epoll runtime" on this machine, and shows
//! which glommio settings (spin-before-park, task-queue latency class) change it:
//!
//! - `std`: one blocking thread per connection (the floor: no runtime at all);
//! - `tokio`: tokio current-thread runtime (epoll), one task per connection;
//! - `glommio`: glommio executor with its defaults (io_uring, park when idle);
//! - `glommio-spin`: the same with `spin_before_park` (`--spin-us`);
//! - `glommio-latency`: the same with connections in a `Latency::Matters` task queue.
//!
//! Two loads: `--conns 1` is a closed-loop ping-pong on one connection (pure round-trip
//! latency); with `--rate R` every connection sends at a paced rate (open loop, the
//! router's situation: many clients, moderate rate) and latency includes queueing.
//! The server runs pinned to the last CPU, clients on the others (or the same one on a
//! single-CPU machine).

use clap::Parser;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MSG: usize = 64;

#[derive(Parser, Debug)]
#[command(about = "Loopback 64-byte ping-pong: runtime cost per round trip")]
struct Args {
    /// Runtimes to compare, comma-separated: std, tokio, glommio, glommio-spin,
    /// glommio-latency.
    #[arg(long, default_value = "std,tokio,glommio,glommio-spin,glommio-latency")]
    runtimes: String,
    /// Client connections.
    #[arg(long, default_value_t = 1)]
    conns: usize,
    /// Total round trips/s over all connections (0 = closed loop, as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Seconds of measurement per runtime (after a 0.5 s warm-up).
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Spin-before-park of `glommio-spin`, in microseconds.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Latency requirement of `glommio-latency`'s task queue, in microseconds.
    #[arg(long, default_value_t = 1000)]
    latency_us: u64,
}

fn main() {
    let args = Args::parse();
    kvroute::service::raise_memlock();
    println!(
        "{:<16} {:>6} {:>10} {:>9} {:>9} {:>9}",
        "runtime", "conns", "rtt/s", "p50 µs", "p99 µs", "p999 µs"
    );
    for rt in args
        .runtimes
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match run(rt, &args) {
            Ok(r) => println!(
                "{:<16} {:>6} {:>10.0} {:>9.1} {:>9.1} {:>9.1}",
                rt, args.conns, r.per_sec, r.p50, r.p99, r.p999
            ),
            Err(e) => {
                eprintln!("kvroute-pingpong: {rt}: {e}");
                std::process::exit(1);
            }
        }
    }
}

struct Figures {
    per_sec: f64,
    p50: f64,
    p99: f64,
    p999: f64,
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Best effort: an unpinned thread still measures, only noisier.
fn pin(cpu: usize) {
    let _ = kvroute::service::runtime::pinning::pin_current_thread(cpu);
}

fn run(rt: &str, args: &Args) -> Result<Figures, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let server_cpu = cpus() - 1;
    let server = match rt {
        "std" => {
            let stop = stop.clone();
            std::thread::spawn(move || serve_std(listener, server_cpu, stop))
        }
        "tokio" => std::thread::spawn(move || serve_tokio(listener, server_cpu)),
        "glommio" | "glommio-spin" | "glommio-latency" => {
            let spin = (rt == "glommio-spin").then(|| Duration::from_micros(args.spin_us));
            let latency = (rt == "glommio-latency").then(|| Duration::from_micros(args.latency_us));
            std::thread::spawn(move || serve_glommio(listener, server_cpu, spin, latency))
        }
        other => return Err(format!("unknown runtime {other:?}")),
    };
    let figures = load(addr, args);
    stop.store(true, Ordering::Release);
    // The server threads end with the process; a std server blocks in accept.
    drop(server);
    figures
}

/// Runs the clients and gathers their round-trip times.
fn load(addr: SocketAddr, args: &Args) -> Result<Figures, String> {
    let warm = Duration::from_millis(500);
    let measure = Duration::from_secs_f64(args.duration.max(0.1));
    let per_conn_gap =
        (args.rate > 0.0).then(|| Duration::from_secs_f64(args.conns as f64 / args.rate));
    let start = Instant::now() + Duration::from_millis(100);
    let client_cpus = cpus().saturating_sub(1).max(1);
    let mut threads = Vec::new();
    for c in 0..args.conns {
        threads.push(std::thread::spawn(move || -> Result<Vec<u32>, String> {
            pin(c % client_cpus);
            let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            let mut buf = [7u8; MSG];
            let mut rtts = Vec::new();
            let mut next =
                start + per_conn_gap.map_or(Duration::ZERO, |g| g.mul_f64(c as f64 / 8.0));
            loop {
                if let Some(g) = per_conn_gap {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    next += g;
                }
                let t = Instant::now();
                if t > start + warm + measure {
                    return Ok(rtts);
                }
                s.write_all(&buf).map_err(|e| e.to_string())?;
                s.read_exact(&mut buf).map_err(|e| e.to_string())?;
                if t >= start + warm {
                    rtts.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                }
            }
        }));
    }
    let mut all = Vec::new();
    for t in threads {
        all.extend(t.join().map_err(|_| "client thread panicked")??);
    }
    if all.is_empty() {
        return Err("no round trips measured".into());
    }
    all.sort_unstable();
    let q = |p: f64| all[((all.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    Ok(Figures {
        per_sec: all.len() as f64 / measure.as_secs_f64(),
        p50: q(0.5),
        p99: q(0.99),
        p999: q(0.999),
    })
}

fn serve_std(l: TcpListener, cpu: usize, stop: Arc<AtomicBool>) {
    pin(cpu);
    for s in l.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            pin(cpu);
            let _ = s.set_nodelay(true);
            let mut buf = [0u8; MSG];
            while s.read_exact(&mut buf).is_ok() && s.write_all(&buf).is_ok() {}
        });
    }
}

fn serve_tokio(l: TcpListener, cpu: usize) {
    pin(cpu);
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
    else {
        eprintln!("kvroute-pingpong: cannot build a tokio runtime");
        return;
    };
    rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = l.set_nonblocking(true);
        let Ok(l) = tokio::net::TcpListener::from_std(l) else {
            return;
        };
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = [0u8; MSG];
                while s.read_exact(&mut buf).await.is_ok() && s.write_all(&buf).await.is_ok() {}
            });
        }
    });
}

fn serve_glommio(l: TcpListener, cpu: usize, spin: Option<Duration>, latency: Option<Duration>) {
    use futures_lite::{AsyncReadExt, AsyncWriteExt};
    use glommio::{Latency, LocalExecutorBuilder, Placement, Shares};
    let mut b = LocalExecutorBuilder::new(Placement::Fixed(cpu));
    if let Some(s) = spin {
        b = b.spin_before_park(s);
    }
    let ex = b.spawn(move || async move {
        let tq = match latency {
            Some(d) => glommio::executor().create_task_queue(
                Shares::default(),
                Latency::Matters(d),
                "conns",
            ),
            None => glommio::executor().current_task_queue(),
        };
        let l = {
            use std::os::fd::{FromRawFd, IntoRawFd};
            // SAFETY: the fd comes from a live std listener we own and give up here.
            unsafe { glommio::net::TcpListener::from_raw_fd(l.into_raw_fd()) }
        };
        while let Ok(mut s) = l.accept().await {
            let _ = s.set_nodelay(true);
            let conn = async move {
                let mut buf = [0u8; MSG];
                while s.read_exact(&mut buf).await.is_ok() && s.write_all(&buf).await.is_ok() {}
            };
            if let Ok(t) = glommio::spawn_local_into(conn, tq) {
                t.detach();
            }
        }
    });
    match ex {
        Ok(h) => {
            let _ = h.join();
        }
        Err(e) => eprintln!("kvroute-pingpong: glommio: {e} (needs io_uring and RLIMIT_MEMLOCK)"),
    }
}
