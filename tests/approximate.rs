//! Approximate mode through the real binary: `kvroute-sim fleet --events none` workers
//! register with `kvroute serve` over HTTP with their url (`--register`), so kvroute
//! models their caches from the prompts it routes to them. Requests go through
//! kvroute's OpenAI proxy (or `/v1/route`), and hits are measured at the simulated
//! workers. Speculative indexing and prefix affinity are off in these routers, so the
//! model alone explains where a repeated prefix goes. Every child process is stopped
//! in `Drop`.

mod common;

use common::fleet::{post, Fleet, FAST};
use common::Server;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Router flags of every test: 4-token blocks, no speculative blocks, no affinity.
const BASE: &[&str] = &[
    "--block-size",
    "4",
    "--speculative-ttl-ms",
    "0",
    "--affinity-max-entries",
    "0",
];

fn server(cores: usize, extra: &[&str], logged: bool) -> Server {
    let args = [BASE, extra].concat();
    if logged {
        Server::start_logged(cores, &args)
    } else {
        Server::start(cores, &args)
    }
}

/// Two simulated workers without events, registered at `s` with their urls.
fn fleet(s: &Server, extra: &[&str]) -> Fleet {
    fleet_of(s, 2, extra)
}

/// `n` simulated workers without events, registered at `s` with their urls.
fn fleet_of(s: &Server, n: usize, extra: &[&str]) -> Fleet {
    let workers = n.to_string();
    let args = [
        &[
            "--workers",
            &workers,
            "--block-size",
            "4",
            "--timing",
            FAST,
            "--events",
            "none",
            "--register",
            &s.http,
        ],
        extra,
    ]
    .concat();
    let f = Fleet::start(&args);
    s.wait_until("the workers registered", |s| s.workers().len() == n);
    f
}

fn worker<'a>(ws: &'a [Value], id: &str) -> &'a Value {
    ws.iter()
        .find(|w| w["id"] == id)
        .unwrap_or_else(|| panic!("no worker {id} in {ws:?}"))
}

/// `(approximate, approximate_entries)` of worker `id` in `GET /v1/workers`.
fn mode(s: &Server, id: &str) -> (bool, Option<u64>) {
    let ws = s.workers();
    let w = worker(&ws, id);
    (
        w["approximate"].as_bool().unwrap_or(false),
        w["approximate_entries"].as_u64(),
    )
}

/// Waits until worker `id` is approximate with `n` modelled blocks: a route's touch
/// reaches the other cores asynchronously.
fn modelled(s: &Server, id: &str, n: u64) {
    s.wait_until(&format!("{id} modelling {n} blocks"), |s| {
        mode(s, id) == (true, Some(n))
    });
}

fn stat(f: &Fleet, i: usize, key: &str) -> u64 {
    f.stats(i)[key].as_u64().unwrap()
}

/// A token-id completion through the proxy; returns the index of the worker that
/// served it and the blocks that were a hit there.
fn complete(s: &Server, f: &Fleet, toks: &[u32]) -> (usize, u64) {
    let before: Vec<(u64, u64)> = (0..2)
        .map(|i| (stat(f, i, "requests"), stat(f, i, "cached_blocks")))
        .collect();
    let (c, b) = post(
        &format!("http://{}/v1/completions", s.proxy),
        json!({"model": "sim-model", "prompt": toks, "max_tokens": 2}),
    );
    assert_eq!(c, 200, "{b}");
    let i = (0..2)
        .find(|&i| stat(f, i, "requests") > before[i].0)
        .expect("no worker served the request");
    (i, stat(f, i, "cached_blocks") - before[i].1)
}

/// Device overlap per worker of an explained `/v1/route` by tokens (the request is
/// finished at once, so it leaves no load).
fn overlaps(s: &Server, id: &str, body: Value) -> Vec<(String, u64)> {
    let mut body = body;
    body["request_id"] = json!(id);
    body["model"] = json!("sim-model");
    body["explain"] = json!(true);
    let (c, d) = s.post("/v1/route", body);
    assert_eq!(c, 200, "{d}");
    let (c, e) = s.post(&format!("/v1/requests/{id}/finish"), json!({}));
    assert_eq!(c, 200, "{e}");
    let mut out: Vec<(String, u64)> = d["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let w = c["worker"].as_str().unwrap().to_string();
            (w, c["overlap"]["device"].as_u64().unwrap())
        })
        .collect();
    out.sort();
    out
}

fn prompt(k: u32, blocks: u32) -> Vec<u32> {
    (0..blocks * 4).map(|j| 10_000 * (k + 1) + j).collect()
}

