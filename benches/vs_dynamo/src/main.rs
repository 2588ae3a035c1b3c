//! Side by side: kvroute's block index and selection against NVIDIA Dynamo's
//! `dynamo-kv-router` 1.6.1, in one process, on byte-identical inputs.
//!
//! For each stream (the Mooncake conversation trace and a synthetic one-holder load,
//! at 8 and 1,024 workers): ingest (block events/s), query p50/p99 (kvroute with 1 and
//! 2 shards, every Dynamo indexer), memory per (block, worker) entry; then query
//! latency while ingesting unpaced (`mixed`), and selection at 2 to 10,000 workers
//! (`sel`). Runs alternate kvroute-first and Dynamo-first; every figure printed is the
//! median over runs, with the ratio kvroute / Dynamo (below 1 is kvroute ahead for
//! times and bytes, above 1 for rates).
//! Not part of the root crate's build: run it from this directory (README.md).

mod alloc;
mod cpu;
mod dy;
mod kv;
mod mixed;
mod sel;
mod streams;

use std::collections::BTreeMap;
use streams::Stream;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

struct Args {
    trace: String,
    runs: usize,
    entries: usize,
    workers: Vec<u32>,
    queries: usize,
    passes: usize,
    mixed_secs: f64,
    gap_us: u64,
    only: Option<String>,
    prof: Option<(String, u32)>,
    /// Ingest slices (hashes) of kvroute's shard owner in the mixed runs.
    slices: Vec<usize>,
    /// Fleet sizes of the selection runs.
    sel_workers: Vec<usize>,
    /// Timed samples per side, fleet size and run of the selection runs.
    sel_samples: usize,
    /// Requests (figure sets) per fleet the selection timing rotates over (1..=4).
    sel_draws: usize,
}

