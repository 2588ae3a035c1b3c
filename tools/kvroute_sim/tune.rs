//! `kvroute-sim tune`: searches the `[router]` knob space offline on a workload (a
//! recorded trace, typically) and prints the recommended settings as TOML, with the
//! figures they give against the defaults.
//!
//! The search itself is `kvroute::sim::tune` (pure); this module runs its candidates:
//! each is one deterministic offline simulation (kv mode, base `--knobs` plus the
//! candidate's), run `--threads` at a time on std threads. Batches have a fixed size
//! ([`CHUNK`]) whatever the thread count, so the result depends on the seed only. The
//! run time is bounded by `--budget` (configurations) and `--limit` (requests).

use crate::runner::{self, Variant};
use crate::setup::{self, parse_pairs};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvroute::config::{Mode, RouterConfig};
use kvroute::sim::tune::{Dim, Figures, Objective, Point, Search, Space};
use kvroute::sim::{device_table, hit_rate_bound, table, FleetSpec, Report, SimRequest};
use kvroute::types::Role;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Candidates per search step (independent of `--threads`, for determinism).
const CHUNK: usize = 4;

#[derive(Args)]
pub struct TuneArgs {
    #[command(flatten)]
    pub c: crate::Common,
    /// Most configurations to simulate (the defaults included).
    #[arg(long, default_value_t = 40)]
    pub budget: usize,
    /// Simulations run at once (default: the available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// A search dimension `key=v1|v2|...` (a RouterConfig field), replacing the
    /// default dimension of that key or adding one; repeatable.
    #[arg(long)]
    pub space: Vec<String>,
    /// Search only the --space dimensions, not the default ones.
    #[arg(long, requires = "space")]
    pub space_only: bool,
    /// Also report these settings (`key=value,...`), e.g. a documented tuned set, as a
    /// reference row scored by the same objective; repeatable. Not part of the search.
    #[arg(long)]
    pub compare: Vec<String>,
    /// Objective: weight of hit rate lost against the defaults, per whole bound.
    #[arg(long, default_value_t = 1.0)]
    pub hit_weight: f64,
    /// Objective: weight of imbalance above --max-imbalance.
    #[arg(long, default_value_t = 1.0)]
    pub imbalance_weight: f64,
    /// Objective: imbalance (max ÷ mean requests per worker) that costs nothing.
    #[arg(long, default_value_t = 1.25)]
    pub max_imbalance: f64,
    /// Objective: weight of E2E p99 relative to the defaults' (0: not counted).
    #[arg(long, default_value_t = 0.0)]
    pub e2e_weight: f64,
    /// Also write the recommended `[router]` TOML to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub no_progress: bool,
}

/// One simulated configuration.
struct Eval {
    report: Report,
}

/// Simulates every knob set of `sets` on `threads` threads; results in input order.
fn simulate(
    sets: &[Vec<(String, String)>],
    fleet: &FleetSpec,
    reqs: &[SimRequest],
    seed: u64,
    threads: usize,
    bar: &ProgressBar,
) -> Result<Vec<Eval>, String> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Result<Report, String>>>> =
        Mutex::new((0..sets.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, sets.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(knobs) = sets.get(i) else { break };
                let v = Variant {
                    label: String::new(),
                    mode: Mode::Kv,
                    knobs: knobs.clone(),
                };
                let r = runner::offline(&v, fleet, reqs, seed);
                bar.inc(1);
                if let Ok(mut o) = out.lock() {
                    o[i] = Some(r);
                }
            });
        }
    });
    let done = out
        .into_inner()
        .map_err(|_| "a simulation thread panicked")?;
    done.into_iter()
        .map(|r| {
            let report = r.ok_or("a simulation did not run")??;
            Ok(Eval { report })
        })
        .collect()
}

