//! `kvroute-sim`: the bundled load tools (DESIGN §4).
//!
//! - `offline`: one routing mode, the engine in-process on virtual time (deterministic
//!   for `--seed`; a whole trace in seconds).
//! - `ab`: the same workload under each routing mode (kv, round-robin, random,
//!   least-loaded; device-aware-weighted on a mixed fleet; kv with `--kv-variant`
//!   knobs), one comparison table and an SVG chart. Offline by default; with
//!   `--spawn-router PATH` each row runs in real time against a private `kvroute serve
//!   --mode X` the tool starts and stops; with `--router-api/--router-events` every row
//!   reuses one running router and picks the mode per request. Offline,
//!   `--sglang-baseline` adds a row for SGLang Model Gateway's `cache_aware` policy.
//! - `run`: real time against a running router (or one it spawns with
//!   `--spawn-router`): a simulated fleet on the binary event protocol plus the frontend
//!   load generator, a progress bar, a table and `--json`. With `--restart-at-secs` the
//!   spawned router is restarted mid-run from its `--state-dir`, and the hit rate before
//!   and after, the decisions lost and the replayed calls are reported.
//!
//! - `tune`: searches the router knobs offline on a workload (seeded, every core, a
//!   progress bar) and prints the recommended `[router]` TOML with its figures against
//!   the defaults (`tune.rs`).
//! - `tokenizer`: writes a small real HF tokenizer directory for `--tokenizer`
//!   (`tokenizer.rs`).
//!
//! - `fleet`: simulated vLLM workers on loopback HTTP ports (OpenAI endpoints, SSE,
//!   NIXL prefill/decode roles, KV events over ZMQ or the binary protocol;
//!   `fleet/`).
//! - `replay`: a Mooncake trace replayed as OpenAI requests against any endpoint
//!   (a worker, kvroute's proxy, another gateway): TTFT / ITL / E2E, stalls and the hit
//!   rate measured at the workers (`replay.rs`).
//! - `relay`: a protocol-less byte relay, the floor of any proxy's added latency on
//!   the machine (`relay.rs`); `--http`: hyper's HTTP/1.1 relay on tokio, the floor
//!   of an HTTP proxy's (`relay_http.rs`); `--route-tokenizer`: that relay doing a
//!   router's work on each request, the control for kvroute's runtime (`relay_route.rs`);
//!   `--events-addr`: routing among workers by their binary KV events, the control
//!   for kvroute's decision latency (`relay_events.rs`);
//! - `probe`: short timed pieces of CPU work on pinned threads, the control for a
//!   router's decision latency on a shared machine (`probe.rs`).
//!
//! - `demo`: the main job in one command (`demo/`): a slice of the bundled trace
//!   through `kvroute serve`'s proxy and through round-robin on simulated workers, hit
//!   rate, TTFT and E2E side by side, and the chart.
//!
//! Every figure is computed by `kvroute::sim` (one model for all paths); hit rate is
//! measured on the simulated workers. Errors are reported, never panics.

mod classes;
mod clock;
mod demo;
mod fleet;
mod probe;
mod relay;
mod relay_events;
mod relay_http;
mod relay_route;
mod replay;
mod restart;
mod runner;
mod setup;
mod tokenizer;
mod tune;

use clap::{Args, Parser, Subcommand};
use kvroute::config::Mode;
use kvroute::sim::{device_table, hit_rate_bound, svg_chart_with_bound, table, Report, SimRequest};
use runner::{RouterAddrs, Variant};
use setup::{parse_pairs, FleetArgs, WorkloadArgs};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kvroute-sim",
    version,
    about = "kvroute load tools: simulated fleet, trace replay, A/B of routing modes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The main job in one command: a trace slice through kvroute's proxy and through
    /// round-robin, on simulated vLLM workers; hit rate, TTFT and E2E side by side.
    Demo(demo::DemoArgs),
    /// One mode, engine in-process on virtual time.
    Offline(OfflineArgs),
    /// Every routing mode on the same workload; one table and an SVG chart.
    Ab(AbArgs),
    /// Real time against a running router (fleet + frontend over the binary protocols).
    Run(RunArgs),
    /// Search the router knobs offline on a workload; print the best `[router]` TOML.
    Tune(tune::TuneArgs),
    /// Simulated vLLM workers serving the OpenAI endpoints (until SIGINT/SIGTERM).
    Fleet(fleet::FleetArgs),
    /// Replay a Mooncake trace as OpenAI requests against an HTTP endpoint.
    Replay(replay::ReplayArgs),
    /// Write a small real HF tokenizer (word tN = token id N) for tests and demos.
    Tokenizer(tokenizer::TokenizerArgs),
    /// A byte relay (no protocol): the floor of any proxy's added latency here.
    Relay(relay::RelayArgs),
    /// Short pieces of CPU work on pinned threads, timed: how often this machine
    /// stretches them past 1 ms (the control for a router's decision latency).
    Probe(probe::ProbeArgs),
}

