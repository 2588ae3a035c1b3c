//! The load of `kvroute-bench`: event publisher threads and paced routing clients,
//! with client-side latency samples and the router's peak RSS.

use crate::Args;
use kvroute::client::{Answer, EventPublisher, RequestClient};
use kvroute::engine::RouteRequest;
use kvroute::types::{Tier, WorkerSpec};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct Result {
    pub label: String,
    pub seconds: f64,
    pub block_events_per_s: f64,
    pub decisions_per_s: f64,
    pub errors: u64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    pub peak_rss_mib: Option<f64>,
    /// Requests sent whose connection failed before an answer arrived.
    pub decisions_lost: u64,
    /// Router error answers by code name.
    pub errors_by_kind: std::collections::BTreeMap<String, u64>,
    pub reconnects: u64,
    pub rss_mib_after_warmup: Option<f64>,
    pub rss_mib_end: Option<f64>,
    /// `blocking N` (one thread per connection, send then wait) or `pipelined N`
    /// (open loop over N connections, `pipelined`).
    pub clients: String,
    /// Pipelined mode: how late the sender was against the schedule (included in the
    /// latency figures).
    pub send_lag_us_p50: Option<f64>,
    pub send_lag_us_p99: Option<f64>,
    /// Router CPU time (user + system, all threads) over the measurement, in cores.
    pub router_cpu_cores: Option<f64>,
    /// Router CPU time per decision (µs), ingest included.
    pub router_cpu_us_per_decision: Option<f64>,
    /// HTTP calls answered as expected (`--http-clients`); their routes are counted in
    /// `decisions_per_s` too.
    pub http_ops_per_s: f64,
    /// Block events published by the simulated ZMQ engines (`--engines`; also counted
    /// in `block_events_per_s`), malformed payloads they sent on purpose, and messages
    /// no subscriber received (the router's subscription was down).
    pub engine_block_events: u64,
    pub engine_garbage_sent: u64,
    pub engine_messages_unsent: u64,
    /// The router's `kvroute_engine_stream_total` for the engines, by kind, at the end.
    pub engine_router_view: std::collections::BTreeMap<String, u64>,
}

/// User + system CPU seconds used so far by process `pid` (all threads).
fn cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14, 15.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (hz > 0.0).then(|| ticks / hz)
}

fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Deterministic 64-bit mixing for synthetic hashes.
fn mix(x: u64) -> u64 {
    kvroute::index::mix(x ^ 0x5151_5151)
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64
}

fn connect_retry(
    events: &str,
    spec: &WorkerSpec,
    stop: &AtomicBool,
) -> std::result::Result<EventPublisher, String> {
    let mut last = String::new();
    for _ in 0..500 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match EventPublisher::connect(events, spec.clone(), "") {
            Ok(p) => return Ok(p),
            // The router has not noticed the previous connection closing yet.
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("cannot reconnect: {last}"))
}

fn publisher(
    args: &Args,
    events: &str,
    w: usize,
    stop: &AtomicBool,
    sent: &AtomicU64,
    reconnects: &AtomicU64,
) -> std::result::Result<(), String> {
    let mut spec = WorkerSpec::new(format!("bench-w{w}"));
    spec.capacity_blocks = (args.worker_blocks as u64) * 2;
    let mut p = connect_retry(events, &spec, stop)?;
    let mut rng = mix(w as u64 + 99);
    let span = args.drop_every.max(1) * 2000;
    let mut next_drop = Instant::now() + Duration::from_millis(1000 + rng % span);
    let per_worker_rate = args.event_rate as f64 / args.workers.max(1) as f64;
    let started = Instant::now();
    let mut live: VecDeque<Vec<u64>> = VecDeque::new();
    let mut held = 0usize;
    let mut n = 0u64;
    let mut my_sent = 0u64;
    let mut last_hb = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..16 {
            let batch: Vec<u64> = (0..args.blocks_per_event as u64)
                .map(|i| mix(((w as u64) << 40) ^ (n << 8) ^ i))
                .collect();
            n += 1;
            p.stored(Tier::Device, None, &batch);
            held += batch.len();
            my_sent += batch.len() as u64;
            live.push_back(batch);
            while held > args.worker_blocks {
                if let Some(old) = live.pop_front() {
                    held -= old.len();
                    my_sent += old.len() as u64;
                    p.removed(Tier::Device, &old);
                }
            }
        }
        if last_hb.elapsed() > Duration::from_millis(500) {
            p.heartbeat(0, held as u64, args.worker_blocks as u64 * 2);
            last_hb = Instant::now();
        }
        p.flush().map_err(|e| e.to_string())?;
        sent.fetch_add(std::mem::take(&mut my_sent), Ordering::Relaxed);
        if args.soak && Instant::now() >= next_drop {
            // Drop the connection mid-stream and come back with the same epoch: the
            // router keeps our blocks and we resume at the sequence it expects.
            drop(p);
            std::thread::sleep(Duration::from_millis(50));
            p = connect_retry(events, &spec, stop)?;
            reconnects.fetch_add(1, Ordering::Relaxed);
            rng = mix(rng);
            next_drop =
                Instant::now() + Duration::from_millis(500 + rng % (args.drop_every.max(1) * 2000));
        }
        if per_worker_rate > 0.0 {
            let due = Duration::from_secs_f64(sent_total(n, args) as f64 / per_worker_rate);
            let el = started.elapsed();
            if due > el {
                std::thread::sleep(due - el);
            }
        }
    }
    Ok(())
}

