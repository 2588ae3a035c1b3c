//! Running one routing variant (a mode plus knobs) over a workload, offline or in real
//! time against a router, and spawning a private `kvroute serve` per variant.
//!
//! Both paths call the same `kvroute::sim::run_offline` driver and simulated workers;
//! they differ only in the router behind the `RouterApi` (engine in-process on virtual
//! time, or the service over TCP paced to the wall clock).

use indicatif::{ProgressBar, ProgressStyle};
use kvroute::config::Mode;
use kvroute::sim::{
    run_offline, EngineRouter, FleetSpec, Pace, Report, RestartPlan, RestartStats, ServiceRouter,
    SimRequest, TimedRouter,
};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One row of a comparison: a mode and the knobs it runs with.
#[derive(Clone, Debug)]
pub struct Variant {
    pub label: String,
    pub mode: Mode,
    /// Router knobs (`RouterConfig` field, value), base knobs first.
    pub knobs: Vec<(String, String)>,
}

/// Offline: the engine in-process on virtual time; deterministic for `seed`.
pub fn offline(
    v: &Variant,
    fleet: &FleetSpec,
    reqs: &[SimRequest],
    seed: u64,
) -> Result<Report, String> {
    let cfg = crate::setup::router_config(fleet.block_size, &v.knobs)?;
    let t0 = Instant::now();
    let mut r = TimedRouter::new(EngineRouter::new(cfg, seed)?, move || {
        t0.elapsed().as_nanos() as u64
    });
    let mut rep = run_offline(&mut r, fleet, reqs, v.mode, seed)?;
    rep.set_decision_latencies(r.latencies_us());
    rep.label = v.label.clone();
    Ok(rep)
}

/// Offline: SGLang Model Gateway's `cache_aware` policy (its defaults, then `knobs`:
/// `key=value,...` naming `CacheAwareConfig` fields) in place of the router, labelled
/// `sglang-cache-aware`; deterministic for `seed`.
pub fn sglang_offline(
    fleet: &FleetSpec,
    reqs: &[SimRequest],
    seed: u64,
    knobs: &str,
) -> Result<Report, String> {
    let cfg = sglang_config(knobs)?;
    let t0 = Instant::now();
    let policy = kvroute::sim::sglang::SglangCacheAware::new(cfg, fleet.block_size);
    let mut r = TimedRouter::new(policy, move || t0.elapsed().as_nanos() as u64);
    let mut rep = run_offline(&mut r, fleet, reqs, Mode::Kv, seed)?;
    rep.set_decision_latencies(r.latencies_us());
    rep.label = SGLANG_LABEL.to_string();
    Ok(rep)
}

/// The gateway model's knobs: its defaults with `key=value,...` applied.
fn sglang_config(knobs: &str) -> Result<kvroute::sim::sglang::CacheAwareConfig, String> {
    let pairs = crate::setup::parse_pairs(knobs)?;
    crate::setup::apply_pairs(&Default::default(), &pairs, "--sglang-knobs")
}

/// Row label of the SGLang `cache_aware` baseline.
pub const SGLANG_LABEL: &str = "sglang-cache-aware";

/// Where a real-time run finds its router.
#[derive(Clone, Debug)]
pub struct RouterAddrs {
    pub api: String,
    pub events: String,
    pub auth_token: String,
}

/// Real-time figures that are not part of the shared report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Pacing {
    pub time_scale: f64,
    /// Router replicas the calls were spread over (1 without `--cluster`).
    pub replicas: usize,
    pub wall_s: f64,
    /// How late paced calls went out, µs of wall time (p50 / p99 / max).
    pub lag_p50_us: f64,
    pub lag_p99_us: f64,
    pub lag_max_us: f64,
    /// What happened around a planned router restart (`run --restart-at-secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartStats>,
}

/// Real time: the simulated fleet and the frontend talk to a running router over TCP,
/// paced `time_scale` times faster than model time; optionally restarting the router
/// mid-run.
#[allow(clippy::too_many_arguments)]
pub fn realtime(
    v: &Variant,
    fleet: &FleetSpec,
    reqs: &[SimRequest],
    seed: u64,
    addrs: &RouterAddrs,
    time_scale: f64,
    progress: bool,
    restart: Option<RestartPlan>,
) -> Result<(Report, Pacing), String> {
    // A fresh epoch per run: a reused router forgets the previous run's workers' state.
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    // Registration happens before the first arrival; give it a head start.
    let pace = Pace {
        start: Instant::now() + Duration::from_millis(300),
        time_scale,
    };
    // Comma-separated addresses are replicas of one router (`serve --cluster`).
    let list = |s: &str| -> Vec<String> { s.split(',').map(|a| a.trim().to_string()).collect() };
    let mut r = ServiceRouter::connect_replicas(
        &list(&addrs.api),
        &list(&addrs.events),
        &addrs.auth_token,
        epoch,
        Some(pace),
    )?;
    let bar = if progress {
        let b = ProgressBar::new(reqs.len() as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} finished ({eta})",
        ) {
            b.set_style(style);
        }
        b.set_prefix(v.label.clone());
        Some(b)
    } else {
        None
    };
    if let Some(b) = bar.clone() {
        r.on_finish = Some(Box::new(move || b.inc(1)));
    }
    let planned = restart.is_some();
    if let Some(p) = restart {
        r.plan_restart(p);
    }
    let wall = Instant::now();
    let out = run_offline(&mut r, fleet, reqs, v.mode, seed);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mut rep = out?;
    rep.set_decision_latencies(r.latencies_us());
    rep.label = v.label.clone();
    let lag = kvroute::sim::Percentiles::of(r.lag_us());
    Ok((
        rep,
        Pacing {
            time_scale,
            replicas: r.replicas(),
            wall_s: wall.elapsed().as_secs_f64(),
            lag_p50_us: lag.p50,
            lag_p99_us: lag.p99,
            lag_max_us: lag.max,
            restart: planned.then(|| r.restart_stats().clone()),
        },
    ))
}