/// Output and knob flags shared by the subcommands.
#[derive(Args, Clone, Debug)]
pub(crate) struct Common {
    #[command(flatten)]
    work: WorkloadArgs,
    #[command(flatten)]
    fleet: FleetArgs,
    /// Router knobs for every mode, `key=value,...` (RouterConfig fields).
    #[arg(long, default_value = "")]
    knobs: String,
    /// Write the reports (and the hit-rate bound) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct OfflineArgs {
    #[command(flatten)]
    c: Common,
    #[arg(long, default_value = "kv", value_parser = mode_parser())]
    mode: Mode,
}

#[derive(Args)]
struct AbArgs {
    #[command(flatten)]
    c: Common,
    /// Run offline (the default unless a router is given).
    #[arg(long, conflicts_with_all = ["spawn_router", "router_api"])]
    offline: bool,
    /// Start `PATH serve --mode X` per row on free loopback ports (real time).
    #[arg(long)]
    spawn_router: Option<String>,
    /// Reuse this running router's request port (real time, mode per request).
    #[arg(long, requires = "router_events")]
    router_api: Option<String>,
    #[arg(long, requires = "router_api")]
    router_events: Option<String>,
    #[arg(long, default_value = "")]
    auth_token: String,
    /// An extra `kv` row with these knobs (`key=value,...`); repeatable.
    #[arg(long)]
    kv_variant: Vec<String>,
    /// Offline only: add a `sglang-cache-aware` row, a model of SGLang Model Gateway's
    /// `--policy cache_aware` with its defaults (`kvroute::sim::sglang`).
    #[arg(long, conflicts_with_all = ["spawn_router", "router_api"])]
    sglang_baseline: bool,
    /// The `sglang-cache-aware` row's knobs, `key=value,...` (`cache_threshold`,
    /// `balance_abs_threshold`, `balance_rel_threshold`, `max_tree_blocks`,
    /// `eviction_interval_us`; `kvroute::sim::sglang::CacheAwareConfig`).
    #[arg(long, default_value = "", requires = "sglang_baseline")]
    sglang_knobs: String,
    /// Real time: model time runs this many times faster than the wall clock.
    #[arg(long, default_value_t = 60.0)]
    time_scale: f64,
    /// Write the SVG chart (TTFT distribution, hit rate per mode) here.
    #[arg(long)]
    svg: Option<PathBuf>,
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    c: Common,
    /// The running router's request port (or use --spawn-router). Several, comma-
    /// separated, are replicas of one router (`serve --cluster`): route calls go
    /// round-robin over them, lifecycle calls to the replica that routed.
    #[arg(
        long,
        requires = "router_events",
        required_unless_present = "spawn_router"
    )]
    router_api: Option<String>,
    /// The running router's event port; with several replicas one per replica, in the
    /// same order (worker i publishes to replica i mod N).
    #[arg(long, requires = "router_api")]
    router_events: Option<String>,
    /// Start `PATH serve` (with the --knobs as flags) on free loopback ports for the run.
    #[arg(long, conflicts_with = "router_api")]
    spawn_router: Option<String>,
    /// Restart the spawned router (SIGTERM, then the same ports and --state-dir) at
    /// this model time, in seconds; reports the hit rate before and after.
    #[arg(long, requires = "spawn_router")]
    restart_at_secs: Option<f64>,
    /// State directory of the spawned router (default with a restart: a fresh
    /// temporary directory, removed afterwards).
    #[arg(long, requires = "spawn_router")]
    state_dir: Option<PathBuf>,
    /// Do not restart at --restart-at-secs; report the same windows (a baseline).
    #[arg(long, requires = "restart_at_secs")]
    restart_dry_run: bool,
    /// Model seconds of the hit-rate windows before and after the restart.
    #[arg(long, default_value_t = 60.0)]
    window_secs: f64,
    #[arg(long, default_value = "")]
    auth_token: String,
    /// Mode sent with every request (the router's own default applies otherwise).
    #[arg(long, default_value = "kv", value_parser = mode_parser())]
    mode: Mode,
    /// Model time runs this many times faster than the wall clock.
    #[arg(long, default_value_t = 60.0)]
    time_scale: f64,
    #[arg(long)]
    no_progress: bool,
}

