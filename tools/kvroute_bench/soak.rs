//! The tier soak (`--replicas N` with `--spawn`): the service soak of `load` aimed at
//! replica 0 (binary events and routes, JSON clients, worker connections dropped and
//! restored), and at the same time proxy traffic to the simulated fleet through every
//! replica (`proxy_load`), slow clients on every HTTP port (`slow_load`), and the last
//! replica restarted every `--restart-every` seconds (`tier`). Then the load stops,
//! in-flight work is given 15 s to finish, and the report says: requests lost, errors
//! by kind, each replica's RSS after warm-up and at the end, and the active load every
//! replica and every worker still counts.

use crate::proxy_load::{self, ProxyOut};
use crate::slow_load::{self, SlowOut};
use crate::tier::{self, Tier, TierArgs};
use crate::Args;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Default, Serialize)]
pub struct ReplicaEnd {
    pub name: String,
    pub rss_mib_after_warmup: Option<f64>,
    pub rss_mib_end: Option<f64>,
    /// `kvroute_active_requests`: requests the replica tracks as in flight.
    pub active_requests: Option<f64>,
    /// `kvroute_proxy_active`: proxied requests in progress on it.
    pub proxy_active: Option<f64>,
    /// Sum of `active_requests` over `GET /v1/workers` (its view of every worker's
    /// load, the other replicas' included).
    pub workers_active: u64,
    /// The workers it counts load on, by id (non-zero only).
    pub workers_active_by_id: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Default, Serialize)]
pub struct TierReport {
    pub proxy: ProxyOut,
    pub slow: SlowOut,
    /// Milliseconds from SIGTERM to ready again, per restart.
    pub restarts_ms: Vec<u64>,
    pub restart_errors: Vec<String>,
    pub replicas: Vec<ReplicaEnd>,
    /// The fleet's own counts at the end: requests in progress, taken, finished.
    pub fleet_active: u64,
    pub fleet_requests: u64,
    pub fleet_finished: u64,
    /// Where the replicas' logs are.
    pub logs: String,
}