/// Whether something listens on `addr`. A loopback connect to a free port of the
/// ephemeral range can connect to itself (TCP simultaneous open): that is no listener.
fn listening(addr: &str) -> bool {
    match std::net::TcpStream::connect(addr) {
        Ok(c) => match (c.local_addr(), c.peer_addr()) {
            (Ok(l), Ok(p)) => l != p,
            _ => false,
        },
        Err(_) => false,
    }
}

/// The three listen addresses of a spawned router.
#[derive(Clone, Debug)]
pub struct Ports {
    pub events: String,
    pub api: String,
    pub http: String,
}

/// A `kvroute serve` started by the tool on free loopback ports; stopped on drop.
pub struct Spawned {
    child: Child,
    pub addrs: RouterAddrs,
}

/// A free loopback port below Linux's ephemeral range (32768+): a client connecting
/// to an ephemeral port nobody listens on can connect to itself (TCP simultaneous
/// open) and then hold the port, so a router restarted on it could not bind it. The
/// listener is returned so that several picks differ; drop it before use.
fn free_port() -> Result<TcpListener, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id());
    for _ in 0..2000 {
        let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = 20_000 + (salt.wrapping_add(i.wrapping_mul(7919)) % 12_000) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l);
        }
    }
    TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())
}

/// A free loopback `host:port` below the ephemeral range (see [`free_port`]), released
/// for the caller to bind.
pub fn free_loopback_addr() -> Result<String, String> {
    let l = free_port()?;
    l.local_addr()
        .map(|a| a.to_string())
        .map_err(|e| e.to_string())
}

impl Spawned {
    /// Starts `bin serve` with `--mode` and one flag per knob; waits (≤ 20 s) until its
    /// request port accepts a connection.
    pub fn start(bin: &str, mode: Mode, knobs: &[(String, String)]) -> Result<Spawned, String> {
        Spawned::start_on(bin, mode, knobs, &[], &Spawned::free_ports()?)
    }

    /// Like [`Spawned::start`] on given addresses, with extra `serve` arguments.
    pub fn start_on(
        bin: &str,
        mode: Mode,
        knobs: &[(String, String)],
        extra: &[String],
        ports: &Ports,
    ) -> Result<Spawned, String> {
        let Ports { events, api, http } = ports.clone();
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--cores", "1", "--events-addr", &events])
            .args(["--proxy-addr", "off"])
            .args([
                "--api-addr",
                &api,
                "--http-addr",
                &http,
                "--mode",
                mode.name(),
            ]);
        for (k, v) in knobs {
            cmd.arg(format!("--{}", k.replace('_', "-"))).arg(v);
        }
        cmd.args(extra);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn {bin}: {e}"))?;
        let mut s = Spawned {
            child,
            addrs: RouterAddrs {
                api,
                events,
                auth_token: String::new(),
            },
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !listening(&s.addrs.api) {
            // A router that exited (e.g. it could not bind a port) fails the start now,
            // with its exit status, instead of after the whole wait.
            if let Ok(Some(status)) = s.child.try_wait() {
                return Err(format!("{bin} exited during start ({status})"));
            }
            if Instant::now() > deadline {
                return Err(format!("{bin} did not start listening on {}", s.addrs.api));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The port answered; make sure it was this router (a stopped router's socket
        // can linger a moment) and that it is still running.
        std::thread::sleep(Duration::from_millis(50));
        if let Ok(Some(status)) = s.child.try_wait() {
            return Err(format!("{bin} exited during start ({status})"));
        }
        Ok(s)
    }

    /// Free loopback ports for [`Spawned::start_on`].
    pub fn free_ports() -> Result<Ports, String> {
        let held = [free_port()?, free_port()?, free_port()?];
        let addr = |l: &TcpListener| {
            l.local_addr()
                .map(|a| a.to_string())
                .map_err(|e| e.to_string())
        };
        Ok(Ports {
            events: addr(&held[0])?,
            api: addr(&held[1])?,
            http: addr(&held[2])?,
        })
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // SIGTERM for a graceful stop, then make sure it is gone (bounded wait).
        kvroute::process::terminate(&mut self.child, Duration::from_secs(5));
    }
}