#[test]
fn repeated_prefixes_land_on_the_worker_that_served_them_and_hit_there() {
    for layout in ["sharded", "replicated"] {
        let s = server(2, &["--index-layout", layout], false);
        let f = fleet(&s, &[]);
        for id in ["sim-0", "sim-1"] {
            assert_eq!(mode(&s, id), (true, Some(0)), "{layout}");
        }
        for k in 0..6 {
            let toks = prompt(k, 16);
            let (first, _) = complete(&s, &f, &toks);
            // The first request has ended: only the model remembers the prompt.
            let (again, hit) = complete(&s, &f, &toks);
            assert_eq!((again, hit), (first, 16), "{layout}: prompt {k}");
        }
        let (_, status) = s.get("/v1/status");
        let status: Value = serde_json::from_str(&status).unwrap();
        let rows = status["workers"].as_array().unwrap();
        let modelled: u64 = ["sim-0", "sim-1"]
            .iter()
            .map(|id| {
                let w = worker(rows, id);
                assert_eq!(w["approximate"], true, "{layout}: {w}");
                assert!(w["warnings"].as_array().unwrap().is_empty(), "{w}");
                w["approximate_entries"].as_u64().unwrap()
            })
            .sum();
        assert_eq!(modelled, 6 * 16, "{layout}");
        assert_eq!(
            s.metric("kvroute_worker_approximate{worker=\"sim-0\"}"),
            1.0
        );
        assert_eq!(
            s.metric("kvroute_approximate_credited_blocks_total"),
            6.0 * 16.0,
            "{layout}"
        );
    }
}

/// Hit rate at the workers over the committed trace slice: approximate mode against
/// the same router with it off (load-only: no events, no affinity). The slice's first
/// 600 requests reuse 13% of their blocks beyond the prefix every request shares: that
/// reuse is what a router without the model finds only by chance.
#[test]
fn the_hit_rate_at_the_workers_is_higher_than_load_only() {
    let run = |extra: &[&str]| -> f64 {
        let s = server(2, extra, false);
        // Room for every prompt (600 x 128 blocks over 4 workers): the trace's reuse comes minutes
        // apart, and eviction is not what this compares.
        let f = fleet_of(&s, 4, &["--capacity-blocks", "40000"]);
        let urls: Vec<&str> = f.workers.iter().map(|w| w.url.as_str()).collect();
        let urls = urls.join(",");
        let (line, r) = common::sim::run_json(
            "approximate",
            "replay",
            &[
                "replay",
                "--trace",
                common::sim::SLICE,
                "--target",
                &format!("http://{}", s.proxy),
                "--limit",
                "600",
                "--rate",
                "150",
                "--token-ids",
                "--trace-block",
                "16",
                "--max-input-tokens",
                "512",
                "--max-output-tokens",
                "4",
                "--workers-stats",
                &urls,
            ],
        );
        assert_eq!(r["ok"], 600, "{line}");
        let on = extra.is_empty();
        assert_eq!(mode(&s, "sim-0").0, on);
        r["hit_rate"].as_f64().unwrap()
    };
    let approximate = run(&[]);
    let load_only = run(&["--approximate", "false"]);
    eprintln!("hit rate at the workers: approximate {approximate:.3}, load-only {load_only:.3}");
    assert!(
        approximate > load_only * 1.25,
        "approximate {approximate:.3} vs load-only {load_only:.3}"
    );
}

#[test]
fn a_worker_that_starts_publishing_switches_to_exact() {
    let s = server(2, &[], true);
    let f = fleet(&s, &[]);
    let toks = prompt(1, 16);
    let (i, _) = complete(&s, &f, &toks);
    let w = f.workers[i].id.clone();
    modelled(&s, &w, 16);
    let by_tokens = json!({"tokens": toks});
    assert!(overlaps(&s, "r1", by_tokens.clone()).contains(&(w.clone(), 16)));
    // Its engine starts publishing: the first event makes it exact.
    let h = common::hashes(7, 4);
    s.store(&w, "device", &h);
    // Events are applied by the cores asynchronously: every core has cleared its
    // modelled blocks of the worker before it applies its slice of the batch.
    s.wait_until("the event applied", |s| s.cached(&w) == 4);
    assert_eq!(mode(&s, &w), (false, None));
    assert_eq!(s.metric("kvroute_approximate_switches_total"), 1.0);
    assert_eq!(
        s.metric(&format!("kvroute_worker_approximate{{worker=\"{w}\"}}")),
        0.0
    );
    assert!(
        s.log()
            .iter()
            .any(|l| l.contains(&format!("worker {w:?} sent its first KV event"))),
        "{:?}",
        s.log()
    );
    // The modelled blocks are gone; what the event says counts.
    assert!(overlaps(&s, "r2", by_tokens.clone()).contains(&(w.clone(), 0)));
    assert!(overlaps(&s, "r3", json!({"block_hashes": h})).contains(&(w.clone(), 4)));
    // Routes no longer feed its model.
    let mut pinned = by_tokens.clone();
    pinned["pin"] = json!(w);
    overlaps(&s, "r4", pinned);
    assert_eq!(mode(&s, &w), (false, None));
    assert!(overlaps(&s, "r5", by_tokens).contains(&(w.clone(), 0)));
}