/// The routing modes a simulated frontend can ask for: every mode but `direct` (which
/// needs the caller to name the worker). Listed by `--help` and on a bad value.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = Mode> {
    use clap::builder::TypedValueParser;
    let names: Vec<&'static str> = Mode::ALL
        .iter()
        .filter(|m| **m != Mode::Direct)
        .map(|m| m.name())
        .collect();
    clap::builder::PossibleValuesParser::new(names)
        .try_map(|s| Mode::parse(&s).ok_or_else(|| format!("unknown mode {s:?}")))
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvroute-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.cmd {
        Cmd::Offline(a) => {
            let (reqs, fleet, knobs) = prepare(&a.c)?;
            let v = Variant {
                label: a.mode.name().to_string(),
                mode: a.mode,
                knobs,
            };
            let rep = runner::offline(&v, &fleet, &reqs, a.c.work.seed)?;
            emit(&a.c, &reqs, &[rep], &[])
        }
        Cmd::Demo(a) => demo::run(a),
        Cmd::Run(a) => run_realtime(a),
        Cmd::Ab(a) => ab(a),
        Cmd::Tune(a) => tune::tune(a),
        Cmd::Fleet(a) => fleet::run(a),
        Cmd::Replay(a) => replay::run(a),
        Cmd::Tokenizer(a) => tokenizer::run(a),
        Cmd::Relay(a) => relay::run(a),
        Cmd::Probe(a) => probe::run(a),
    }
}

/// `run`: against a running router, or a spawned one (optionally restarted mid-run).
fn run_realtime(a: RunArgs) -> Result<(), String> {
    let (reqs, fleet, knobs) = prepare(&a.c)?;
    let v = Variant {
        label: a.mode.name().to_string(),
        mode: a.mode,
        knobs: Vec::new(),
    };
    let progress = !a.no_progress;
    let Some(bin) = &a.spawn_router else {
        if !knobs.is_empty() {
            eprintln!("note: --knobs are the running router's business; ignored by run");
        }
        let addrs = RouterAddrs {
            api: a.router_api.clone().unwrap_or_default(),
            events: a.router_events.clone().unwrap_or_default(),
            auth_token: a.auth_token.clone(),
        };
        let (rep, pacing) = runner::realtime(
            &v,
            &fleet,
            &reqs,
            a.c.work.seed,
            &addrs,
            a.time_scale,
            progress,
            None,
        )?;
        return emit(&a.c, &reqs, &[rep], &[pacing]);
    };
    if let Some(t) = a.restart_at_secs {
        if !(t.is_finite() && t >= 0.0) {
            return Err("--restart-at-secs must be >= 0".into());
        }
    }
    let temp = match (&a.state_dir, a.restart_at_secs) {
        (None, Some(_)) => {
            Some(std::env::temp_dir().join(format!("kvroute-sim-state-{}", std::process::id())))
        }
        _ => None,
    };
    let mut extra = Vec::new();
    if let Some(dir) = a.state_dir.as_ref().or(temp.as_ref()) {
        extra.push("--state-dir".to_string());
        extra.push(dir.display().to_string());
    }
    let ports = runner::Spawned::free_ports()?;
    let spawned = runner::Spawned::start_on(bin, a.mode, &knobs, &extra, &ports)?;
    let addrs = spawned.addrs.clone();
    let current = std::sync::Arc::new(std::sync::Mutex::new(Some(spawned)));
    let plan = a.restart_at_secs.map(|t| kvroute::sim::RestartPlan {
        at_us: (t * 1e6) as u64,
        restart: if a.restart_dry_run {
            Box::new(restart::DryRun)
        } else {
            Box::new(restart::SpawnedRestart::new(
                bin,
                a.mode,
                &knobs,
                extra.clone(),
                ports.clone(),
                current.clone(),
            ))
        },
    });
    let out = runner::realtime(
        &v,
        &fleet,
        &reqs,
        a.c.work.seed,
        &addrs,
        a.time_scale,
        progress,
        plan,
    );
    // Stop the router (the current one, restarted or not) before reporting.
    if let Ok(mut c) = current.lock() {
        c.take();
    }
    if let Some(dir) = &temp {
        let _ = std::fs::remove_dir_all(dir);
    }
    let (rep, pacing) = out?;
    let window_us = (a.window_secs.max(0.0) * 1e6) as u64;
    let summary = pacing
        .restart
        .as_ref()
        .map(|st| restart::summary(&rep, st, window_us));
    emit(&a.c, &reqs, std::slice::from_ref(&rep), &[pacing])?;
    if let Some(s) = summary {
        println!("{s}");
    }
    Ok(())
}