/// `key = value` lines of the `[router]` table for `knobs` applied to the defaults:
/// only the keys whose value differs from `RouterConfig::default()`.
fn router_toml(block_size: u32, knobs: &[(String, String)]) -> Result<String, String> {
    let cfg = setup::router_config(block_size, knobs)?;
    let def = toml::Value::try_from(RouterConfig::default()).map_err(|e| e.to_string())?;
    let cur = toml::Value::try_from(cfg).map_err(|e| e.to_string())?;
    let (Some(def), Some(cur)) = (def.as_table(), cur.as_table()) else {
        return Err("router settings are not a table".into());
    };
    let mut changed = toml::Table::new();
    for (k, v) in cur {
        if def.get(k) != Some(v) {
            changed.insert(k.clone(), v.clone());
        }
    }
    let mut doc = toml::Table::new();
    doc.insert("router".into(), toml::Value::Table(changed));
    toml::to_string(&doc).map_err(|e| e.to_string())
}

fn desc(knobs: &[(String, String)]) -> String {
    let v: Vec<String> = knobs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    v.join(",")
}

fn pct(new: f64, old: f64) -> String {
    if old > 0.0 {
        format!("{:+.1}%", (new / old - 1.0) * 100.0)
    } else {
        "n/a".into()
    }
}