/// Five 4-block prompts pinned to one worker of capacity 8: the model keeps the last
/// two (on one core an exact LRU; on two, each core keeps its share of 4).
#[test]
fn the_model_is_bounded_by_the_declared_capacity() {
    for cores in [1, 2] {
        let s = server(cores, &[], false);
        let _f = fleet(&s, &["--capacity-blocks", "8"]);
        for k in 0..5 {
            overlaps(
                &s,
                &format!("p{k}"),
                json!({"tokens": prompt(k, 4), "pin": "sim-0"}),
            );
        }
        // The last prompt's touch reaches the other core asynchronously (asking
        // touches it again: idempotent).
        let mut k = 0;
        s.wait_until("the last prompt modelled", |s| {
            k += 1;
            let o = overlaps(s, &format!("w{k}"), json!({"tokens": prompt(4, 4)}));
            o.contains(&("sim-0".into(), 4))
        });
        let (on, n) = mode(&s, "sim-0");
        assert!(on && n <= Some(8), "{cores} cores: {n:?}");
        assert_eq!(
            s.metric("kvroute_worker_approximate_blocks{worker=\"sim-0\"}"),
            n.unwrap_or(0) as f64
        );
        let last = overlaps(&s, "q4", json!({"tokens": prompt(4, 4)}));
        assert!(
            last.contains(&("sim-0".into(), 4)),
            "{cores} cores: {last:?}"
        );
        if cores == 1 {
            assert_eq!(n, Some(8));
            let first = overlaps(&s, "q0", json!({"tokens": prompt(0, 4)}));
            assert!(first.contains(&("sim-0".into(), 0)), "{first:?}");
        }
    }
}

#[test]
fn modelled_blocks_expire_after_the_idle_ttl() {
    let s = server(2, &["--approximate-ttl-ms", "1500"], false);
    let _f = fleet(&s, &[]);
    let toks = json!({"tokens": prompt(3, 4), "pin": "sim-1"});
    overlaps(&s, "a", toks);
    modelled(&s, "sim-1", 4);
    s.wait_until("the idle TTL", |s| mode(s, "sim-1").1 == Some(0));
    let after = overlaps(&s, "b", json!({"tokens": prompt(3, 4)}));
    assert!(after.iter().all(|(_, d)| *d == 0), "{after:?}");
}

/// Warm restart: the mode is saved with the worker, the modelled blocks are not.
#[test]
fn a_warm_restart_keeps_the_mode_and_starts_the_model_empty() {
    let dir = common::sim::tmp("approximate", "state");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let s = server(1, &["--state-dir", d], false);
    let _f = fleet(&s, &[]);
    overlaps(&s, "a", json!({"tokens": prompt(5, 4), "pin": "sim-0"}));
    modelled(&s, "sim-0", 4);
    drop(s);
    let s = server(1, &["--state-dir", d], false);
    assert_eq!(mode(&s, "sim-0"), (true, Some(0)));
    overlaps(&s, "b", json!({"tokens": prompt(5, 4), "pin": "sim-0"}));
    modelled(&s, "sim-0", 4);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Replicas (`--cluster`): each replica models the routes its peers share with it (the
/// shared load op of a route carries its hashes and workers), so a prompt one replica
/// routed counts on the other too.
#[test]
fn replicas_model_each_others_routes() {
    use common::cluster::{nats_available, NatsServer};
    if !nats_available() {
        return;
    }
    let nats = NatsServer::start();
    let url = nats.url();
    let replica = || {
        let s = server(
            1,
            &[
                "--cluster",
                &url,
                "--cluster-name",
                "approx",
                "--heartbeat-timeout-ms",
                "600000",
            ],
            false,
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.get("/readyz").0 != 200 {
            assert!(Instant::now() < deadline, "replica not ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    };
    let (a, b) = (replica(), replica());
    for (id, port) in [("u0", 9), ("u1", 10)] {
        a.register(
            json!({"id": id, "model": "sim-model", "url": format!("http://127.0.0.1:{port}")}),
        );
    }
    b.wait_until("B sees the fleet", |b| b.workers().len() == 2);
    assert_eq!(mode(&b, "u0"), (true, Some(0)));
    let h = common::hashes(11, 12);
    overlaps(&a, "x1", json!({"block_hashes": h, "pin": "u1"}));
    b.wait_until("B models A's route", |b| mode(b, "u1") == (true, Some(12)));
    assert!(overlaps(&b, "x2", json!({"block_hashes": h})).contains(&("u1".into(), 12)));
}
