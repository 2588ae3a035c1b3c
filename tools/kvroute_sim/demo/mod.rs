//! `kvroute-sim demo`: kvroute's main job in one command, with no configuration.
//!
//! Replays the first requests of the bundled Mooncake conversation trace (embedded in
//! this binary) as OpenAI streaming completions, twice, each time on a fresh simulated
//! vLLM fleet (`kvroute-sim fleet`: KV caches, prefill/decode timing, KV events over
//! ZMQ) behind the real `kvroute serve` found next to this binary: once routing by KV
//! cache (`--mode kv`, the default), once with `--mode round-robin` (the same proxy, so
//! the two rows differ only in where requests go). Prints hit rate (measured at the
//! workers), TTFT and E2E side by side and writes the chart (`kvroute::sim`'s SVG
//! report) and the JSON reports.
//!
//! Everything the demo starts stops when it ends, on success, on error and on
//! Ctrl-C / SIGTERM ([`procs`]).

mod procs;

use clap::Args;
use kvroute::config::Mode;
use kvroute::sim::report::{imbalance, WorkerCount};
use kvroute::sim::{Percentiles, Report};
use kvroute::types::Role;
use procs::{Fleet, FleetPlan, Router};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first 1,000 requests of the Mooncake conversation trace (tests/data/README.md).
const BUNDLED_TRACE: &str = include_str!("../../../tests/data/mooncake_slice.jsonl");

/// The model name the fleet serves and the router tokenizes for.
const MODEL: &str = "sim-model";

/// Tokens per KV block, the router's default and the fleet's.
const BLOCK_SIZE: u32 = 128;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Requests replayed, from the start of the trace.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// Simulated workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// KV cache of each worker, in blocks of 128 tokens.
    #[arg(long, default_value_t = 8192)]
    capacity_blocks: usize,
    /// The trace's arrivals and the workers' timing model run this many times faster
    /// than the wall clock.
    #[arg(long, default_value_t = 20.0)]
    time_scale: f64,
    /// Cap each answer at this many tokens.
    #[arg(long, default_value_t = 16)]
    max_output_tokens: u32,
    /// Cut each prompt to this many tokens (shared prefixes stay shared).
    #[arg(long)]
    max_input_tokens: Option<usize>,
    /// Mooncake trace to replay instead of the bundled slice.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Directory for the chart (demo.svg), the reports (demo.json), the replayed
    /// trace, the tokenizer and the logs; default `demo/` beside this binary.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The kvroute binary (default: the one beside this binary).
    #[arg(long)]
    kvroute: Option<PathBuf>,
}

/// One row: a router configuration and what its replay measured.
struct Row {
    label: &'static str,
    mode: Mode,
    replay: Value,
}

pub fn run(a: DemoArgs) -> Result<(), String> {
    if a.limit == 0 || a.workers == 0 || a.capacity_blocks == 0 {
        return Err("--limit, --workers and --capacity-blocks must be > 0".into());
    }
    if !(a.time_scale.is_finite() && a.time_scale > 0.0) {
        return Err("--time-scale must be > 0".into());
    }
    let bin = procs::kvroute_bin(a.kvroute.as_ref())?;
    let out = out_dir(a.out.as_ref())?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| format!("signal handler: {e}"))?;
    }
    let trace = match &a.trace {
        Some(t) => t.clone(),
        None => {
            let p = out.join("trace.jsonl");
            std::fs::write(&p, BUNDLED_TRACE).map_err(|e| format!("{}: {e}", p.display()))?;
            p
        }
    };
    let tokenizer = out.join("tokenizer");
    kvroute::tokenize::testing::write_dir(&tokenizer, kvroute::tokenize::testing::DEFAULT_VOCAB)?;
    let bound = bound(&trace, a.limit, a.max_input_tokens)?;
    println!(
        "kvroute demo: {} requests of the Mooncake conversation trace, replayed {}x faster \
         than recorded as streaming OpenAI completions,\nthrough kvroute's proxy to {} \
         simulated vLLM workers ({} KV blocks of {BLOCK_SIZE} tokens each), then through \
         round-robin on a fresh fleet.\n",
        a.limit, a.time_scale, a.workers, a.capacity_blocks
    );
    let mut rows = Vec::new();
    let mut commands = Vec::new();
    for (label, mode) in [("kvroute", Mode::Kv), ("round-robin", Mode::RoundRobin)] {
        let (replay, cmd) = one_row(&a, &bin, &out, &trace, &tokenizer, label, mode, &stop)?;
        commands.push(cmd);
        rows.push(Row {
            label,
            mode,
            replay,
        });
    }
    println!();
    print!("{}", table(&rows));
    println!(
        "hit rate = prompt blocks found in the chosen worker's KV cache (no router can \
         beat {:.1} % here: one shared cache that never evicts);\nTTFT / E2E = ms from \
         sending a request to the first / last byte of its stream (wall clock; the \
         workers run {}x faster than real time).",
        bound * 100.0,
        a.time_scale
    );
    if let Some(s) = summary(&rows) {
        println!("{s}");
    }
    let reports: Vec<Report> = rows.iter().map(report).collect();
    let svg = out.join("demo.svg");
    std::fs::write(
        &svg,
        kvroute::sim::svg_chart_with_bound(&reports, Some(bound)),
    )
    .map_err(|e| format!("{}: {e}", svg.display()))?;
    let json = out.join("demo.json");
    let doc = serde_json::json!({
        "bound": bound,
        "rows": rows.iter().map(|r| serde_json::json!({
            "router": r.label, "mode": r.mode.name(), "replay": r.replay,
        })).collect::<Vec<_>>(),
        "commands": commands,
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&json, text).map_err(|e| format!("{}: {e}", json.display()))?;
    println!(
        "chart: {}\nreports and the commands that ran: {}",
        shown(&svg),
        shown(&json)
    );
    Ok(())
}

