//! `kvroute-bench`: the service benchmark. Drives a running (or spawned) `kvroute serve`
//! over its real binary protocols, from many connections at once:
//! - sustained KV event ingest from `--workers` event connections (each keeps its
//!   indexed blocks bounded by removing its oldest batches, like a real cache);
//! - routing decisions at `--rate` per second (route + finish per request), latency
//!   measured at the client: either `--clients` blocking threads, one connection each
//!   (send, wait for the answer, send the next), or with `--connections N` an
//!   open-loop pipelined client over N connections (`pipelined`: requests go out at
//!   their scheduled times whatever is outstanding; latency from the scheduled time).
//!
//! It reports events/s, decisions/s, decision latency p50/p99/p999 and the router's
//! peak RSS. `--spawn PATH --cores 1,2` starts the router itself once per core count
//! (on free loopback ports) to show scaling. `--replicas N` (with `--spawn`) runs the
//! soak against a tier instead (`soak`): N replicas on NATS, a simulated fleet behind
//! their proxies, proxy traffic, slow clients and replica restarts. Loopback only;
//! every loop is bounded by `--duration`.

mod engine_load;
mod http_load;
mod load;
mod pipelined;
mod proxy_load;
mod slow_load;
mod soak;
mod tier;

use clap::Parser;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "kvroute-bench",
    about = "Service benchmark for kvroute (loopback)"
)]
pub struct Args {
    /// Event address of a running router (ignored with --spawn); several, comma-
    /// separated, are replicas of one router (`serve --cluster`), one per --api entry.
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub events: String,
    /// Binary API address of a running router (ignored with --spawn); several, comma-
    /// separated, are replicas: request connection c talks to replica c mod N.
    #[arg(long, default_value = "127.0.0.1:7401")]
    pub api: String,
    /// HTTP address of a running router (ignored with --spawn; used by --http-clients).
    #[arg(long, default_value = "127.0.0.1:7480")]
    pub http: String,
    /// Start this kvroute binary for each --cores value instead of using a running one.
    #[arg(long)]
    pub spawn: Option<String>,
    /// Core counts to compare with --spawn, e.g. "1,2".
    #[arg(long, default_value = "2")]
    pub cores: String,
    /// PID of a running router, to report its peak RSS.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Event connections (simulated workers).
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// Block hashes per Stored event.
    #[arg(long, default_value_t = 64)]
    pub blocks_per_event: usize,
    /// Indexed blocks each worker keeps (oldest batches removed beyond it).
    #[arg(long, default_value_t = 200_000)]
    pub worker_blocks: usize,
    /// Target block events/s over all workers (0 = as fast as the router accepts).
    #[arg(long, default_value_t = 0)]
    pub event_rate: u64,
    /// Blocking request clients (one thread and connection each; used when
    /// --connections is 0).
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Pipelined open-loop request connections (0 = use --clients blocking threads).
    #[arg(long, default_value_t = 0)]
    pub connections: usize,
    /// Target routing decisions/s over all clients.
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
    /// Blocks per routing request.
    #[arg(long, default_value_t = 64)]
    pub request_blocks: usize,
    /// Seconds of measurement.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Soak mode: worker connections are dropped and restored at random (about one
    /// drop per worker every `--drop-every` seconds); reports lost decisions, errors by
    /// kind and the router's RSS after warm-up and at the end.
    #[arg(long)]
    pub soak: bool,
    #[arg(long, default_value_t = 20)]
    pub drop_every: u64,
    /// JSON/HTTP clients (`http_load`): each registers a worker over HTTP, posts its
    /// events, routes and finishes over one keep-alive connection, and now and then
    /// sends a malformed body that must be refused with 400.
    #[arg(long, default_value_t = 0)]
    pub http_clients: usize,
    /// Iterations/s over all HTTP clients (each: one events post, one route, one
    /// finish).
    #[arg(long, default_value_t = 200)]
    pub http_rate: u64,
    /// Simulated vLLM engines publishing KV events over ZMQ (`engine_load`; needs
    /// --spawn: the spawned router subscribes to them with `--engine`).
    #[arg(long, default_value_t = 0)]
    pub engines: usize,
    /// Block events/s over all engines.
    #[arg(long, default_value_t = 20_000)]
    pub engine_rate: u64,
    /// Tier soak (with --spawn): this many `serve --cluster` replicas on NATS
    /// JetStream, a `kvroute-sim fleet` behind their proxies (`soak`). The binary and
    /// JSON load goes to replica 0; proxy and slow clients to every replica.
    #[arg(long, default_value_t = 0)]
    pub replicas: usize,
    /// NATS server of the tier (JetStream on); none: `nats-server` is started.
    #[arg(long)]
    pub nats: Option<String>,
    /// The `kvroute-sim` binary (default: next to the --spawn binary).
    #[arg(long)]
    pub sim: Option<String>,
    /// Simulated workers of the tier's fleet.
    #[arg(long, default_value_t = 4)]
    pub fleet_workers: usize,
    /// The fleet's timing model (`kvroute-sim fleet --timing`).
    #[arg(
        long,
        default_value = "prefill_base_us=2000,prefill_us_per_token=5,decode_step_base_us=5000"
    )]
    pub fleet_timing: String,
    /// Proxy clients (completions through every replica, half streamed).
    #[arg(long, default_value_t = 0)]
    pub proxy_clients: usize,
    /// Proxied requests/s over all proxy clients.
    #[arg(long, default_value_t = 50)]
    pub proxy_rate: u64,
    /// Slow connections on every HTTP port: trickled heads, trickled bodies, slow
    /// stream readers (a third each).
    #[arg(long, default_value_t = 0)]
    pub slow_clients: usize,
    /// Restart the last replica (SIGTERM, then start it again) every this many
    /// seconds; 0: never.
    #[arg(long, default_value_t = 0)]
    pub restart_every: u64,
    /// One more `kvroute serve` flag for every replica (repeatable), e.g.
    /// `--replica-arg=--cluster-token --replica-arg=SECRET`.
    #[arg(long, allow_hyphen_values = true)]
    pub replica_arg: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<String>,
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Spawned {
    child: Child,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        kvroute::process::terminate(&mut self.child, Duration::from_secs(10));
    }
}

