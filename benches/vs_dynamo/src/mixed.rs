//! The "mixed" section: query latency while the index ingests unpaced, kvroute's
//! shard owner at several ingest slice sizes (`kv::mixed`) next to Dynamo's two
//! concurrently readable indexers (`dy::mixed`), on the same streams and churn; plus
//! two kvroute floors: the query alone on the asking thread (`kv::direct`) and the
//! hand-off to an owner that does not ingest.
//!
//! Guarantees: runs alternate kvroute-first / Dynamo-first; every printed figure is
//! the median over runs; the threads of every run are pinned to the same two CPUs
//! (`cpu::pair`), so both sides see one ingesting core and one asking core.

use crate::streams::{self, Stream};
use crate::{dy, kv, pct, Args, Figures};

/// kvroute rows: the hand-off floor (owner not ingesting), then one per slice.
fn kv_rows(a: &Args) -> Vec<(String, Option<usize>)> {
    let mut v = vec![
        (DIRECT.to_string(), None),
        ("kvroute idle owner".to_string(), None),
    ];
    v.extend(
        a.slices
            .iter()
            .map(|&s| (format!("kvroute slice {s}"), Some(s))),
    );
    v
}

/// The row of `kv::direct` (no owner, no ingest: the query alone).
const DIRECT: &str = "kvroute no owner, no ingest";

const DY: [dy::Kind; 2] = [dy::Kind::Positional, dy::Kind::Concurrent];

/// Runs and prints the section for the streams of `a.workers[0]` workers.
pub fn section(a: &Args, all: &[Stream]) {
    let cpus = crate::cpu::pair();
    let mut m = Figures::default();
    let mixed: Vec<&Stream> = all.iter().filter(|s| s.workers == a.workers[0]).collect();
    // Churn of fresh one-holder sequences, the same for every index.
    let mut seed = 0x006d_6978_6564_u64;
    let churn: Vec<(u32, Vec<u64>)> = (0..4096u32)
        .map(|i| (i % a.workers[0], streams::fresh_seq(&mut seed, 64)))
        .collect();
    for run in 0..a.runs {
        for s in &mixed {
            let mut order: Vec<Option<dy::Kind>> = vec![None];
            order.extend(DY.iter().copied().map(Some));
            if run % 2 == 1 {
                order.rotate_left(1);
            }
            for who in order {
                let res = match who {
                    None => kv_rows(a)
                        .into_iter()
                        .map(|(n, slice)| {
                            let r = if n == DIRECT {
                                kv::direct(s, a.mixed_secs, a.gap_us, cpus)
                            } else {
                                kv::mixed(s, &churn, slice, a.mixed_secs, a.gap_us, cpus)
                            };
                            (n, r)
                        })
                        .collect(),
                    Some(k) => vec![(
                        k.name().to_string(),
                        dy::mixed(k, s, &churn, a.mixed_secs, a.gap_us, cpus),
                    )],
                };
                for (n, mut r) in res {
                    let k = format!("{}|{n}", s.name);
                    let (all, clean) = (&mut r.lat.all, &mut r.lat.clean);
                    m.push(format!("{k}|p50"), pct(all, 0.5));
                    m.push(format!("{k}|p99"), pct(all, 0.99));
                    m.push(format!("{k}|c50"), pct(clean, 0.5));
                    m.push(format!("{k}|c99"), pct(clean, 0.99));
                    m.push(format!("{k}|c999"), pct(clean, 0.999));
                    m.push(format!("{k}|ev"), r.events_per_s);
                    m.push(format!("{k}|n"), all.len() as f64);
                    m.push(
                        format!("{k}|dist"),
                        100.0 * (all.len() - clean.len()) as f64 / all.len().max(1) as f64,
                    );
                    m.push(format!("{k}|starved"), r.starved as f64);
                }
            }
        }
    }
    println!(
        "\n## Query while ingesting unpaced (owner/writer thread on CPU {}, asker on CPU {}, both spinning; a query every {} µs), medians of {} runs",
        cpus.map_or("-".to_string(), |c| c.0.to_string()),
        cpus.map_or("-".to_string(), |c| c.1.to_string()),
        a.gap_us,
        a.runs
    );
    if cpus.is_none() {
        println!("  (fewer than two CPUs allowed: threads are not pinned)");
    }
    println!(
        "  (p50 / p99 / p99.9: the undisturbed queries, during which neither thread waited on a run queue \
         (schedstat); \"all\": every query; disturb: share of queries the OS preempted)"
    );
    let mut pp = crate::cpu::ping_pong(cpus, 20_000);
    println!(
        "  cross-CPU round trip of one cache line (the floor of any hand-off): p50 {:.0} ns, p99 {:.0} ns ({} of {} undisturbed)",
        pct(&mut pp.clean, 0.5),
        pct(&mut pp.clean, 0.99),
        pp.clean.len(),
        pp.all.len()
    );
    let mut names: Vec<String> = kv_rows(a).into_iter().map(|r| r.0).collect();
    names.extend(DY.iter().map(|k| k.name().to_string()));
    for s in &mixed {
        println!("\n{}", s.name);
        println!(
            "  {:<30} {:>17} {:>8} {:>8} {:>9} {:>11} {:>8} {:>7} {:>7}",
            "index",
            "all: p50 / p99",
            "p50",
            "p99",
            "p99.9",
            "M events/s",
            "queries",
            "disturb",
            "starved"
        );
        let med = |n: &str, f: &str| m.median(&format!("{}|{n}|{f}", s.name));
        for n in &names {
            println!(
                "  {:<30} {:>17} {:>8.0} {:>8.0} {:>9.0} {:>11.2} {:>8.0} {:>6.1}% {:>7.0}",
                n,
                format!("{:.0} / {:.0}", med(n, "p50"), med(n, "p99")),
                med(n, "c50"),
                med(n, "c99"),
                med(n, "c999"),
                med(n, "ev") / 1e6,
                med(n, "n"),
                med(n, "dist"),
                med(n, "starved")
            );
        }
        let best_p99 = DY
            .iter()
            .map(|k| med(k.name(), "c99"))
            .fold(f64::INFINITY, f64::min);
        let base_ev = a
            .slices
            .iter()
            .map(|&sl| med(&format!("kvroute slice {sl}"), "ev"))
            .fold(0.0, f64::max);
        for &sl in &a.slices {
            let n = format!("kvroute slice {sl}");
            println!(
                "  slice {sl:>5}: p99 / Dynamo's best p99 {:.2}; ingest {:.2}x of the fastest slice; p99 <= 2 µs: {}",
                med(&n, "c99") / best_p99,
                med(&n, "ev") / base_ev,
                if med(&n, "c99") <= 2000.0 { "yes" } else { "no" }
            );
        }
        match a
            .slices
            .iter()
            .filter(|&&sl| med(&format!("kvroute slice {sl}"), "c99") <= 2000.0)
            .max()
        {
            Some(sl) => println!("  largest slice meeting p99 <= 2 µs: {sl}"),
            None => println!("  no slice tried meets p99 <= 2 µs"),
        }
    }
}
