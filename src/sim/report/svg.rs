//! A self-contained SVG chart comparing runs: TTFT p50 / p90 / p99 bars (left) and hit
//! rate (right), one colour per run. Each run's bars sit in one
//! `<g class="series" data-series="NAME">` so tools and tests can find them.

use super::Report;
use std::fmt::Write;

const W: f64 = 860.0;
const H: f64 = 380.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 300.0;
const COLORS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A "nice" axis maximum ≥ `v` (1, 2 or 5 × a power of ten).
pub(super) fn nice_max(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&m| m >= v)
        .unwrap_or(10.0 * p)
}

/// Renders the comparison chart of `reports` as an SVG document.
pub fn svg_chart(reports: &[Report]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    // Left panel: TTFT in ms, groups p50/p90/p99. Right panel: hit rate in %.
    let (l0, l1) = (60.0, 540.0);
    let (r0, r1) = (620.0, 840.0);
    let ttft_max = nice_max(
        reports
            .iter()
            .map(|r| r.ttft_us.p99.max(r.ttft_us.p90).max(r.ttft_us.p50) / 1000.0)
            .fold(0.0, f64::max),
    );
    let y = |v: f64, max: f64| BOTTOM - (v / max).clamp(0.0, 1.0) * (BOTTOM - TOP);
    for (x0, x1, title, max, unit) in [
        (l0, l1, "Time to first token", ttft_max, "ms"),
        (r0, r1, "Hit rate", 100.0, "%"),
    ] {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="30" text-anchor="middle" font-size="14">{title} ({unit})</text>"#,
            (x0 + x1) / 2.0
        );
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{BOTTOM}" x2="{x1}" y2="{BOTTOM}" stroke="#333"/>"##
        );
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{TOP}" x2="{x0}" y2="{BOTTOM}" stroke="#333"/>"##
        );
        for i in 0..=4 {
            let v = max * i as f64 / 4.0;
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                x0 - 4.0,
                y(v, max) + 4.0,
                fmt_tick(v)
            );
        }
    }
    let groups = ["p50", "p90", "p99"];
    let gw = (l1 - l0) / groups.len() as f64;
    for (g, name) in groups.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{name}</text>"#,
            l0 + gw * (g as f64 + 0.5),
            BOTTOM + 16.0
        );
    }
    let n = reports.len().max(1) as f64;
    let bw = gw * 0.8 / n;
    let hw = (r1 - r0) * 0.8 / n;
    for (i, r) in reports.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let name = esc(r.name());
        let _ = writeln!(
            s,
            r#"<g class="series" data-series="{name}" fill="{color}">"#
        );
        for (g, v) in [r.ttft_us.p50, r.ttft_us.p90, r.ttft_us.p99]
            .iter()
            .enumerate()
        {
            let x = l0 + gw * g as f64 + gw * 0.1 + bw * i as f64;
            let v = v / 1000.0;
            let top = y(v, ttft_max);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{bw:.1}" height="{:.1}"><title>{name} {}: {v:.1} ms</title></rect>"#,
                BOTTOM - top,
                groups[g]
            );
        }
        let x = r0 + (r1 - r0) * 0.1 + hw * i as f64;
        let pct = r.hit_rate * 100.0;
        let top = y(pct, 100.0);
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{top:.1}" width="{hw:.1}" height="{:.1}"><title>{name}: {pct:.1}%</title></rect>"#,
            BOTTOM - top
        );
        // Legend entry.
        let lx = l0 + 150.0 * (i % 5) as f64;
        let ly = BOTTOM + 40.0 + 18.0 * (i / 5) as f64;
        let _ = writeln!(
            s,
            r##"<rect x="{lx}" y="{}" width="12" height="12"/><text x="{}" y="{}" fill="#222">{name}</text>"##,
            ly - 10.0,
            lx + 16.0,
            ly
        );
        let _ = writeln!(s, "</g>");
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_tick(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