/// `p` relative to the working directory when it lies under it.
fn shown(p: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|d| p.strip_prefix(d).ok().map(|r| r.display().to_string()))
        .unwrap_or_else(|| p.display().to_string())
}

/// Runs one row on a fresh fleet and router; both are stopped before it returns.
/// Returns the replay's report and the router's command line.
#[allow(clippy::too_many_arguments)]
fn one_row(
    a: &DemoArgs,
    bin: &Path,
    out: &Path,
    trace: &Path,
    tokenizer: &Path,
    label: &str,
    mode: Mode,
    stop: &Arc<AtomicBool>,
) -> Result<(Value, String), String> {
    let t0 = Instant::now();
    let plan = FleetPlan {
        workers: a.workers,
        capacity_blocks: a.capacity_blocks,
        time_scale: a.time_scale,
        tokenizer,
        model: MODEL,
    };
    let fleet = Fleet::start(&plan, &out.join(format!("fleet-{label}.log")))?;
    print!(
        "{label:<12} {} simulated workers (pid {}), ",
        fleet.urls.len(),
        fleet.proc.pid()
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let router = Router::start(
        bin,
        mode.name(),
        &fleet,
        MODEL,
        tokenizer,
        &out.join(format!("kvroute-{label}.log")),
    )?;
    println!(
        "kvroute serve --mode {} in front (pid {}): replaying {} requests...",
        mode.name(),
        router.proc.pid(),
        a.limit
    );
    let mut argv: Vec<String> = vec![
        "replay".into(),
        "--trace".into(),
        trace.display().to_string(),
        "--target".into(),
        router.proxy_url.clone(),
        "--workers-stats".into(),
        fleet.urls.join(","),
        "--limit".into(),
        a.limit.to_string(),
        "--time-scale".into(),
        a.time_scale.to_string(),
        "--stream".into(),
        "--max-output-tokens".into(),
        a.max_output_tokens.to_string(),
        "--model".into(),
        MODEL.into(),
    ];
    if let Some(n) = a.max_input_tokens {
        argv.push("--max-input-tokens".into());
        argv.push(n.to_string());
    }
    let replay_args = crate::replay::ReplayArgs::parse_argv(&argv)?;
    let worker = std::thread::spawn(move || crate::replay::measure(&replay_args));
    while !worker.is_finished() {
        if stop.load(Ordering::Relaxed) {
            // `fleet` and `router` are dropped on the way out: both are stopped.
            return Err("interrupted; stopped the router and the fleet".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let replay = worker
        .join()
        .map_err(|_| "the replay thread panicked".to_string())??;
    let command = format!("kvroute {}", router.args.join(" "));
    drop(router);
    drop(fleet);
    println!(
        "{label:<12} done in {:.1} s; router and fleet stopped",
        t0.elapsed().as_secs_f64()
    );
    Ok((replay, command))
}

/// The output directory, created: `out`, or `demo/` beside this binary.
fn out_dir(out: Option<&PathBuf>) -> Result<PathBuf, String> {
    let dir = match out {
        Some(d) => d.clone(),
        None => {
            let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
            me.parent().ok_or("own path has no directory")?.join("demo")
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// The hit-rate bound of the replayed prompts (one shared cache that never evicts),
/// cut to `max_input` tokens as the replay cuts them.
fn bound(trace: &Path, limit: usize, max_input: Option<usize>) -> Result<f64, String> {
    let opts = kvroute::sim::TraceOptions {
        block_size: BLOCK_SIZE,
        speed: 1.0,
        limit: Some(limit),
    };
    let mut reqs = kvroute::sim::read_mooncake(trace, &opts).map_err(|e| e.to_string())?;
    if let Some(m) = max_input {
        let m = u32::try_from(m).unwrap_or(u32::MAX);
        for r in &mut reqs {
            r.input_tokens = r.input_tokens.min(m);
            r.hashes.truncate((r.input_tokens / BLOCK_SIZE) as usize);
        }
    }
    Ok(kvroute::sim::hit_rate_bound(&reqs, BLOCK_SIZE).ratio)
}

fn num(v: &Value, path: &str) -> f64 {
    v.pointer(path).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Requests per worker as the fleet counted them.
fn worker_counts(replay: &Value) -> Vec<WorkerCount> {
    replay["worker_requests"]
        .as_array()
        .map(|a| {
            a.iter()
                .enumerate()
                .map(|(i, n)| WorkerCount {
                    worker: format!("sim-{i}"),
                    role: Role::Aggregated,
                    jobs: n.as_u64().unwrap_or(0),
                    ..Default::default()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The side-by-side table.
fn table(rows: &[Row]) -> String {
    let header = [
        "router",
        "requests",
        "errors",
        "hit rate",
        "TTFT p50",
        "TTFT p99",
        "E2E p50",
        "E2E p99",
        "imbalance",
    ];
    let mut lines = vec![header.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    for r in rows {
        let v = &r.replay;
        let hit = v["hit_rate"]
            .as_f64()
            .map_or("-".to_string(), |h| format!("{:.1} %", h * 100.0));
        lines.push(vec![
            r.label.to_string(),
            v["requests"].as_u64().unwrap_or(0).to_string(),
            v["errors"].as_u64().unwrap_or(0).to_string(),
            hit,
            format!("{:.1}", num(v, "/ttft_ms/p50")),
            format!("{:.1}", num(v, "/ttft_ms/p99")),
            format!("{:.1}", num(v, "/e2e_ms/p50")),
            format!("{:.1}", num(v, "/e2e_ms/p99")),
            format!("{:.2}", imbalance(&worker_counts(v))),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut s = String::new();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c == 0 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        s.push_str(cells.join("  ").trim_end());
        s.push('\n');
    }
    s
}

/// kvroute against round-robin in one sentence (None if a figure is missing).
fn summary(rows: &[Row]) -> Option<String> {
    let [kv, rr] = rows else { return None };
    let hit = |r: &Row| r.replay["hit_rate"].as_f64();
    let (hk, hr) = (hit(kv)?, hit(rr)?);
    let (tk, tr) = (
        num(&kv.replay, "/ttft_ms/p50"),
        num(&rr.replay, "/ttft_ms/p50"),
    );
    if hr <= 0.0 || tk <= 0.0 {
        return None;
    }
    Some(format!(
        "kvroute against round-robin: {:.1}x the cache hits, TTFT p50 {:.1}x {}.",
        hk / hr,
        if tk <= tr { tr / tk } else { tk / tr },
        if tk <= tr { "lower" } else { "higher" }
    ))
}

/// A row as the simulator's report, for its SVG chart (TTFT p50/p90/p99, hit rate).
fn report(r: &Row) -> Report {
    let v = &r.replay;
    let pct = |k: &str| Percentiles {
        p50: num(v, &format!("/{k}/p50")) * 1000.0,
        p90: num(v, &format!("/{k}/p90")) * 1000.0,
        p99: num(v, &format!("/{k}/p99")) * 1000.0,
        max: num(v, &format!("/{k}/max")) * 1000.0,
        count: v["ok"].as_u64().unwrap_or(0),
    };
    let counts = worker_counts(v);
    Report {
        label: r.label.to_string(),
        mode: r.mode,
        requests: v["requests"].as_u64().unwrap_or(0),
        finished: v["ok"].as_u64().unwrap_or(0),
        errors: v["errors"].as_u64().unwrap_or(0),
        hit_rate: v["hit_rate"].as_f64().unwrap_or(0.0),
        ttft_us: pct("ttft_ms"),
        e2e_us: pct("e2e_ms"),
        imbalance: imbalance(&counts),
        jobs_per_worker: counts,
        ..Default::default()
    }
}
