//! A self-contained SVG chart comparing runs: TTFT p50 / p90 / p99 bars on a log axis
//! (left) and hit rate with the workload's bound drawn as a dashed line (right), one
//! colour per run, every bar labelled with its value.
//!
//! Made to be read: TTFT spans decades between modes, so its axis is logarithmic
//! (ticks at 1-2-5 steps when the range is narrow, decades otherwise); each bar prints
//! its value (inside the bar when it fits, above it otherwise); the legend flows over
//! as many rows as the labels need, wrapping a long `--kv-variant` label at its commas,
//! and the drawing grows to hold it, so no label is clipped. Each run's bars sit in one
//! `<g class="series" data-series="NAME">`, value labels carry `class="value"`, legend
//! lines `class="legend"` and the bound line `class="bound"`, so tools and tests can
//! find them.

use super::Report;
use std::fmt::Write;

const W: f64 = 960.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 300.0;
const MARGIN: f64 = 20.0;
/// Generous average advance of a 12 px sans-serif character, for layout.
const CHAR_W: f64 = 7.0;
const LINE_H: f64 = 15.0;
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

/// A log axis over `[lo, hi]` (powers of ten around the positive values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct LogAxis {
    pub lo: f64,
    pub hi: f64,
}

impl LogAxis {
    /// The decades around the positive finite `values` (1..10 when there are none).
    pub fn around(values: impl Iterator<Item = f64>) -> LogAxis {
        let pos: Vec<f64> = values.filter(|v| v.is_finite() && *v > 0.0).collect();
        let (min, max) = pos
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(a, b), &v| (a.min(v), b.max(v)));
        if pos.is_empty() {
            return LogAxis { lo: 1.0, hi: 10.0 };
        }
        let lo = 10f64.powf(min.log10().floor());
        let mut hi = 10f64.powf(max.log10().ceil());
        if hi <= lo {
            hi = lo * 10.0;
        }
        LogAxis { lo, hi }
    }

    /// Fraction of the axis height of `v` (0 at or below `lo`).
    pub fn frac(&self, v: f64) -> f64 {
        if !(v.is_finite() && v > self.lo) {
            return 0.0;
        }
        ((v / self.lo).log10() / (self.hi / self.lo).log10()).clamp(0.0, 1.0)
    }

    /// Tick values: every decade, plus 2 and 5 multiples over at most two decades.
    pub fn ticks(&self) -> Vec<f64> {
        let decades = (self.hi / self.lo).log10().round() as i32;
        let steps: &[f64] = if decades <= 2 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let mut out = Vec::new();
        for d in 0..=decades {
            let base = self.lo * 10f64.powi(d);
            for m in steps {
                let v = base * m;
                if v <= self.hi * 1.000_001 {
                    out.push(v);
                }
            }
        }
        out
    }
}

/// A duration in ms, 3 significant digits: "0.52 ms", "531 ms", "11.4 s".
pub(super) fn fmt_ms(ms: f64) -> String {
    let sig = |v: f64| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else if v >= 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    };
    if ms >= 1000.0 {
        format!("{} s", sig(ms / 1000.0))
    } else {
        format!("{} ms", sig(ms))
    }
}

