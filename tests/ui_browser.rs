//! The live status page (`GET /ui`, `GET /v1/status`) against the real service: its
//! token handling and cache over HTTP, and the page itself in headless Chromium
//! (fleet table with the right states, charts fed, a decision's explain record on
//! click, 1,000 workers paged, a screenshot in `target/ui-screenshot.png`).

mod common;
use common::ui::{target_dir, Browser};
use common::{hashes, spec, Server};
use kvroute::client::{EventPublisher, RequestClient};
use kvroute::engine::RouteRequest;
use kvroute::types::{Tier, WorkerSpec};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const TOKEN: &str = "ui-test-secret";

fn authed_get(s: &Server, path: &str, token: Option<&str>) -> (u16, String) {
    let mut r = ureq::get(&s.url(path));
    if let Some(t) = token {
        r = r.set("authorization", &format!("Bearer {t}"));
    }
    match r.call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}

fn status(s: &Server) -> Value {
    let (code, body) = authed_get(s, "/v1/status", Some(TOKEN));
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status is JSON")
}

fn worker_spec(id: &str, model: &str, topology: &str) -> WorkerSpec {
    let mut w = spec(id);
    w.model = model.into();
    w.topology = topology.into();
    w
}

#[test]
fn status_needs_the_token_and_is_cached() {
    let s = Server::start(1, &["--auth-token", TOKEN]);
    assert_eq!(authed_get(&s, "/v1/status", None).0, 401);
    assert_eq!(authed_get(&s, "/v1/status", Some("wrong")).0, 401);
    // Without a token the page answers 401 with a form asking for it (no data).
    let (code, form) = authed_get(&s, "/ui", None);
    assert_eq!(code, 401);
    assert!(form.contains("name=\"token\"") && !form.contains("/v1/status"));
    assert_eq!(authed_get(&s, "/ui?token=wrong", None).0, 401);
    let (code, page) = authed_get(&s, &format!("/ui?token={TOKEN}"), None);
    assert_eq!(code, 200);
    assert!(page.contains("/v1/status") && !page.contains("http://") && !page.contains("https://"));
    assert_eq!(authed_get(&s, "/ui", Some(TOKEN)).0, 200);
    // One document per refresh interval: of three back-to-back fetches, two
    // consecutive ones fall in the same interval and are byte-identical.
    let a = authed_get(&s, "/v1/status", Some(TOKEN)).1;
    let b = authed_get(&s, "/v1/status", Some(TOKEN)).1;
    let c = authed_get(&s, "/v1/status", Some(TOKEN)).1;
    assert!(a == b || b == c, "status rebuilt within one interval");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["settings"]["auth_token"], "(set, redacted)");
    assert!(
        !b.contains(TOKEN),
        "the token leaks into the status document"
    );
}

#[test]
fn status_without_a_token() {
    let s = Server::start(1, &[]);
    let (code, page) = authed_get(&s, "/ui", None);
    assert_eq!(code, 200);
    assert!(page.starts_with("<!doctype html>"));
    let (code, body) = authed_get(&s, "/v1/status", None);
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["settings"]["auth_token"], Value::Null);
    assert_eq!(v["refresh_ms"], 1000);
    assert_eq!(s.post("/ui", serde_json::json!({})).0, 405);
    // The page may load nothing from elsewhere.
    let r = ureq::get(&s.url("/ui")).call().unwrap();
    let csp = r.header("content-security-policy").unwrap_or_default();
    assert!(csp.starts_with("default-src 'none'") && csp.contains("connect-src 'self'"));
}

