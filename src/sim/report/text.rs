//! Text tables of reports: one row per run (mode), fixed-width columns, times in ms;
//! and, for mixed CPU/GPU fleets, one row per run and device class.

use super::Report;
use std::fmt::Write;

/// Renders `reports` as an aligned text table with a header row.
pub fn table(reports: &[Report]) -> String {
    let header = [
        "mode", "reqs", "done", "err", "hit%", "ttft50", "ttft90", "ttft99", "e2e50", "e2e99",
        "req/s", "tok/s", "imbal", "dec50us", "dec99us", "ev/s",
    ];
    let ms = |us: f64| format!("{:.1}", us / 1000.0);
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let (d50, d99) = match &r.decision_us {
                Some(d) => (format!("{:.1}", d.p50), format!("{:.1}", d.p99)),
                None => ("-".into(), "-".into()),
            };
            vec![
                r.name().to_string(),
                r.requests.to_string(),
                r.finished.to_string(),
                r.errors.to_string(),
                format!("{:.1}", r.hit_rate * 100.0),
                ms(r.ttft_us.p50),
                ms(r.ttft_us.p90),
                ms(r.ttft_us.p99),
                ms(r.e2e_us.p50),
                ms(r.e2e_us.p99),
                format!("{:.2}", r.throughput_rps),
                format!("{:.0}", r.output_tok_per_s),
                format!("{:.2}", r.imbalance),
                d50,
                d99,
                format!("{:.0}", r.events_per_s),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut first = true;
        for (i, c) in cells.enumerate() {
            if !first {
                out.push_str("  ");
            }
            first = false;
            // Names left-aligned, numbers right-aligned.
            let _ = if i == 0 {
                write!(out, "{c:<w$}", w = widths[i])
            } else {
                write!(out, "{c:>w$}", w = widths[i])
            };
        }
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// Per device class jobs and imbalance of each report (mixed CPU/GPU fleets); empty
/// when no report has per-class figures.
pub fn device_table(reports: &[Report]) -> String {
    if reports.iter().all(|r| r.imbalance_by_device.is_empty()) {
        return String::new();
    }
    let name_w = reports
        .iter()
        .map(|r| r.name().chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = String::from("per device class (jobs per worker):\n");
    let _ = writeln!(
        out,
        "{:<name_w$}  class  workers   jobs   mean    max  imbal",
        "mode"
    );
    for r in reports {
        for d in &r.imbalance_by_device {
            let class = match d.device {
                crate::types::DeviceClass::Gpu => "gpu",
                crate::types::DeviceClass::Cpu => "cpu",
            };
            let _ = writeln!(
                out,
                "{:<name_w$}  {class:<5}  {:>7}  {:>5}  {:>5.1}  {:>5}  {:>5.2}",
                r.name(),
                d.workers,
                d.jobs,
                d.mean_jobs,
                d.max_jobs,
                d.imbalance
            );
        }
    }
    out
}
