//! The live status page (`GET /ui`) and its data (`GET /v1/status`).
//!
//! The state it reads is `crate::status` (the cores' counters, the pure history /
//! window / warning model, the cached document). This module owns the once-a-second
//! sampler (a timer task on core 0), and the status document, built at most once per [`REFRESH_MS`] whatever the number of pages
//!   polling it (every caller inside the interval gets the same cached bytes; while one
//!   core builds a fresh document, on glommio's blocking-thread pool, the others serve
//!   the previous one).
//!
//! Memory is bounded: a 600-point history, 31 window snapshots (`model::Window`: the
//! last minute, sliding) of at most `max_workers` counters, 50 recorded decisions of at most 16 candidates each, and one cached
//! document (whose size is linear in the registered workers).

use crate::service::runtime::core::Core;
use crate::service::runtime::shared::Shared;
use crate::status::model::{self, DecisionRecord, Point, SlotCount, Totals, Window, REFRESH_MS};
use bytes::Bytes;
use serde::Serialize;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The page itself: HTML with inline CSS and JavaScript, no external resource.
pub const INDEX_HTML: &str = include_str!("../ui/index.html");
/// Answer to `GET /ui` without a valid token: a form asking for one.
pub const LOGIN_HTML: &str = include_str!("../ui/login.html");

fn totals(sh: &Shared) -> Totals {
    let c = &sh.status.counters;
    let m = &sh.metrics;
    Totals {
        decisions: c.decisions.load(Ordering::Relaxed),
        errors: c.route_errors.load(Ordering::Relaxed)
            + m.protocol_errors_total.load(Ordering::Relaxed),
        events: m.events_total.load(Ordering::Relaxed),
        request_blocks: m.request_blocks.get(),
        overlap_blocks: m.overlap_blocks.get(),
        latency: c.latency_counts(),
    }
}

fn gen_of(sh: &Shared, slot: crate::types::WorkerSlot) -> u64 {
    sh.cells(slot).map_or(0, |c| c.gen.load(Ordering::Acquire))
}

/// Takes one history point (and a window snapshot when due).
pub fn sample(sh: &Shared) {
    let now = sh.now_ms();
    let t = totals(sh);
    let decisions = t.decisions;
    let Ok(mut s) = sh.status.sampler.lock() else {
        return;
    };
    s.history.sample(now, t);
    if s.window.due(now) {
        let reg = sh.registry.load();
        let top = reg.iter().map(|e| e.slot as usize + 1).max().unwrap_or(0);
        let slots = (0..top)
            .map(|w| w as crate::types::WorkerSlot)
            .map(|w| sh.status.counters.slot_count(w, gen_of(sh, w)))
            .collect();
        s.window.snapshot(now, decisions, slots);
    }
}