fn rss_mib(pid: Option<u32>) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Sleeps `d` unless `stop` is raised first; false if it was.
fn sleep_unless(stop: &AtomicBool, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// Samples RSS after warm-up, then restarts the last replica every `every` (0: never)
/// until `stop`; the RSS samples and the restarts (in a report of their own).
fn tier_thread(
    t: &mut Tier,
    warm: Duration,
    every: u64,
    stop: &AtomicBool,
) -> (Vec<Option<f64>>, TierReport) {
    let mut report = TierReport::default();
    if !sleep_unless(stop, warm) {
        return (Vec::new(), report);
    }
    let rss: Vec<Option<f64>> = t.replicas.iter().map(|r| rss_mib(r.pid())).collect();
    let last = t.replicas.len() - 1;
    while every > 0 && sleep_unless(stop, Duration::from_secs(every)) {
        eprintln!(
            "kvroute-bench: restarting replica {}",
            t.replicas[last].name
        );
        match t.restart(last) {
            Ok(d) => report.restarts_ms.push(d.as_millis() as u64),
            Err(e) => report.restart_errors.push(e),
        }
    }
    (rss, report)
}

pub fn run(args: &Args, kvroute: &str) -> Result<(crate::load::Result, TierReport), String> {
    let sim = args.sim.clone().unwrap_or_else(|| {
        std::path::Path::new(kvroute)
            .with_file_name("kvroute-sim")
            .to_string_lossy()
            .into_owned()
    });
    let cores = args.cores.split(',').next().unwrap_or("2").trim();
    let mut t = Tier::start(&TierArgs {
        kvroute,
        sim,
        replicas: args.replicas.max(1),
        cores: cores
            .parse()
            .map_err(|_| format!("bad --cores {cores:?}"))?,
        fleet_workers: args.fleet_workers,
        timing: &args.fleet_timing,
        extra: &args.replica_arg,
        nats: args.nats.as_deref(),
    })?;
    let logs = t.dir.display().to_string();
    let r0 = &t.replicas[0];
    let addrs = crate::Addrs {
        events: r0.events.clone(),
        api: r0.api.clone(),
        http: r0.http.clone(),
    };
    let pid0 = r0.pid();
    let proxies: Vec<String> = t.replicas.iter().map(|r| r.proxy.clone()).collect();
    let https: Vec<String> = t.replicas.iter().map(|r| r.http.clone()).collect();
    let stop = AtomicBool::new(false);
    let duration = Duration::from_secs(args.duration.clamp(1, 3600));
    let warm = (duration / 10).max(Duration::from_secs(1));
    let slow = args.slow_clients;
    let (result, rss_warm, mut report) = std::thread::scope(|s| {
        let (stop, proxies, https) = (&stop, &proxies, &https);
        let tier = s.spawn(|| tier_thread(&mut t, warm, args.restart_every, stop));
        let pc: Vec<_> = (0..args.proxy_clients)
            .map(|c| {
                s.spawn(move || {
                    proxy_load::client(proxies, c, args.proxy_clients, args.proxy_rate, stop)
                })
            })
            .collect();
        let mut sl = Vec::new();
        if slow > 0 {
            sl.push(s.spawn(move || slow_load::heads(https, proxies, slow.div_ceil(3), stop)));
            sl.push(s.spawn(move || slow_load::bodies(https, proxies, slow.div_ceil(3), stop)));
            for r in 0..slow / 3 {
                sl.push(s.spawn(move || slow_load::reader(proxies, r, stop)));
            }
        }
        let result = crate::load::run(args, &addrs, None, pid0, "tier".into());
        stop.store(true, Ordering::Relaxed);
        let (rss, mut rep) = tier.join().unwrap_or_default();
        for h in pc {
            if let Ok(o) = h.join() {
                rep.proxy.add(o);
            }
        }
        for h in sl {
            if let Ok(o) = h.join() {
                rep.slow.add(o);
            }
        }
        (result, rss, rep)
    });
    report.logs = logs;
    let result = result?;
    // In-flight work finishes; what is still counted after that is phantom load.
    let settle = Instant::now() + Duration::from_secs(15);
    while Instant::now() < settle {
        let busy = t
            .worker_stats()
            .iter()
            .any(|w| w["active"].as_u64() != Some(0));
        if !busy {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    for w in t.worker_stats() {
        report.fleet_active += w["active"].as_u64().unwrap_or(0);
        report.fleet_requests += w["requests"].as_u64().unwrap_or(0);
        report.fleet_finished += w["finished"].as_u64().unwrap_or(0);
    }
    for (i, r) in t.replicas.iter().enumerate() {
        let (_, body) = tier::get(&format!("http://{}/v1/workers", r.http));
        let ws: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap_or_default();
        report.replicas.push(ReplicaEnd {
            name: r.name.clone(),
            rss_mib_after_warmup: rss_warm.get(i).copied().flatten(),
            rss_mib_end: rss_mib(r.pid()),
            active_requests: tier::metric(&r.http, "kvroute_active_requests"),
            proxy_active: tier::metric(&r.http, "kvroute_proxy_active"),
            workers_active: ws
                .iter()
                .map(|w| w["active_requests"].as_u64().unwrap_or(0))
                .sum(),
            workers_active_by_id: ws
                .iter()
                .filter_map(|w| {
                    let n = w["active_requests"].as_u64().filter(|&n| n > 0)?;
                    Some((w["id"].as_str()?.to_string(), n))
                })
                .collect(),
        });
    }
    Ok((result, report))
}

pub fn print(r: &TierReport) {
    let p = &r.proxy;
    println!(
        "proxy requests: {} sent, {} ok, {} lost, {} failed over to another replica, errors {:?}",
        p.sent, p.ok, p.lost, p.failovers, p.errors_by_kind
    );
    let s = &r.slow;
    println!(
        "slow clients: heads {} opened / {} cut; bodies {} opened / {} cut; slow readers {} streams, {} complete, {} cut",
        s.heads_opened, s.heads_cut, s.bodies_opened, s.bodies_cut, s.streams_started,
        s.streams_completed, s.streams_cut
    );
    println!(
        "restarts: {} (ms from SIGTERM to ready: {:?}), errors {:?}",
        r.restarts_ms.len(),
        r.restarts_ms,
        r.restart_errors
    );
    for e in &r.replicas {
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        println!(
            "replica {}: RSS MiB {} -> {}; at the end: active requests {}, proxy active {}, workers' active (its view) {} {:?}",
            e.name,
            f(e.rss_mib_after_warmup),
            f(e.rss_mib_end),
            f(e.active_requests),
            f(e.proxy_active),
            e.workers_active,
            e.workers_active_by_id
        );
    }
    println!(
        "fleet at the end: {} active, {} requests taken, {} finished; replica logs in {}",
        r.fleet_active, r.fleet_requests, r.fleet_finished, r.logs
    );
}