fn sent_total(batches: u64, args: &Args) -> u64 {
    batches * args.blocks_per_event as u64
}

type Kinds = std::sync::Mutex<std::collections::BTreeMap<String, u64>>;

fn count(kinds: &Kinds, e: &kvroute::client::ClientError) {
    let name = match e {
        kvroute::client::ClientError::Router { name, .. } => name.to_string(),
        other => format!("{other}"),
    };
    if let Ok(mut k) = kinds.lock() {
        *k.entry(name).or_insert(0) += 1;
    }
}

#[allow(clippy::too_many_arguments)]
fn client(
    args: &Args,
    api: &str,
    c: usize,
    stop: &AtomicBool,
    lat: &mut Vec<u32>,
    errors: &AtomicU64,
    kinds: &Kinds,
    lost: &AtomicU64,
) -> std::result::Result<u64, String> {
    let mut rc = RequestClient::connect(api, "").map_err(|e| e.to_string())?;
    let per_client = args.rate as f64 / args.clients.max(1) as f64;
    let interval = Duration::from_secs_f64(1.0 / per_client.max(0.001));
    let mut next = Instant::now()
        + Duration::from_micros((c as u64 * 997) % (interval.as_micros().max(1) as u64));
    let mut done = 0u64;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += interval;
        // Shared prefixes: 32 groups, each request extends a group's prefix.
        let group = (i * 7 + c as u64) % 32;
        let hashes: Vec<u64> = (0..args.request_blocks as u64)
            .map(|b| {
                if b < args.request_blocks as u64 / 2 {
                    mix((group << 20) ^ b)
                } else {
                    mix(((c as u64) << 40) ^ (i << 12) ^ b)
                }
            })
            .collect();
        let id = format!("b{c}-{i}");
        i += 1;
        let req = RouteRequest {
            request_id: id.clone(),
            block_hashes: Some(hashes),
            ..Default::default()
        };
        let t0 = Instant::now();
        rc.send_route(&req).map_err(|e| e.to_string())?;
        if let Err(e) = rc.flush() {
            lost.fetch_add(1, Ordering::Relaxed);
            return Err(e.to_string());
        }
        let answer = match rc.recv() {
            Ok(a) => a,
            Err(e) => {
                lost.fetch_add(1, Ordering::Relaxed);
                return Err(e.to_string());
            }
        };
        match answer {
            Answer::Decision(..) => {
                lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                done += 1;
                rc.send_lifecycle(kvroute::codec::LifecycleOp::Finish, &id, 0)
                    .map_err(|e| e.to_string())?;
                rc.flush().map_err(|e| e.to_string())?;
                if let Answer::Error(_, e) = rc.recv().map_err(|e| e.to_string())? {
                    errors.fetch_add(1, Ordering::Relaxed);
                    count(kinds, &e);
                }
            }
            Answer::Error(_, e) => {
                errors.fetch_add(1, Ordering::Relaxed);
                count(kinds, &e);
            }
            Answer::Ack(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(done)
}

pub fn run(
    args: &Args,
    addrs: &crate::Addrs,
    engines: Option<&crate::engine_load::Engines>,
    pid: Option<u32>,
    label: String,
) -> std::result::Result<Result, String> {
    let http = addrs.http.as_str();
    // Comma-separated addresses are replicas of one router (`serve --cluster`): worker
    // `w` publishes to replica `w mod N`, request connection `c` talks to `c mod N`.
    let evs: Vec<&str> = addrs.events.split(',').map(str::trim).collect();
    let apis: Vec<&str> = addrs.api.split(',').map(str::trim).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let reconnects = Arc::new(AtomicU64::new(0));
    let kinds: Arc<Kinds> = Arc::new(Default::default());
    let mut rss_warm = None;
    let duration = Duration::from_secs(args.duration.clamp(1, 3600));
    let block_size = kvroute::config::RouterConfig::default().block_size;
    let (results, piped, https, engs, secs, block_events, cpu) = std::thread::scope(|s| {
        let mut pubs = Vec::new();
        let mut engs = Vec::new();
        for e in 0..engines.map_or(0, |e| e.len()) {
            let Some(p) = engines.and_then(|x| x.get(e)) else {
                continue;
            };
            let (stop, sent) = (stop.clone(), sent.clone());
            engs.push(
                s.spawn(move || crate::engine_load::publish(args, p, e, block_size, &stop, &sent)),
            );
        }
        for w in 0..args.workers {
            let (stop, sent, rc) = (stop.clone(), sent.clone(), reconnects.clone());
            let events = evs[w % evs.len()];
            pubs.push(s.spawn(move || publisher(args, events, w, &stop, &sent, &rc)));
        }
        // Register at least one worker before routing starts.
        std::thread::sleep(Duration::from_millis(300));
        let mut clients = Vec::new();
        let mut piped = Vec::new();
        let started = Instant::now();
        let cpu0 = pid.and_then(cpu_secs);
        let base = sent.load(Ordering::Relaxed);
        for c in 0..args.connections {
            let stop = stop.clone();
            let api = apis[c % apis.len()];
            piped.push(s.spawn(move || {
                crate::pipelined::connection(args, api, c, args.connections, &stop)
            }));
        }
        let mut https = Vec::new();
        for c in 0..args.http_clients {
            let stop = stop.clone();
            https.push(s.spawn(move || crate::http_load::client(args, http, c, &stop)));
        }
        let blocking = if args.connections > 0 {
            0
        } else {
            args.clients
        };
        for c in 0..blocking {
            let (stop, errors, kinds, lost) =
                (stop.clone(), errors.clone(), kinds.clone(), lost.clone());
            let api = apis[c % apis.len()];
            clients.push(s.spawn(move || {
                let mut lat = Vec::new();
                let r = client(args, api, c, &stop, &mut lat, &errors, &kinds, &lost);
                (r, lat)
            }));
        }
        let warm = (duration / 10).max(Duration::from_secs(1)).min(duration);
        std::thread::sleep(warm);
        rss_warm = pid.and_then(rss_mib);
        std::thread::sleep(duration - warm);
        stop.store(true, Ordering::Relaxed);
        let secs = started.elapsed().as_secs_f64();
        let block_events = sent.load(Ordering::Relaxed) - base;
        let cpu = cpu0.zip(pid.and_then(cpu_secs)).map(|(a, b)| b - a);
        let mut out = Vec::new();
        for c in clients {
            if let Ok(x) = c.join() {
                out.push(x);
            }
        }
        let mut piped_out = Vec::new();
        for c in piped {
            match c.join() {
                Ok(r) => piped_out.push(r),
                Err(_) => piped_out.push(Err("connection thread panicked".into())),
            }
        }
        let https: Vec<_> = https.into_iter().filter_map(|h| h.join().ok()).collect();
        let engs: Vec<_> = engs.into_iter().filter_map(|h| h.join().ok()).collect();
        for p in pubs {
            if let Ok(Err(e)) = p.join() {
                eprintln!("kvroute-bench: publisher: {e}");
            }
        }
        (out, piped_out, https, engs, secs, block_events, cpu)
    });
    let mut lat: Vec<u32> = Vec::new();
    let mut decisions = 0u64;
    for (r, l) in results {
        match r {
            Ok(n) => decisions += n,
            Err(e) => return Err(format!("client: {e}")),
        }
        lat.extend(l);
    }
    let mut lag: Vec<u32> = Vec::new();
    let mut kinds = kinds.lock().map(|k| k.clone()).unwrap_or_default();
    let mut errors = errors.load(Ordering::Relaxed);
    let mut lost = lost.load(Ordering::Relaxed);
    for r in piped {
        let r = r.map_err(|e| format!("connection: {e}"))?;
        decisions += r.decisions;
        errors += r.errors;
        lost += r.lost;
        lat.extend(r.latencies_us);
        lag.extend(r.send_lag_us);
        for (k, n) in r.errors_by_kind {
            *kinds.entry(k).or_insert(0) += n;
        }
    }
    let mut http_ops = 0u64;
    for h in https {
        http_ops += h.ops;
        decisions += h.routes;
        errors += h.errors;
        lost += h.lost;
        for (k, n) in h.errors_by_kind {
            *kinds.entry(k).or_insert(0) += n;
        }
    }
    let (mut engine_events, mut engine_garbage, mut engine_unsent) = (0u64, 0u64, 0u64);
    for e in engs {
        engine_events += e.block_events;
        engine_garbage += e.garbage;
        engine_unsent += e.unsent;
    }
    lat.sort_unstable();
    lag.sort_unstable();
    let pipelined = args.connections > 0;
    Ok(Result {
        label,
        seconds: secs,
        block_events_per_s: block_events as f64 / secs,
        decisions_per_s: decisions as f64 / secs,
        errors,
        latency_us_p50: percentile(&lat, 0.5),
        latency_us_p99: percentile(&lat, 0.99),
        latency_us_p999: percentile(&lat, 0.999),
        peak_rss_mib: pid.and_then(peak_rss_mib),
        decisions_lost: lost,
        errors_by_kind: kinds,
        reconnects: reconnects.load(Ordering::Relaxed),
        rss_mib_after_warmup: rss_warm,
        rss_mib_end: pid.and_then(rss_mib),
        clients: if pipelined {
            format!("pipelined {}", args.connections)
        } else {
            format!("blocking {}", args.clients)
        },
        send_lag_us_p50: pipelined.then(|| percentile(&lag, 0.5)),
        send_lag_us_p99: pipelined.then(|| percentile(&lag, 0.99)),
        router_cpu_cores: cpu.map(|c| c / secs),
        router_cpu_us_per_decision: cpu
            .filter(|_| decisions > 0)
            .map(|c| c * 1e6 / decisions as f64),
        http_ops_per_s: http_ops as f64 / secs,
        engine_block_events: engine_events,
        engine_garbage_sent: engine_garbage,
        engine_messages_unsent: engine_unsent,
        engine_router_view: if engines.is_some_and(|e| e.len() > 0) {
            crate::engine_load::router_view(http)
        } else {
            Default::default()
        },
    })
}

pub fn table(rs: &[Result]) -> String {
    let mut s = String::from("| run | clients | block events/s | decisions/s | p50 µs | p99 µs | p999 µs | send lag p50/p99 µs | router CPU cores (µs/decision) | errors | lost | reconnects | RSS MiB warm→end (peak) | HTTP ops/s | engine block events (garbage sent, unsent) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rs {
        s += &format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} {:?} | {} | {} | {} → {} ({}) | {:.0} | {} ({}, {}) |\n",
            r.label,
            r.clients,
            r.block_events_per_s,
            r.decisions_per_s,
            r.latency_us_p50,
            r.latency_us_p99,
            r.latency_us_p999,
            match (r.send_lag_us_p50, r.send_lag_us_p99) {
                (Some(a), Some(b)) => format!("{a:.0} / {b:.0}"),
                _ => "-".into(),
            },
            match (r.router_cpu_cores, r.router_cpu_us_per_decision) {
                (Some(c), Some(d)) => format!("{c:.2} ({d:.0})"),
                (Some(c), None) => format!("{c:.2}"),
                _ => "-".into(),
            },
            r.errors,
            r.errors_by_kind,
            r.decisions_lost,
            r.reconnects,
            r.rss_mib_after_warmup
                .map(|m| format!("{m:.0}"))
                .unwrap_or_else(|| "-".into()),
            r.rss_mib_end
                .map(|m| format!("{m:.0}"))
                .unwrap_or_else(|| "-".into()),
            r.peak_rss_mib
                .map(|m| format!("{m:.0}"))
                .unwrap_or_else(|| "-".into()),
            r.http_ops_per_s,
            r.engine_block_events,
            r.engine_garbage_sent,
            r.engine_messages_unsent
        );
    }
    s
}