pub fn tune(a: TuneArgs) -> Result<(), String> {
    let (reqs, fleet, base) = crate::prepare(&a.c)?;
    let bs = a.c.work.block_size;
    let mixed = setup::FleetArgs::mixed(&fleet);
    let disagg = fleet.workers.iter().any(|w| w.role != Role::Aggregated);
    let mut space = if a.space_only {
        Space::default()
    } else {
        Space::default_for(mixed, disagg)
    };
    for s in &a.space {
        space.set(Dim::parse(s)?);
    }
    // Every value of every dimension must be a valid knob on top of the base.
    for d in &space.dims {
        for v in &d.values {
            let mut k = base.clone();
            k.push((d.key.clone(), v.clone()));
            setup::router_config(bs, &k).map_err(|e| format!("--space {}={v}: {e}", d.key))?;
        }
    }
    let start_cfg = setup::router_config(bs, &base)?;
    let cur = serde_json::to_value(&start_cfg).map_err(|e| e.to_string())?;
    let start = space.start_point(cur.as_object().ok_or("config is not an object")?)?;
    let bound = hit_rate_bound(&reqs, bs);
    let objective = Objective {
        hit_weight: a.hit_weight,
        imbalance_weight: a.imbalance_weight,
        max_imbalance: a.max_imbalance,
        e2e_weight: a.e2e_weight,
        bound: bound.ratio,
    };
    let mut compares = Vec::new();
    for c in &a.compare {
        let mut k = base.clone();
        k.extend(parse_pairs(c)?);
        setup::router_config(bs, &k)?;
        compares.push(k);
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let mut search = Search::new(space, start, objective, a.budget, a.c.work.seed)?;
    let total = a
        .budget
        .min(usize::try_from(search.space().size()).unwrap_or(usize::MAX));
    let bar = if a.no_progress {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new((total + compares.len()) as u64);
        if let Ok(style) = ProgressStyle::with_template(
            "tune [{elapsed_precise}] {wide_bar} {pos}/{len} configs ({eta}) {msg}",
        ) {
            b.set_style(style);
        }
        b
    };
    let wall = Instant::now();
    let with_base = |p: &Point, s: &Search| {
        let mut k = base.clone();
        k.extend(s.space().knobs(p));
        k
    };
    let mut evals: Vec<(Point, Eval)> = Vec::new();
    loop {
        let batch = search.next_batch(CHUNK);
        if batch.is_empty() {
            break;
        }
        let sets: Vec<_> = batch.iter().map(|p| with_base(p, &search)).collect();
        let done = simulate(&sets, &fleet, &reqs, a.c.work.seed, threads, &bar)?;
        for (p, e) in batch.into_iter().zip(done) {
            search.record(&p, Figures::of(&e.report));
            evals.push((p, e));
        }
        if let Some((_, s)) = search.best() {
            bar.set_message(format!("best score {s:.3}"));
        }
    }
    let compared = simulate(&compares, &fleet, &reqs, a.c.work.seed, threads, &bar)?;
    bar.finish_and_clear();
    let secs = wall.elapsed().as_secs_f64();

    let (best, best_score) = search.best().ok_or("nothing was simulated")?;
    let find = |p: &Point| evals.iter().find(|(q, _)| q == p).map(|(_, e)| e);
    let base_eval = find(search.start()).ok_or("the defaults were not simulated")?;
    let best_eval = find(&best).ok_or("the best point was not kept")?;
    let base_score = search.score_of(search.start()).unwrap_or(f64::NAN);

    let mut rows = Vec::new();
    let mut scores = Vec::new();
    let mut push = |label: String, r: &Report, score: f64| {
        let mut r = r.clone();
        r.label = label;
        rows.push(r);
        scores.push(score);
    };
    push("defaults".into(), &base_eval.report, base_score);
    push("recommended".into(), &best_eval.report, best_score);
    for (c, e) in a.compare.iter().zip(&compared) {
        let s = search
            .score_figures(&Figures::of(&e.report))
            .unwrap_or(f64::NAN);
        push(format!("compare[{c}]"), &e.report, s);
    }
    println!(
        "{} requests, {} workers; hit-rate bound (one shared unlimited cache): {:.1}%",
        reqs.len(),
        fleet.workers.len(),
        bound.ratio * 100.0
    );
    println!(
        "tune: {} of {} configurations simulated (budget {}), {} threads, {:.1} s",
        search.history().len(),
        search.space().size(),
        a.budget,
        threads,
        secs
    );
    let e2e = if objective.e2e_weight > 0.0 {
        format!(
            " + {} x (e2e_p99/e2e_p99(defaults) - 1)",
            objective.e2e_weight
        )
    } else {
        String::new()
    };
    println!(
        "objective (lower is better): ttft_p99/ttft_p99(defaults) + {} x hit-rate lost/bound + {} x max(0, {}imbalance - {}){e2e}",
        objective.hit_weight,
        objective.imbalance_weight,
        if mixed { "per-device-class " } else { "" },
        objective.max_imbalance
    );
    let mut t = table(&rows);
    // Append the score to each row of the table.
    let mut lines: Vec<String> = t.lines().map(str::to_string).collect();
    if let Some(h) = lines.first_mut() {
        h.push_str("   score");
    }
    for (l, s) in lines.iter_mut().skip(1).zip(&scores) {
        l.push_str(&format!("  {s:>6.3}"));
    }
    t = lines.join("\n");
    println!("{t}");
    print!("{}", device_table(&rows));
    let (b, r) = (&base_eval.report, &best_eval.report);
    println!(
        "recommended vs defaults: TTFT p99 {}, E2E p99 {}, hit rate {:+.1} points, imbalance {:.2} -> {:.2}",
        pct(r.ttft_us.p99, b.ttft_us.p99),
        pct(r.e2e_us.p99, b.e2e_us.p99),
        (r.hit_rate - b.hit_rate) * 100.0,
        b.imbalance,
        r.imbalance
    );
    let searched = search.space().knobs(&best);
    let mut knobs = base.clone();
    knobs.extend(searched.iter().cloned());
    let mut toml_text = format!(
        "# kvroute-sim tune: score {best_score:.3} vs {base_score:.3} for the defaults; searched knobs {}\n",
        desc(&searched)
    );
    if best == *search.start() {
        toml_text.push_str("# no configuration beat the defaults\n");
    }
    toml_text.push_str(&router_toml(bs, &knobs)?);
    println!("\n{toml_text}");
    if let Some(p) = &a.out {
        std::fs::write(p, &toml_text).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(path) = &a.c.json {
        let history: Vec<_> = search
            .history()
            .into_iter()
            .map(|(p, s)| serde_json::json!({"knobs": desc(&search.space().knobs(&p)), "score": s}))
            .collect();
        let v = serde_json::json!({
            "bound": bound,
            "objective": objective,
            "space": search.space(),
            "defaults": {"score": base_score, "report": rows[0]},
            "recommended": {"score": best_score, "knobs": desc(&knobs), "report": rows[1]},
            "compare": rows[2..].iter().zip(&scores[2..]).map(|(r, s)| serde_json::json!({"label": r.label, "score": s, "report": r})).collect::<Vec<_>>(),
            "history": history,
            "toml": toml_text,
        });
        let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