/// Addresses of the router under load.
pub struct Addrs {
    pub events: String,
    pub api: String,
    pub http: String,
}

fn spawn(
    path: &str,
    cores: usize,
    engines: &engine_load::Engines,
) -> Result<(Spawned, Addrs), String> {
    let p = |_| free_port().map_err(|e| e.to_string());
    let (e, a, h) = (p(0)?, p(1)?, p(2)?);
    let events = format!("127.0.0.1:{e}");
    let api = format!("127.0.0.1:{a}");
    let http = format!("127.0.0.1:{h}");
    let child = Command::new(path)
        .args([
            "serve",
            "--proxy-addr",
            "off",
            "--cores",
            &cores.to_string(),
            "--events-addr",
            &events,
            "--api-addr",
            &api,
        ])
        .args(["--http-addr", &http, "--max-blocks-per-worker", "100000000"])
        .args(engines.router_flags())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {path}: {e}"))?;
    let s = Spawned { child };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&api).is_err() {
        if Instant::now() > deadline {
            return Err("router did not start".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((s, Addrs { events, api, http }))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let mut results = Vec::new();
    let run = |args: &Args,
               addrs: &Addrs,
               engines: Option<&engine_load::Engines>,
               pid: Option<u32>,
               label: String| {
        let clients = if args.connections > 0 {
            format!("{} pipelined connections", args.connections)
        } else {
            format!("{} blocking clients", args.clients)
        };
        eprintln!(
            "kvroute-bench: {label}: {} workers, {clients} at {}/s, {} s",
            args.workers, args.rate, args.duration
        );
        load::run(args, addrs, engines, pid, label)
    };
    if args.replicas > 0 {
        let Some(path) = args.spawn.clone() else {
            eprintln!("kvroute-bench: --replicas needs --spawn (the tier is started here)");
            return std::process::ExitCode::from(2);
        };
        eprintln!(
            "kvroute-bench: tier soak: {} replicas, {} fleet workers, {} proxy clients at {}/s, {} slow clients, restart every {} s, {} s",
            args.replicas, args.fleet_workers, args.proxy_clients, args.proxy_rate,
            args.slow_clients, args.restart_every, args.duration
        );
        return match soak::run(&args, &path) {
            Ok((r, tier)) => {
                println!("{}", load::table(std::slice::from_ref(&r)));
                soak::print(&tier);
                if let Some(path) = &args.json {
                    let v = serde_json::json!({"load": r, "tier": tier});
                    let text = serde_json::to_string_pretty(&v).unwrap_or_default();
                    if let Err(e) = std::fs::write(path, text) {
                        eprintln!("kvroute-bench: writing {path}: {e}");
                    }
                }
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kvroute-bench: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if args.engines > 0 && args.spawn.is_none() {
        eprintln!("kvroute-bench: --engines needs --spawn (the router must subscribe to them)");
        return std::process::ExitCode::from(2);
    }
    if let Some(path) = &args.spawn {
        for c in args.cores.split(',') {
            let Ok(cores) = c.trim().parse::<usize>() else {
                eprintln!("kvroute-bench: bad --cores value {c:?}");
                return std::process::ExitCode::from(2);
            };
            let engines = match engine_load::Engines::bind(args.engines) {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("kvroute-bench: cannot bind engine publishers: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            match spawn(path, cores, &engines) {
                Ok((s, addrs)) => {
                    let pid = s.child.id();
                    let label = format!("cores={cores}");
                    match run(&args, &addrs, Some(&engines), Some(pid), label) {
                        Ok(r) => results.push(r),
                        Err(e) => {
                            eprintln!("kvroute-bench: {e}");
                            return std::process::ExitCode::FAILURE;
                        }
                    }
                }
                Err(e) => {
                    eprintln!("kvroute-bench: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            }
        }
    } else {
        let addrs = Addrs {
            events: args.events.clone(),
            api: args.api.clone(),
            http: args.http.clone(),
        };
        match run(&args, &addrs, None, args.pid, "router".into()) {
            Ok(r) => results.push(r),
            Err(e) => {
                eprintln!("kvroute-bench: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    println!("{}", load::table(&results));
    for r in results.iter().filter(|r| !r.engine_router_view.is_empty()) {
        println!(
            "{}: router's engine stream counters: {:?}",
            r.label, r.engine_router_view
        );
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("kvroute-bench: writing {path}: {e}");
        }
    }
    std::process::ExitCode::SUCCESS
}