/// An axis tick in ms without needless digits: "100 ms", "1 s", "2.5 s".
pub(super) fn fmt_tick_ms(ms: f64) -> String {
    let trim = |v: f64| {
        let t = format!("{v:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if ms >= 1000.0 {
        format!("{} s", trim(ms / 1000.0))
    } else {
        format!("{} ms", trim(ms))
    }
}

/// A linear hit-rate axis (percent) holding `top`: its maximum and tick step (at most
/// 5 steps; 100 at most).
pub(super) fn pct_axis(top: f64) -> (f64, f64) {
    let top = if top.is_finite() {
        top.clamp(1.0, 100.0)
    } else {
        100.0
    };
    for step in [1.0, 2.0, 5.0, 10.0, 20.0, 25.0] {
        if top / step <= 5.0 {
            return (((top / step).ceil() * step).min(100.0), step);
        }
    }
    (100.0, 25.0)
}

/// Splits `label` into lines of at most `max` characters, after commas where it can
/// (a hard split when one piece is longer).
pub(super) fn wrap(label: &str, max: usize) -> Vec<String> {
    let max = max.max(4);
    let mut lines = Vec::new();
    let mut cur = String::new();
    let mut pieces: Vec<String> = Vec::new();
    let mut rest = label;
    while let Some(i) = rest.find(',') {
        pieces.push(rest[..=i].to_string());
        rest = &rest[i + 1..];
    }
    pieces.push(rest.to_string());
    for p in pieces {
        if cur.chars().count() + p.chars().count() > max && !cur.is_empty() {
            lines.push(std::mem::take(&mut cur));
        }
        cur.push_str(&p);
        while cur.chars().count() > max {
            let head: String = cur.chars().take(max).collect();
            let tail: String = cur.chars().skip(max).collect();
            lines.push(head);
            cur = tail;
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

/// One legend entry placed: its top-left corner and text lines.
struct Placed {
    x: f64,
    y: f64,
    lines: Vec<String>,
}

/// Flows the legend entries over rows within the drawing's width; the placed entries
/// and the legend's total height.
fn legend_layout(names: &[String], top: f64) -> (Vec<Placed>, f64) {
    let avail = W - 2.0 * MARGIN;
    let max_chars = ((avail - 16.0) / CHAR_W).floor() as usize;
    let (mut x, mut y, mut row_h) = (MARGIN, top, 0.0f64);
    let mut out = Vec::new();
    for n in names {
        let lines = wrap(n, max_chars);
        let chars = lines.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        let w = 16.0 + CHAR_W * chars as f64 + 18.0;
        let h = LINE_H * lines.len() as f64;
        if x > MARGIN && x + w - 18.0 > W - MARGIN {
            x = MARGIN;
            y += row_h + 4.0;
            row_h = 0.0;
        }
        out.push(Placed { x, y, lines });
        x += w;
        row_h = row_h.max(h);
    }
    (out, y + row_h - top)
}

/// Renders the comparison chart of `reports` (no bound line).
pub fn svg_chart(reports: &[Report]) -> String {
    svg_chart_with_bound(reports, None)
}

/// Renders the comparison chart of `reports`; `bound` (a fraction, e.g. the workload's
/// [`super::super::hit_rate_bound`] ratio) is drawn as a dashed line on the hit rates.
pub fn svg_chart_with_bound(reports: &[Report], bound: Option<f64>) -> String {
    let names: Vec<String> = reports.iter().map(|r| r.name().to_string()).collect();
    let (legend, legend_h) = legend_layout(&names, BOTTOM + 36.0);
    let h = (BOTTOM + 36.0 + legend_h + MARGIN).ceil();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let (l0, l1) = (80.0, 640.0);
    let (r0, r1) = (710.0, 880.0);
    // Hit-rate axis zoomed to the largest of the hit rates and the bound (+15%).
    let top_pct = reports
        .iter()
        .map(|r| r.hit_rate * 100.0)
        .chain(bound.map(|b| b * 100.0))
        .fold(0.0, f64::max);
    let (pct_max, pct_step) = pct_axis(top_pct * 1.15);
    let axis = LogAxis::around(reports.iter().flat_map(|r| {
        [r.ttft_us.p50, r.ttft_us.p90, r.ttft_us.p99]
            .into_iter()
            .map(|v| v / 1000.0)
    }));
    let span = BOTTOM - TOP;
    let ylog = |v: f64| BOTTOM - axis.frac(v) * span;
    let ylin = |pct: f64| BOTTOM - (pct / pct_max).clamp(0.0, 1.0) * span;
    for (x0, x1, title) in [
        (l0, l1, "Time to first token (log scale)"),
        (r0, r1, "Hit rate (%)"),
    ] {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="30" text-anchor="middle" font-size="14">{title}</text>"#,
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
    }
    for v in axis.ticks() {
        let y = ylog(v);
        let _ = writeln!(
            s,
            r##"<line x1="{l0}" y1="{y:.1}" x2="{l1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            l0 - 4.0,
            y + 4.0,
            fmt_tick_ms(v)
        );
    }
    let mut v = 0.0;
    while v <= pct_max + 1e-9 {
        let _ = writeln!(
            s,
            r##"<line x1="{r0}" y1="{y:.1}" x2="{r1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            r0 - 4.0,
            ylin(v) + 4.0,
            y = ylin(v)
        );
        v += pct_step;
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
            let top = ylog(v);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{bw:.1}" height="{:.1}"><title>{name} {}: {v:.1} ms</title></rect>"#,
                BOTTOM - top,
                groups[g]
            );
            value_label(&mut s, x + bw / 2.0, top, BOTTOM - top, &fmt_ms(v), color);
        }
        let x = r0 + (r1 - r0) * 0.1 + hw * i as f64;
        let pct = r.hit_rate * 100.0;
        let top = ylin(pct);
        let _ = writeln!(
            s,
            r#"<rect x="{x:.1}" y="{top:.1}" width="{hw:.1}" height="{:.1}"><title>{name}: {pct:.1}%</title></rect>"#,
            BOTTOM - top
        );
        value_label(
            &mut s,
            x + hw / 2.0,
            top,
            BOTTOM - top,
            &format!("{pct:.1}"),
            color,
        );
        if let Some(p) = legend.get(i) {
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="12" height="12"/>"#,
                p.x,
                p.y + 2.0
            );
            for (k, line) in p.lines.iter().enumerate() {
                let _ = writeln!(
                    s,
                    r##"<text class="legend" x="{:.1}" y="{:.1}" fill="#222">{}</text>"##,
                    p.x + 16.0,
                    p.y + 12.0 + LINE_H * k as f64,
                    esc(line)
                );
            }
        }
        let _ = writeln!(s, "</g>");
    }
    if let Some(b) = bound.filter(|b| b.is_finite() && *b >= 0.0) {
        let pct = b * 100.0;
        let y = ylin(pct);
        let _ = writeln!(
            s,
            r##"<g class="bound"><line x1="{r0}" y1="{y:.1}" x2="{r1}" y2="{y:.1}" stroke="#222" stroke-width="1.5" stroke-dasharray="6 3"/><text x="{}" y="{:.1}" font-size="11" fill="#222">bound</text><text x="{}" y="{:.1}" font-size="11" fill="#222">{pct:.1}%</text></g>"##,
            r1 + 4.0,
            y - 2.0,
            r1 + 4.0,
            y + 11.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A bar's value, rotated along the bar: inside it (white) when the bar is tall enough,
/// just above it (dark) otherwise.
fn value_label(s: &mut String, cx: f64, top: f64, height: f64, text: &str, bar: &str) {
    let len = 6.0 * text.chars().count() as f64 + 6.0;
    // Outside labels get a white halo, so grid and bound lines do not cross them.
    let (y, anchor, paint) = if height >= len {
        // Dark text on the light bar colours, white on the others.
        let light = ["#edc948", "#76b7b2"].contains(&bar);
        (
            top + 4.0,
            "end",
            if light {
                r##"fill="#222""##
            } else {
                r#"fill="white""#
            },
        )
    } else {
        (
            top - 3.0,
            "start",
            r##"fill="#222" stroke="white" stroke-width="3" paint-order="stroke""##,
        )
    };
    let _ = writeln!(
        s,
        r#"<text class="value" x="{cx:.1}" y="{y:.1}" font-size="10" {paint} text-anchor="{anchor}" dominant-baseline="central" transform="rotate(-90 {cx:.1} {y:.1})">{}</text>"#,
        esc(text)
    );
}
