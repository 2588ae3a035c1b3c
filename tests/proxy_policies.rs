//! The front door's policies through the real `kvroute serve` binary and a
//! `kvroute-sim fleet` worker: one worker whose busy threshold lets one request run at
//! a time (`--busy-threshold` tiny), slowed so that it saturates (20 ms per decode
//! step), and a small admission queue.
//!
//! - a burst above capacity is queued and served in priority order, none lost;
//! - with no busy threshold, a burst the worker itself refuses (429 past its own
//!   bound) is queued the same way, not answered 429;
//! - a deadline passing in the queue is a 429 `queue_timeout` with `retry-after`;
//! - a queued client that disconnects leaves the queue at once;
//! - at the proxy's concurrency cap (`queue_at_max_concurrent`), requests wait for a
//!   slot in the order their headers ask for;
//! - a low priority is served in the end under sustained high-priority load (aging);
//! - a full queue answers 429 `queue_full` at once, and a better request displaces
//!   the last one;
//! - a tenant over its request rate gets a 429 naming the limit while another tenant
//!   is served; a malformed hint is a 400;
//! - a session's follow-ups stay with its worker (prompts rewritten each turn);
//! - on a P/D fleet, a short prompt prefills on the decode worker (no transfer), a
//!   long one takes the remote prefill leg.

mod common;

use common::fleet::{post, Fleet, FAST};
use common::Server;
use serde_json::{json, Value};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// 1 ms prefill, 20 ms per decode step: a request of `max_tokens` n holds the worker
/// for about n × 20 ms.
const SLOW: &str = "prefill_base_us=1000,prefill_us_per_token=1,prefill_attention_us=0,decode_step_base_us=20000,decode_us_per_seq=0";

/// What ended: (tag, status, error code), in order.
type Done = Arc<Mutex<Vec<(u32, u16, String)>>>;

struct Setup {
    _fleet: Fleet,
    s: Server,
    url: String,
}

fn start(extra: &[&str]) -> Setup {
    start_on(&[], &["--busy-threshold", "0.0001"], extra)
}

/// One SLOW worker (more `fleet` flags), the router's busy rule (`busy`) and `extra`.
fn start_on(fleet: &[&str], busy: &[&str], extra: &[&str]) -> Setup {
    let mut fa = vec!["--workers", "1", "--block-size", "4", "--timing", SLOW];
    fa.extend_from_slice(fleet);
    let fleet = Fleet::start(&fa);
    let engine = fleet.workers[0].engine.clone().expect("engine flag");
    let mut args = vec!["--block-size", "4", "--engine", &engine];
    args.extend_from_slice(busy);
    args.extend_from_slice(&[
        "--admission-max-queued",
        "4",
        "--admission-max-wait-ms",
        "20000",
        "--admission-tenant-header",
        "x-tenant",
        "--admission-tenant-requests-per-s",
        "0.1",
        "--admission-tenant-burst-ms",
        "20000",
    ]);
    args.extend_from_slice(extra);
    let s = Server::start(1, &args);
    let url = format!("http://{}/v1/completions", s.proxy);
    Setup {
        _fleet: fleet,
        s,
        url,
    }
}

fn body(tag: u32, max_tokens: u32, priority: i32) -> Value {
    json!({"model": "sim-model", "prompt": [1, 2, 3, 4, 5, 6, 7, tag], "max_tokens": max_tokens, "priority": priority})
}

/// POSTs with extra headers; status, headers asked for, body.
fn send(
    url: &str,
    b: Value,
    headers: &[(&str, &str)],
    want: &[&str],
) -> (u16, Vec<Option<String>>, String) {
    let mut r = ureq::post(url).timeout(Duration::from_secs(60));
    for (k, v) in headers {
        r = r.set(k, v);
    }
    let resp = match r.send_json(b) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("POST {url}: {e}"),
    };
    let hs = want
        .iter()
        .map(|h| resp.header(h).map(String::from))
        .collect();
    (resp.status(), hs, resp.into_string().unwrap_or_default())
}

fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    v["error"]["code"].as_str().unwrap_or("").to_string()
}

fn depth(s: &Server) -> f64 {
    s.metric("kvroute_proxy_queue_depth{model=\"sim-model\"}")
}

fn wait_depth(s: &Server, n: f64) {
    s.wait_until(&format!("queue depth {n}"), |s| depth(s) == n);
}

/// A request in the background, its (tag, status, code) pushed to `done` as it ends.
fn spawn(url: &str, b: Value, tag: u32, done: &Done) -> JoinHandle<()> {
    let (url, done) = (url.to_string(), done.clone());
    std::thread::spawn(move || {
        let (c, out) = post(&url, b);
        done.lock().unwrap().push((tag, c, code(&out)));
    })
}

/// Holds the worker for `steps` decode steps (so that every other request queues).
fn occupy(st: &Setup, steps: u32, done: &Done) -> JoinHandle<()> {
    let h = spawn(&st.url, body(0, steps, 0), 0, done);
    st.s.wait_until("the occupier routed", |s| {
        s.metric("kvroute_proxy_active") >= 1.0
            && s.metric("kvroute_routes_total{mode=\"kv\",outcome=\"ok\"}") >= 1.0
    });
    h
}

#[test]
fn the_queue_orders_bounds_and_lets_go() {
    let st = start(&[]);
    let s = &st.s;

    // A burst above capacity: queued, then served one at a time by priority.
    let done = Arc::new(Mutex::new(Vec::new()));
    let mut hs = vec![occupy(&st, 100, &done)];
    let ok_before = s.metric("kvroute_routes_total{mode=\"kv\",outcome=\"ok\"}");
    for (i, prio) in [(1u32, 5), (2, -5), (3, 0), (4, 3)] {
        hs.push(spawn(&st.url, body(i, 5, prio), i, &done));
        wait_depth(s, f64::from(i));
    }
    assert_eq!(
        s.metric("kvroute_routes_total{mode=\"kv\",outcome=\"ok\"}"),
        ok_before,
        "the occupier must still hold the worker while the burst queues"
    );
    for h in hs {
        h.join().unwrap();
    }
    let order: Vec<(u32, u16, String)> = done.lock().unwrap().clone();
    assert_eq!(
        order.iter().map(|o| (o.0, o.1)).collect::<Vec<_>>(),
        vec![(0, 200), (2, 200), (3, 200), (4, 200), (1, 200)],
        "served by priority (lower first), none lost"
    );
    assert_eq!(depth(s), 0.0);
    assert_eq!(s.metric("kvroute_proxy_queued_total"), 4.0);

    // A deadline that passes in the queue: 429 queue_timeout with retry-after.
    let done = Arc::new(Mutex::new(Vec::new()));
    let occ = occupy(&st, 150, &done);
    let (c, h, out) = send(
        &st.url,
        body(5, 2, 0),
        &[("x-kvroute-deadline-ms", "300")],
        &["retry-after"],
    );
    assert_eq!((c, code(&out).as_str()), (429, "queue_timeout"), "{out}");
    assert!(h[0]
        .as_deref()
        .is_some_and(|v| v.parse::<u32>().is_ok_and(|s| s >= 1)));
    assert_eq!(
        s.metric("kvroute_proxy_queue_dropped_total{reason=\"timeout\"}"),
        1.0
    );

    // A client that goes away while queued leaves the queue at once.
    let mut raw = std::net::TcpStream::connect(&s.proxy).unwrap();
    let b = body(6, 2, 0).to_string();
    write!(
        raw,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    wait_depth(s, 1.0);
    drop(raw);
    s.wait_until("the departed client left the queue", |s| {
        s.metric("kvroute_proxy_queue_dropped_total{reason=\"client_gone\"}") == 1.0
            && depth(s) == 0.0
    });

    // A full queue: 429 at once; a better request takes the last one's place.
    let mut hs = Vec::new();
    for i in 10..14u32 {
        hs.push(spawn(&st.url, body(i, 1, 5), i, &done));
        wait_depth(s, f64::from(i - 9));
    }
    let (c, _, out) = send(&st.url, body(14, 1, 5), &[], &[]);
    assert_eq!((c, code(&out).as_str()), (429, "queue_full"), "{out}");
    hs.push(spawn(&st.url, body(15, 1, -5), 15, &done));
    s.wait_until("a displaced request answered", |_| {
        done.lock().unwrap().iter().any(|d| d.1 == 429)
    });
    occ.join().unwrap();
    for h in hs {
        h.join().unwrap();
    }
    let done = done.lock().unwrap().clone();
    let refused: Vec<_> = done.iter().filter(|d| d.1 == 429).collect();
    assert_eq!(refused.len(), 1, "{done:?}");
    assert_eq!(refused[0].2, "queue_full");
    assert_eq!(done.iter().filter(|d| d.1 == 200).count(), 5, "{done:?}");
    let after_occupier: Vec<u32> = done
        .iter()
        .filter(|d| d.1 == 200 && d.0 != 0)
        .map(|d| d.0)
        .collect();
    assert_eq!(
        after_occupier.first(),
        Some(&15),
        "the better request first: {done:?}"
    );
    assert_eq!(
        s.metric("kvroute_proxy_queue_dropped_total{reason=\"full\"}"),
        2.0
    );
    assert_eq!(depth(s), 0.0);
}

#[test]
fn without_a_busy_threshold_a_burst_the_worker_refuses_is_queued() {
    // A default router (no busy threshold: it never finds the worker busy) in front of
    // a worker that runs one request at a time and answers 429 past that.
    let st = start_on(&["--max-active", "1"], &[], &[]);
    let s = &st.s;
    let done: Done = Arc::new(Mutex::new(Vec::new()));
    let mut hs = vec![occupy(&st, 60, &done)];
    for (i, prio) in [(1u32, 5), (2, -5), (3, 0)] {
        hs.push(spawn(&st.url, body(i, 2, prio), i, &done));
        wait_depth(s, f64::from(i));
    }
    for h in hs {
        h.join().unwrap();
    }
    let order: Vec<(u32, u16, String)> = done.lock().unwrap().clone();
    assert_eq!(
        order.iter().map(|o| (o.0, o.1)).collect::<Vec<_>>(),
        vec![(0, 200), (2, 200), (3, 200), (1, 200)],
        "queued, served by priority, none refused: {order:?}"
    );
    assert!(s.metric("kvroute_proxy_upstream_errors_total{kind=\"busy\"}") >= 1.0);
    assert_eq!(s.metric("kvroute_proxy_queued_total"), 3.0);
    assert_eq!(depth(s), 0.0);
}

#[test]
fn tenants_are_limited_apart_and_bad_hints_refused() {
    let st = start(&[]);
    let t = |tenant: &str| {
        send(
            &st.url,
            body(1, 1, 0),
            &[("x-tenant", tenant)],
            &["x-kvroute-limit", "retry-after"],
        )
    };
    // A burst of 2 (0.1/s over 20 s), then refused, naming the limit.
    assert_eq!(t("a").0, 200);
    assert_eq!(t("a").0, 200);
    let (c, h, out) = t("a");
    assert_eq!(
        (c, code(&out).as_str()),
        (429, "tenant_requests_per_s"),
        "{out}"
    );
    assert_eq!(h[0].as_deref(), Some("requests_per_s"));
    assert!(h[1].is_some(), "retry-after");
    // Another tenant is served meanwhile; requests with no tenant are not limited.
    assert_eq!(t("b").0, 200);
    assert_eq!(send(&st.url, body(1, 1, 0), &[], &[]).0, 200);
    let s = &st.s;
    assert_eq!(
        s.metric("kvroute_proxy_tenant_limited_total{tenant=\"a\",limit=\"requests_per_s\"}"),
        1.0
    );
    assert_eq!(
        s.metric("kvroute_proxy_tenant_requests_total{tenant=\"a\"}"),
        2.0
    );
    assert_eq!(
        s.metric("kvroute_proxy_tenant_requests_total{tenant=\"b\"}"),
        1.0
    );
    // A malformed hint is named in a 400, not ignored.
    let (c, _, out) = send(
        &st.url,
        body(1, 1, 0),
        &[("x-kvroute-priority", "high")],
        &[],
    );
    assert_eq!((c, code(&out).as_str()), (400, "invalid_hint"), "{out}");
    assert!(out.contains("x-kvroute-priority"), "{out}");
}

#[test]
fn a_low_priority_is_served_under_sustained_high_priority_load() {
    // Aging: one class per 100 ms, classes -2..=2, so a priority-2 request is passed
    // only by requests that arrived less than (2 + 2 + 1) x 100 ms after it.
    let st = start(&[
        "--admission-aging-ms",
        "100",
        "--admission-max-priority",
        "2",
    ]);
    let s = &st.s;
    let done: Done = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two clients keep high-priority requests queued the whole time.
    let high: Vec<JoinHandle<()>> = (0..2u32)
        .map(|c| {
            let (url, done, stop) = (st.url.clone(), done.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 200 {
                    let (code, _) = post(&url, body(100 + c, 3, -2));
                    done.lock().unwrap().push((100 + c, code, String::new()));
                    i += 1;
                }
            })
        })
        .collect();
    wait_depth(s, 1.0);
    let low = spawn(&st.url, body(7, 1, 2), 7, &done);
    low.join().unwrap();
    let highs_after = |d: &[(u32, u16, String)]| d.iter().filter(|x| x.0 >= 100).count();
    let at_low = {
        let d = done.lock().unwrap();
        let pos = d
            .iter()
            .position(|x| x.0 == 7)
            .expect("the low request ended");
        assert_eq!(d[pos].1, 200, "{d:?}");
        highs_after(&d[..pos])
    };
    // The high-priority load went on after it (it was sustained, not drained).
    s.wait_until("high-priority requests served after the low one", |_| {
        highs_after(&done.lock().unwrap()) >= at_low + 2
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in high {
        h.join().unwrap();
    }
    let d = done.lock().unwrap();
    assert!(
        at_low >= 2,
        "it was passed by high-priority requests first: {d:?}"
    );
    assert!(d.iter().all(|x| x.1 == 200), "{d:?}");
}

/// POSTs through the proxy with a session header; the worker that served it.
fn turn(url: &str, session: &str, tag: u32) -> String {
    let prompt: Vec<u32> = (0..12).map(|i| 100 * tag + i).collect();
    let b = json!({"model": "sim-model", "prompt": prompt, "max_tokens": 1});
    let (c, h, out) = send(url, b, &[("x-session-id", session)], &["x-kvroute-worker"]);
    assert_eq!(c, 200, "{out}");
    h[0].clone().expect("x-kvroute-worker")
}

#[test]
fn session_follow_ups_stay_with_their_worker() {
    let fleet = Fleet::start(&["--workers", "2", "--block-size", "4", "--timing", FAST]);
    let e0 = fleet.workers[0].engine.clone().expect("engine flag");
    let e1 = fleet.workers[1].engine.clone().expect("engine flag");
    let s = Server::start(
        1,
        &[
            "--block-size",
            "4",
            "--engine",
            &e0,
            "--engine",
            &e1,
            "--session-max-entries",
            "1024",
        ],
    );
    let url = format!("http://{}/v1/completions", s.proxy);
    // Every turn's prompt is new (a rewritten history): only the session ties them.
    let first_a = turn(&url, "conv-a", 1);
    let first_b = turn(&url, "conv-b", 2);
    // Two turns of one for each of the other: taking workers in turn would split them.
    for t in 3..7 {
        assert_eq!(turn(&url, "conv-a", t), first_a, "turn {t} of conv-a");
        assert_eq!(turn(&url, "conv-a", 10 + t), first_a, "turn {t}' of conv-a");
        assert_eq!(turn(&url, "conv-b", 20 + t), first_b, "turn {t} of conv-b");
    }
    // Without a session the same requests spread over both workers.
    let mut seen = std::collections::HashSet::new();
    for t in 30..36 {
        let prompt: Vec<u32> = (0..12).map(|i| 100 * t + i).collect();
        let b = json!({"model": "sim-model", "prompt": prompt, "max_tokens": 1});
        let (_, h, _) = send(&url, b, &[], &["x-kvroute-worker"]);
        seen.insert(h[0].clone());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn conditional_disaggregation_prefills_short_prompts_locally() {
    let fleet = Fleet::start(&[
        "--workers",
        "2",
        "--prefill-workers",
        "1",
        "--block-size",
        "4",
        "--timing",
        FAST,
    ]);
    let e0 = fleet.workers[0].engine.clone().expect("engine flag");
    let e1 = fleet.workers[1].engine.clone().expect("engine flag");
    let s = Server::start(
        1,
        &[
            "--block-size",
            "4",
            "--engine",
            &e0,
            "--engine",
            &e1,
            "--local-prefill-max-uncached-tokens",
            "16",
        ],
    );
    let url = format!("http://{}/v1/completions", s.proxy);
    let go = |n: u32, tag: u32| {
        let prompt: Vec<u32> = (0..n).map(|i| 1000 * tag + i).collect();
        let b = json!({"model": "sim-model", "prompt": prompt, "max_tokens": 2});
        let (c, h, out) = send(&url, b, &[], &["x-kvroute-prefill", "x-kvroute-worker"]);
        assert_eq!(c, 200, "{out}");
        (
            h[0].clone().unwrap_or_default(),
            h[1].clone().unwrap_or_default(),
        )
    };
    let transferred = || fleet.stats(1)["transferred_blocks"].as_u64().unwrap_or(0);
    // 12 uncached tokens: prefilled on the decode worker, nothing transferred.
    assert_eq!(go(12, 1), ("local-short".into(), "sim-1".into()));
    assert_eq!(transferred(), 0);
    // 40 uncached tokens: the remote prefill leg, its blocks transferred.
    assert_eq!(go(40, 2), ("remote".into(), "sim-1".into()));
    assert_eq!(transferred(), 10);
    assert_eq!(
        s.metric("kvroute_proxy_prefill_path_total{path=\"local\"}"),
        1.0
    );
    assert_eq!(
        s.metric("kvroute_proxy_prefill_path_total{path=\"remote\"}"),
        1.0
    );
}

#[test]
fn at_the_concurrency_cap_requests_wait_by_their_header_priority() {
    let st = start(&[
        "--proxy-max-concurrent",
        "1",
        "--admission-queue-at-max-concurrent",
        "true",
    ]);
    let s = &st.s;
    let slots =
        |s: &Server| s.metric("kvroute_proxy_queue_depth{model=\"(proxy.max_concurrent)\"}");
    let done: Done = Arc::new(Mutex::new(Vec::new()));
    let mut hs = vec![occupy(&st, 60, &done)];
    for (i, prio) in [(1u32, "3"), (2, "-3"), (3, "0")] {
        let (url, done) = (st.url.clone(), done.clone());
        hs.push(std::thread::spawn(move || {
            let (c, _, out) = send(&url, body(i, 2, 0), &[("x-kvroute-priority", prio)], &[]);
            done.lock().unwrap().push((i, c, code(&out)));
        }));
        s.wait_until("queued for a slot", |s| slots(s) == f64::from(i));
    }
    for h in hs {
        h.join().unwrap();
    }
    let order: Vec<(u32, u16)> = done.lock().unwrap().iter().map(|d| (d.0, d.1)).collect();
    assert_eq!(order, vec![(0, 200), (2, 200), (3, 200), (1, 200)]);
    assert_eq!(slots(s), 0.0);
}