fn list<T: std::str::FromStr>(k: &str, v: String) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    v.split(',')
        .map(|w| w.trim().parse().map_err(|e| format!("{k}: {e}")))
        .collect()
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        trace: format!(
            "{}/../../tests/data/mooncake_slice.jsonl",
            env!("CARGO_MANIFEST_DIR")
        ),
        runs: 5,
        entries: 1 << 20,
        workers: vec![8, 1024],
        queries: 2000,
        passes: 5,
        mixed_secs: 1.0,
        gap_us: 20,
        only: None,
        prof: None,
        slices: vec![1024, 128, 32, 16, 8],
        sel_workers: vec![2, 32, 1024, 2048, 10_000],
        sel_samples: 2000,
        sel_draws: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        let num = |s: String| s.parse::<f64>().map_err(|e| format!("{k}: {e}"));
        match k.as_str() {
            "--trace" => a.trace = v()?,
            "--runs" => a.runs = num(v()?)? as usize,
            "--entries" => a.entries = num(v()?)? as usize,
            "--queries" => a.queries = num(v()?)? as usize,
            "--passes" => a.passes = num(v()?)? as usize,
            "--mixed-secs" => a.mixed_secs = num(v()?)?,
            "--gap-us" => a.gap_us = num(v()?)? as u64,
            "--only" => a.only = Some(v()?),
            // `--prof STREAM SHARD_BITS`: kvroute's queries of one stream only, for
            // callgrind (`--toggle-collect='kvroute_vs_dynamo::prof_queries'`).
            "--prof" => {
                let name = v()?;
                let bits = num(v()?)? as u32;
                a.prof = Some((name, bits));
            }
            "--workers" => a.workers = list(&k, v()?)?,
            "--slices" => a.slices = list(&k, v()?)?,
            "--sel-workers" => a.sel_workers = list(&k, v()?)?,
            "--sel-samples" => a.sel_samples = num(v()?)? as usize,
            "--sel-draws" => a.sel_draws = num(v()?)? as usize,
            "-h" | "--help" => {
                println!(
                    "kvroute-vs-dynamo [--trace FILE] [--runs N] [--entries N] [--workers 8,1024] \
                     [--queries N] [--passes N] [--mixed-secs S] [--gap-us U] [--slices 1024,128,32,16,8] \
                     [--sel-workers 2,32,1024,2048,10000] [--sel-samples N] [--sel-draws 1..4] [--only query|mixed|memory|select]"
                );
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    a.runs = a.runs.max(1);
    a.sel_samples = a.sel_samples.max(1);
    if a.workers.is_empty() {
        return Err("--workers needs at least one count".into());
    }
    Ok(a)
}

/// Figures of one session: name → one value per run.
#[derive(Default)]
struct Figures(BTreeMap<String, Vec<f64>>);

impl Figures {
    fn push(&mut self, k: String, v: f64) {
        self.0.entry(k).or_default().push(v);
    }
    fn median(&self, k: &str) -> f64 {
        let mut v = self.0.get(k).cloned().unwrap_or_default();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }
}

fn pct(lat: &mut [u64], p: f64) -> f64 {
    if lat.is_empty() {
        return f64::NAN;
    }
    lat.sort_unstable();
    lat[((lat.len() - 1) as f64 * p).round() as usize] as f64
}

fn want(a: &Args, what: &str) -> bool {
    a.only.as_deref().is_none_or(|o| o == what)
}

/// One run of ingest + query over `s` for every index, in the order given.
fn run_stream(a: &Args, s: &Stream, kv_first: bool, f: &mut Figures) {
    let mut order = vec![
        None,
        Some(dy::Kind::Radix),
        Some(dy::Kind::Positional),
        Some(dy::Kind::Concurrent),
    ];
    if !kv_first {
        order.rotate_left(1);
    }
    for who in order {
        match who {
            None => {
                for bits in [0u32, 1] {
                    let name = format!("{}|kvroute {}sh", s.name, 1 << bits);
                    let t = std::time::Instant::now();
                    let idx = kv::build(s, bits);
                    f.push(
                        format!("{name}|ingest"),
                        s.hashes() as f64 / t.elapsed().as_secs_f64(),
                    );
                    let mut lat = kv::query_ns(&idx, &s.queries, a.passes);
                    f.push(format!("{name}|p50"), pct(&mut lat, 0.5));
                    f.push(format!("{name}|p99"), pct(&mut lat, 0.99));
                }
            }
            Some(k) => {
                let name = format!("{}|{}", s.name, k.name());
                let (b, secs) = dy::build(k, dy::events(s));
                f.push(format!("{name}|ingest"), s.hashes() as f64 / secs);
                let mut lat = dy::query_ns(&b, &s.queries, a.passes);
                f.push(format!("{name}|p50"), pct(&mut lat, 0.5));
                f.push(format!("{name}|p99"), pct(&mut lat, 0.99));
            }
        }
    }
}

/// Bytes per (block, worker) entry of each index built from `s`, and the number of
/// queries whose per-worker overlaps differ between kvroute and Dynamo's RadixTree.
fn memory_and_check(s: &Stream) -> (u64, Vec<(String, f64)>, usize) {
    let mut out = Vec::new();
    let before = alloc::live();
    let idx = kv::build(s, 0);
    let entries = kv::entries(&idx);
    out.push((
        "kvroute".to_string(),
        (alloc::live() - before) as f64 / entries as f64,
    ));
    let mut radix = None;
    for k in dy::Kind::ALL {
        // Counted from before the events are built: the build consumes (frees) them.
        let before = alloc::live();
        let evs = dy::events(s);
        let (b, _) = dy::build(k, evs);
        out.push((
            k.name().to_string(),
            (alloc::live() - before) as f64 / entries as f64,
        ));
        if k == dy::Kind::Radix {
            radix = Some(b);
        }
    }
    let mut differ = 0;
    if let Some(r) = &radix {
        for q in s.queries.iter().take(500) {
            if kv::overlaps(&idx, q) != dy::overlaps(r, q) {
                differ += 1;
            }
        }
    }
    (entries, out, differ)
}

/// kvroute's queries alone, for instruction counts (`--prof`).
#[inline(never)]
fn prof_queries(idx: &kvroute::index::ShardedIndex, queries: &[Vec<u64>], passes: usize) -> usize {
    let mut out = kvroute::index::MergeResult::new();
    let mut n = 0;
    for _ in 0..passes {
        for q in queries {
            idx.query(q, |_| false, &mut out);
            n += std::hint::black_box(out.workers().len()).min(1);
        }
    }
    n
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let reqs = match streams::read_trace(&a.trace) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut all: Vec<Stream> = Vec::new();
    for &w in &a.workers {
        all.push(streams::trace(&reqs, w, a.queries));
    }
    for &w in &a.workers {
        all.push(streams::one_holder(w, a.entries, a.queries));
    }
    if let Some((name, bits)) = &a.prof {
        let Some(s) = all.iter().find(|s| &s.name == name) else {
            eprintln!("no stream {name}");
            std::process::exit(2);
        };
        let idx = kv::build(s, *bits);
        println!(
            "{} queries: {}",
            s.name,
            prof_queries(&idx, &s.queries, a.passes)
        );
        return;
    }
    println!(
        "kvroute vs dynamo-kv-router 1.6.1: {} trace requests ({}), {} one-holder entries, {} runs (alternating), medians",
        reqs.len(),
        a.trace,
        a.entries,
        a.runs
    );
    for s in &all {
        println!(
            "  stream {}: {} sequences, {} block events, {} queries",
            s.name,
            s.seqs.len(),
            s.hashes(),
            s.queries.len()
        );
    }

    if want(&a, "memory") {
        println!("\n## Memory per (block, worker) entry (counting allocator) and answer check");
        for s in &all {
            let (entries, mem, differ) = memory_and_check(s);
            let kvb = mem[0].1;
            let best = mem[1..].iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
            let row: Vec<String> = mem.iter().map(|(n, b)| format!("{n} {b:.1} B")).collect();
            println!(
                "{:<18} {entries} entries: {}; kvroute/best {:.2}; overlaps differing from RadixTree: {differ} of {}",
                s.name,
                row.join(", "),
                kvb / best,
                s.queries.len().min(500)
            );
        }
    }

    let mut f = Figures::default();
    if want(&a, "query") {
        for run in 0..a.runs {
            for s in &all {
                run_stream(&a, s, run % 2 == 0, &mut f);
            }
        }
        println!(
            "\n## Ingest (M block events/s) and query (ns), medians of {} runs",
            a.runs
        );
        for s in &all {
            println!("\n{}", s.name);
            println!(
                "  {:<30} {:>9} {:>8} {:>8}",
                "index", "ingest", "p50", "p99"
            );
            let mut names = vec!["kvroute 1sh".to_string(), "kvroute 2sh".to_string()];
            names.extend(dy::Kind::ALL.iter().map(|k| k.name().to_string()));
            for n in &names {
                let k = format!("{}|{n}", s.name);
                println!(
                    "  {:<30} {:>9.2} {:>8.0} {:>8.0}",
                    n,
                    f.median(&format!("{k}|ingest")) / 1e6,
                    f.median(&format!("{k}|p50")),
                    f.median(&format!("{k}|p99"))
                );
            }
            let best = |m: &str, max: bool| {
                dy::Kind::ALL
                    .iter()
                    .map(|k| f.median(&format!("{}|{}|{m}", s.name, k.name())))
                    .fold(if max { 0.0 } else { f64::INFINITY }, |x, y| {
                        if max {
                            x.max(y)
                        } else {
                            x.min(y)
                        }
                    })
            };
            for sh in ["1sh", "2sh"] {
                let k = format!("{}|kvroute {sh}", s.name);
                println!(
                    "  ratio kvroute {sh} / Dynamo's best: ingest {:.2}x, p50 {:.2}, p99 {:.2}",
                    f.median(&format!("{k}|ingest")) / best("ingest", true),
                    f.median(&format!("{k}|p50")) / best("p50", false),
                    f.median(&format!("{k}|p99")) / best("p99", false)
                );
            }
            println!(
                "  kvroute 2 shards / 1 shard: p50 {:.2}, p99 {:.2}",
                f.median(&format!("{}|kvroute 2sh|p50", s.name))
                    / f.median(&format!("{}|kvroute 1sh|p50", s.name)),
                f.median(&format!("{}|kvroute 2sh|p99", s.name))
                    / f.median(&format!("{}|kvroute 1sh|p99", s.name))
            );
        }
    }

    if want(&a, "mixed") {
        mixed::section(&a, &all);
    }

    if want(&a, "select") {
        sel::section(&a);
    }
}