/// The sampler: one point a second until shutdown (a task of core 0).
pub async fn sample_loop(core: Rc<Core>) {
    while !core.shared.stopping.load(Ordering::Relaxed) {
        sample(&core.shared);
        glommio::timer::sleep(Duration::from_millis(REFRESH_MS)).await;
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The history as columns (half the bytes of an array of objects).
#[derive(Serialize, Default)]
struct Series {
    t_s: Vec<f64>,
    decisions_per_s: Vec<f64>,
    hit_rate: Vec<Option<f64>>,
    p50_us: Vec<Option<f64>>,
    p99_us: Vec<Option<f64>>,
    events_per_s: Vec<f64>,
    errors_per_s: Vec<f64>,
}

impl Series {
    fn push(&mut self, p: &Point) {
        self.t_s.push(round3(p.t_s));
        self.decisions_per_s.push(round3(p.decisions_per_s));
        self.hit_rate.push(p.hit_rate.map(round3));
        self.p50_us.push(p.p50_us.map(round3));
        self.p99_us.push(p.p99_us.map(round3));
        self.events_per_s.push(round3(p.events_per_s));
        self.errors_per_s.push(round3(p.errors_per_s));
    }
}

#[derive(Serialize)]
struct Tiers {
    device: u64,
    host: u64,
    disk: u64,
}

#[derive(Serialize)]
struct WorkerRow {
    #[serde(flatten)]
    status: crate::engine::WorkerStatus,
    cached: Tiers,
    routes_1m: u64,
    share_1m: Option<f64>,
    hit_rate_1m: Option<f64>,
    last_event_age_s: Option<f64>,
    warnings: Vec<&'static str>,
}

#[derive(Serialize, Default)]
struct Summary {
    workers: usize,
    live: usize,
    suspect: usize,
    down: usize,
    with_warnings: usize,
    active_requests: u64,
    cached_blocks: u64,
    decisions_total: u64,
    errors_total: u64,
    events_total: u64,
    hit_rate_total: Option<f64>,
}

#[derive(Serialize)]
struct StatusDoc {
    version: &'static str,
    uptime_s: f64,
    refresh_ms: u64,
    window_s: f64,
    summary: Summary,
    workers: Vec<WorkerRow>,
    history: Series,
    decisions: Vec<DecisionRecord>,
    settings: serde_json::Value,
}

/// Effective settings with the shared secret redacted.
fn settings_json(sh: &Shared) -> serde_json::Value {
    let mut v = serde_json::to_value(&sh.settings).unwrap_or(serde_json::Value::Null);
    if let Some(t) = v.get_mut("auth_token") {
        if !t.is_null() {
            *t = serde_json::Value::String("(set, redacted)".into());
        }
    }
    v
}

fn build(sh: &Shared, now_ms: u64) -> Bytes {
    use crate::engine::WorkerState;
    let reg = sh.registry.load();
    let now_us = now_ms * 1000;
    let t = totals(sh);
    let c = &sh.status.counters;
    let (window, series, window_s) = match sh.status.sampler.lock() {
        Ok(s) => {
            let mut series = Series::default();
            s.history.points.iter().for_each(|p| series.push(p));
            (s.window.clone(), series, s.window.span_s(now_ms))
        }
        Err(_) => (Window::default(), Series::default(), 0.0),
    };
    let mut sum = Summary {
        decisions_total: t.decisions,
        errors_total: t.errors,
        events_total: t.events,
        hit_rate_total: (t.request_blocks > 0)
            .then(|| round3(t.overlap_blocks as f64 / t.request_blocks as f64)),
        ..Summary::default()
    };
    let workers: Vec<WorkerRow> = reg
        .iter()
        .map(|e| {
            let status = crate::service::routing::control::worker_status(sh, e, now_us);
            let count: SlotCount = c.slot_count(e.slot, gen_of(sh, e.slot));
            let f = window.figures(e.slot as usize, count, t.decisions);
            let age = c.last_event_ms(e.slot).map(|t| now_ms.saturating_sub(t));
            // Approximate workers send no events by design.
            let routes = if status.approximate { 0 } else { f.routes };
            let warnings = model::warnings(status.state, routes, age);
            let [device, host, disk] = c.tiers(e.slot);
            sum.workers += 1;
            match status.state {
                WorkerState::Live => sum.live += 1,
                WorkerState::Suspect => sum.suspect += 1,
                WorkerState::Down => sum.down += 1,
            }
            sum.with_warnings += usize::from(!warnings.is_empty());
            sum.active_requests += u64::from(status.active_requests);
            sum.cached_blocks += status.cached_blocks;
            WorkerRow {
                status,
                cached: Tiers { device, host, disk },
                routes_1m: f.routes,
                share_1m: f.share.map(round3),
                hit_rate_1m: f.hit_rate.map(round3),
                last_event_age_s: age.map(|a| round3(a as f64 / 1000.0)),
                warnings,
            }
        })
        .collect();
    let doc = StatusDoc {
        version: env!("CARGO_PKG_VERSION"),
        uptime_s: round3(now_ms as f64 / 1000.0),
        refresh_ms: REFRESH_MS,
        window_s: round3(window_s),
        summary: sum,
        workers,
        history: series,
        decisions: c.recent(),
        settings: settings_json(sh),
    };
    Bytes::from(serde_json::to_vec(&doc).unwrap_or_else(|_| b"{}".to_vec()))
}

/// The `GET /v1/status` body: the cached document if younger than [`REFRESH_MS`], else
/// a fresh one (built by one caller at a time; the others get the previous one). The
/// build runs on glommio's blocking-thread pool, not on the executor: at 1,000 workers
/// it takes milliseconds that this core's routing should not wait behind.
pub async fn status_body(sh: Arc<Shared>) -> Bytes {
    let now = sh.now_ms();
    let st = &sh.status;
    let stale = match st.cache.lock() {
        Ok(c) => match &*c {
            Some((at, b)) if now < at + REFRESH_MS => return b.clone(),
            Some((_, b)) => Some(b.clone()),
            None => None,
        },
        Err(_) => None,
    };
    let owner = !st.building.swap(true, Ordering::AcqRel);
    if !owner {
        if let Some(b) = stale {
            return b;
        }
    }
    // The blocking thread stores the document and clears the flag itself, so a
    // caller that goes away mid-build (client disconnected) leaves no stuck flag.
    let worker = sh.clone();
    crate::service::runtime::blocking::run(move || {
        let body = build(&worker, now);
        let st = &worker.status;
        if let Ok(mut c) = st.cache.lock() {
            *c = Some((now, body.clone()));
        }
        if owner {
            st.building.store(false, Ordering::Release);
        }
        body
    })
    .await
}