/// Keeps the given publishers alive (heartbeats) and sends a cache event now and then
/// (the events chart), until dropped.
struct Heartbeats {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeats {
    fn start(mut pubs: Vec<EventPublisher>) -> Heartbeats {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                for (i, p) in pubs.iter_mut().enumerate() {
                    if n.is_multiple_of(3) {
                        p.stored(Tier::Host, None, &hashes(900 + i as u64 * 100 + n, 2));
                    }
                    p.heartbeat(0, 8, 10_000);
                    let _ = p.flush();
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Heartbeats {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn status_page_in_a_browser() {
    let Some(browser) = Browser::start_or_skip() else {
        return;
    };
    let s = Server::start(
        2,
        &["--auth-token", TOKEN, "--heartbeat-timeout-ms", "3000"],
    );
    // Three live workers with cached prefixes, one that will turn suspect (sequence
    // gap) and one that will go down (stops heartbeating); all over the binary event
    // protocol. One static worker registered over the request API (no heartbeats).
    let mut alive = Vec::new();
    for (i, id) in ["gpu-a", "gpu-b", "gpu-c"].iter().enumerate() {
        let mut p =
            EventPublisher::connect(&s.events, worker_spec(id, "llama", "rack-1"), TOKEN).unwrap();
        p.stored(Tier::Device, None, &hashes(i as u64, 16));
        p.flush().unwrap();
        alive.push(p);
    }
    let mut suspect = EventPublisher::connect(
        &s.events,
        worker_spec("gpu-suspect", "llama", "rack-2"),
        TOKEN,
    )
    .unwrap();
    suspect.stored(Tier::Device, None, &hashes(7, 8));
    suspect.skip_seq(5);
    suspect.heartbeat(0, 8, 10_000);
    suspect.flush().unwrap();
    alive.push(suspect);
    let mut down =
        EventPublisher::connect(&s.events, worker_spec("gpu-down", "llama", "rack-2"), TOKEN)
            .unwrap();
    down.stored(Tier::Device, None, &hashes(8, 8));
    down.heartbeat(0, 8, 10_000);
    down.flush().unwrap();
    let _beats = Heartbeats::start(alive);
    let mut c = RequestClient::connect(&s.api, TOKEN).unwrap();
    c.register(worker_spec("static-1", "llama", "rack-3"))
        .unwrap();
    s.wait_until("index", |_| {
        let v = status(&s);
        v["workers"].as_array().is_some_and(|w| w.len() == 6)
            && v["summary"]["cached_blocks"].as_u64().unwrap_or(0) >= 48
    });
    // Routing traffic for a few seconds: prompts that share a worker's prefix.
    let traffic = |c: &mut RequestClient, tag: &str, n: u64| {
        for i in 0..n {
            let mut h = hashes(i % 3, 12);
            h.extend(hashes(10_000 + i, 4));
            let id = format!("{tag}-{i}");
            let r = RouteRequest {
                request_id: id.clone(),
                block_hashes: Some(h),
                model: Some("llama".into()),
                explain: i % 10 == 0,
                ..Default::default()
            };
            c.route(&r).unwrap();
            c.finish(&id).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    traffic(&mut c, "warm", 150);
    s.wait_until("suspect and down", |_| {
        let v = status(&s);
        let state = |id: &str| {
            v["workers"]
                .as_array()
                .and_then(|w| w.iter().find(|x| x["id"] == id))
                .map(|x| x["state"].clone())
        };
        state("gpu-suspect") == Some("suspect".into()) && state("gpu-down") == Some("down".into())
    });
    traffic(&mut c, "more", 60);
    // For the README's screenshot (docs/ui.png): KVROUTE_UI_DEMO_SECS=N runs N more
    // seconds of traffic whose rate and prefix reuse vary, so the charts have shape.
    let demo = std::env::var("KVROUTE_UI_DEMO_SECS").ok();
    if let Some(secs) = demo.and_then(|v| v.parse::<u64>().ok()) {
        let t0 = std::time::Instant::now();
        let mut i = 0u64;
        while t0.elapsed().as_secs() < secs {
            let x = t0.elapsed().as_secs_f64();
            let burst = 3 + ((x / 9.0).sin().abs() * 12.0) as u64;
            let spread = 3 + (x / 20.0) as u64 % 3;
            for _ in 0..burst {
                let mut h = hashes(i % spread, 12);
                h.extend(hashes(50_000 + i, 4));
                let id = format!("demo-{i}");
                let r = RouteRequest {
                    request_id: id.clone(),
                    block_hashes: Some(h),
                    model: Some("llama".into()),
                    ..Default::default()
                };
                c.route(&r).unwrap();
                c.finish(&id).unwrap();
                i += 1;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    browser.window(1400, 1100);
    browser.goto(&s.url(&format!("/ui?token={TOKEN}")));
    browser.wait_js(
        "first status fetch",
        "return !!(window.kvroute && window.kvroute.fetches > 0)",
        Duration::from_secs(15),
    );
    assert_eq!(
        browser.js("return location.search"),
        "",
        "the token stays in the address bar"
    );

    // Fleet table: every worker, with its state; warnings highlighted.
    let rows = browser.js(
        "return Array.from(document.querySelectorAll('#fleet tbody tr[data-worker]')).map(tr => \
         ({id: tr.dataset.worker, state: tr.querySelector('.state').textContent, cls: tr.className, \
           warn: tr.querySelector('td.w').textContent}))",
    );
    let rows = rows.as_array().expect("rows");
    let state_of = |id: &str| {
        rows.iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from the fleet table: {rows:?}"))
    };
    assert_eq!(rows.len(), 6, "{rows:?}");
    for id in ["gpu-a", "gpu-b", "gpu-c", "static-1"] {
        assert_eq!(state_of(id)["state"], "live", "{id}");
    }
    let sus = state_of("gpu-suspect");
    assert_eq!(sus["state"], "suspect");
    assert!(sus["cls"].as_str().unwrap().contains("warn"));
    assert!(sus["warn"].as_str().unwrap().contains("suspect index"));
    let dn = state_of("gpu-down");
    assert_eq!(dn["state"], "down");
    assert!(dn["cls"].as_str().unwrap().contains("down"));
    // The static worker gets routes but never sends cache events.
    let st = state_of("static-1");
    let v = status(&s);
    let routed_static = v["workers"]
        .as_array()
        .and_then(|w| w.iter().find(|x| x["id"] == "static-1"))
        .and_then(|x| x["routes_1m"].as_u64())
        .unwrap_or(0);
    if routed_static > 0 {
        assert!(st["warn"].as_str().unwrap().contains("no cache events"));
    }
    assert_eq!(
        browser.js("return document.getElementById('n-down').textContent"),
        "1 down"
    );

    // Charts: every series has points, and traffic shows up in them.
    browser.wait_js(
        "charts with data",
        "const d = (id, k) => Number(document.getElementById(id).dataset[k] || 0); \
         return d('chart-decisions','points') >= 2 && d('chart-decisions','max') > 0 \
           && d('chart-hit','max') > 0 && d('chart-latency','points') > 0 \
           && d('chart-events','max') > 0 && d('chart-errors','points') >= 2",
        Duration::from_secs(15),
    );

    // A decision's explain record, on click: candidates with their cost terms.
    // One made after gpu-down went down (the page may first get a document cached
    // before that traffic).
    let after_down = "#decisions tbody tr[data-request^='more-']";
    browser.wait_js(
        "decisions after the down worker left",
        &format!("return !!document.querySelector(\"{after_down}\")"),
        Duration::from_secs(5),
    );
    browser.click(after_down);
    browser.wait_js(
        "explain record",
        "return document.querySelectorAll('#explain-candidates tbody tr').length > 0",
        Duration::from_secs(5),
    );
    let ex = browser.js("const r = window.kvroute.selected; \
         return {id: r.request_id, decode: r.decode_worker, n: r.candidates.length, \
           title: document.getElementById('explain-title').textContent, \
           rows: Array.from(document.querySelectorAll('#explain-candidates tbody tr')).map(tr => \
             ({worker: tr.dataset.worker, chosen: tr.classList.contains('chosen'), \
               cells: Array.from(tr.cells).map(c => c.textContent)}))}");
    assert_eq!(ex["title"], ex["id"]);
    let cand = ex["rows"].as_array().unwrap();
    assert_eq!(cand.len() as u64, ex["n"].as_u64().unwrap());
    // 5 live-or-suspect workers of model llama are scored (the down one is not).
    assert!(cand.len() >= 4, "{ex}");
    let chosen: Vec<_> = cand.iter().filter(|c| c["chosen"] == true).collect();
    assert_eq!(chosen.len(), 1, "{ex}");
    assert_eq!(chosen[0]["worker"], ex["decode"]);
    for c in cand {
        let cells = c["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 7);
        let cost: f64 = cells[6].as_str().unwrap().replace(',', "").parse().unwrap();
        assert!(cost.is_finite());
        assert_ne!(
            c["worker"], "gpu-down",
            "a down worker is no candidate: {ex}"
        );
    }
    let kv = browser.js("return document.getElementById('explain-kv').textContent");
    assert!(kv.as_str().unwrap().contains("cost"));

    // Sortable: by state, down first.
    browser.click("#fleet th[data-key=state]");
    browser.wait_js(
        "sorted by state",
        "const r = document.querySelectorAll('#fleet tbody tr[data-worker]'); \
         return r[0].dataset.worker === 'gpu-down' && r[1].dataset.worker === 'gpu-suspect'",
        Duration::from_secs(5),
    );
    browser.click("#fleet th[data-key=id]");

    let png = browser.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "screenshot is no PNG");
    std::fs::write(target_dir().join("ui-screenshot.png"), &png).unwrap();

    // 1,000 workers: paged, no horizontal overflow of the page, on a laptop and a phone.
    for i in 0..1000 {
        c.register(worker_spec(&format!("fleet-{i:04}"), "mistral", "rack-9"))
            .unwrap();
    }
    browser.wait_js(
        "1,006 workers",
        "return window.kvroute.doc && window.kvroute.doc.workers.length === 1006",
        Duration::from_secs(15),
    );
    let paged = "return document.querySelectorAll('#fleet tbody tr[data-worker]').length === 50 \
                 && document.getElementById('page-info').textContent === '1–50 of 1006'";
    browser.wait_js("first page", paged, Duration::from_secs(5));
    browser.click("#next");
    browser.wait_js(
        "second page",
        "return document.getElementById('page-info').textContent === '51–100 of 1006'",
        Duration::from_secs(5),
    );
    let no_overflow = "return document.documentElement.scrollWidth <= window.innerWidth + 1";
    assert_eq!(browser.js(no_overflow), true, "page wider than the window");
    browser.window(420, 900);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        browser.js(no_overflow),
        true,
        "page wider than a phone window"
    );
    std::fs::write(
        target_dir().join("ui-screenshot-phone.png"),
        browser.screenshot(),
    )
    .unwrap();
    // Filtering finds one worker among them.
    browser.js(
        "const f = document.getElementById('filter'); f.value = 'gpu-suspect'; \
         f.dispatchEvent(new Event('input'));",
    );
    browser.wait_js(
        "filtered",
        "const r = document.querySelectorAll('#fleet tbody tr[data-worker]'); \
         return r.length === 1 && r[0].dataset.worker === 'gpu-suspect'",
        Duration::from_secs(5),
    );
    drop(down);
}