/// The workload, the fleet and the validated base knobs of a subcommand.
type Prepared = (
    Vec<SimRequest>,
    kvroute::sim::FleetSpec,
    Vec<(String, String)>,
);

pub(crate) fn prepare(c: &Common) -> Result<Prepared, String> {
    let reqs = c.work.load()?;
    let fleet = c.fleet.fleet(c.work.block_size)?;
    let knobs = parse_pairs(&c.knobs)?;
    // Validate the knobs once up front, whatever path uses them.
    setup::router_config(c.work.block_size, &knobs)?;
    Ok((reqs, fleet, knobs))
}

fn ab(a: AbArgs) -> Result<(), String> {
    let (reqs, fleet, knobs) = prepare(&a.c)?;
    let mut modes = vec![Mode::Kv, Mode::RoundRobin, Mode::Random, Mode::LeastLoaded];
    if FleetArgs::mixed(&fleet) {
        modes.push(Mode::DeviceAwareWeighted);
    }
    let mut variants: Vec<Variant> = modes
        .into_iter()
        .map(|m| Variant {
            label: m.name().to_string(),
            mode: m,
            knobs: knobs.clone(),
        })
        .collect();
    for kv in &a.kv_variant {
        let extra = parse_pairs(kv)?;
        let mut all = knobs.clone();
        all.extend(extra.iter().cloned());
        setup::router_config(a.c.work.block_size, &all)?;
        let desc: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
        variants.push(Variant {
            label: format!("kv[{}]", desc.join(",")),
            mode: Mode::Kv,
            knobs: all,
        });
    }
    let shared = match (&a.router_api, &a.router_events) {
        (Some(api), Some(ev)) => Some(RouterAddrs {
            api: api.clone(),
            events: ev.clone(),
            auth_token: a.auth_token.clone(),
        }),
        _ => None,
    };
    if shared.is_some() && variants.iter().any(|v| !v.knobs.is_empty()) {
        return Err("knobs need their own router: use --spawn-router (or --offline)".into());
    }
    let seed = a.c.work.seed;
    let mut reports = Vec::new();
    let mut pacings = Vec::new();
    for v in &variants {
        let rep = if let Some(addrs) = &shared {
            let (r, p) = runner::realtime(
                v,
                &fleet,
                &reqs,
                seed,
                addrs,
                a.time_scale,
                !a.no_progress,
                None,
            )?;
            pacings.push(p);
            r
        } else if let Some(bin) = &a.spawn_router {
            let s = runner::Spawned::start(bin, v.mode, &v.knobs)?;
            let (r, p) = runner::realtime(
                v,
                &fleet,
                &reqs,
                seed,
                &s.addrs,
                a.time_scale,
                !a.no_progress,
                None,
            )?;
            pacings.push(p);
            r
        } else {
            runner::offline(v, &fleet, &reqs, seed)?
        };
        reports.push(rep);
    }
    if a.sglang_baseline {
        reports.push(runner::sglang_offline(
            &fleet,
            &reqs,
            seed,
            &a.sglang_knobs,
        )?);
    }
    if let Some(p) = &a.svg {
        let bound = hit_rate_bound(&reqs, a.c.work.block_size).ratio;
        std::fs::write(p, svg_chart_with_bound(&reports, Some(bound)))
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    emit(&a.c, &reqs, &reports, &pacings)
}

/// Prints the bound, the table and pacing lines; writes JSON if asked.
fn emit(
    c: &Common,
    reqs: &[SimRequest],
    reports: &[Report],
    pacings: &[runner::Pacing],
) -> Result<(), String> {
    let bound = hit_rate_bound(reqs, c.work.block_size);
    let fleet = c.fleet.fleet(c.work.block_size)?;
    println!(
        "{} requests, {} workers; hit-rate bound (one shared unlimited cache): {:.1}%",
        reqs.len(),
        fleet.workers.len(),
        bound.ratio * 100.0
    );
    print!("{}", table(reports));
    print!("{}", device_table(reports));
    for (r, p) in reports.iter().zip(pacings) {
        println!(
            "{}: real time x{} in {:.1} s wall over {} router replica(s); pacing lag p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs",
            r.name(),
            p.time_scale,
            p.wall_s,
            p.replicas,
            p.lag_p50_us,
            p.lag_p99_us,
            p.lag_max_us
        );
    }
    for r in reports.iter().filter(|r| r.errors > 0) {
        println!("{} errors: {:?}", r.name(), r.error_samples);
    }
    if let Some(path) = &c.json {
        let v = serde_json::json!({
            "bound": bound,
            "reports": reports,
            "pacing": pacings,
        });
        let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
