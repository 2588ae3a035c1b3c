//! The JSON/HTTP load of `kvroute-bench` (`--http-clients N --http-rate R`): what a
//! non-Rust frontend and an HTTP-registered worker do to the router, plus a little
//! hostile traffic, so a soak covers the HTTP door as well as the binary ones.
//!
//! Each client thread registers its own worker (`bench-h{c}`), then, paced to its share
//! of `--http-rate`, on one keep-alive connection:
//! - posts a `stored` JSON event batch for its worker (and a `removed` batch for its
//!   oldest one once it holds `HTTP_WORKER_BLOCKS`, so its index share stays bounded);
//! - routes a request over its own blocks (`POST /v1/route`) and finishes it;
//! - every `GARBAGE_EVERY`-th iteration, posts a malformed JSON body, which must be
//!   answered 400 (anything else counts as an error).
//!
//! Counted: operations answered, errors by kind (HTTP status or transport error), and
//! lost routes (a route whose connection failed before an answer). Bounded: every loop
//! stops at the shared stop flag; every call has a timeout.

use crate::Args;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Blocks one HTTP client's worker keeps indexed.
const HTTP_WORKER_BLOCKS: usize = 4_096;
/// Blocks per stored batch and per routed request.
const BATCH: u64 = 32;
/// One malformed body per this many iterations.
const GARBAGE_EVERY: u64 = 50;

/// What one HTTP client measured.
#[derive(Default)]
pub struct HttpResult {
    /// Answered calls (events, routes, finishes, refused garbage).
    pub ops: u64,
    pub routes: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub lost: u64,
}

impl HttpResult {
    fn error(&mut self, kind: String) {
        self.errors += 1;
        *self
            .errors_by_kind
            .entry(format!("http:{kind}"))
            .or_insert(0) += 1;
    }
}

fn mix(x: u64) -> u64 {
    kvroute::index::mix(x ^ 0x4848_4848)
}

/// One call: `Ok(status)` when the router answered, `Err(kind)` on a transport error.
fn call(agent: &ureq::Agent, method: &str, url: &str, body: Option<&str>) -> Result<u16, String> {
    let req = agent
        .request(method, url)
        .set("content-type", "application/json");
    let r = match body {
        Some(b) => req.send_string(b),
        None => req.call(),
    };
    match r {
        Ok(resp) => {
            let status = resp.status();
            // Drain the body so the keep-alive connection is reused.
            let _ = resp.into_string();
            Ok(status)
        }
        Err(ureq::Error::Status(status, resp)) => {
            let _ = resp.into_string();
            Ok(status)
        }
        Err(ureq::Error::Transport(t)) => Err(t.kind().to_string()),
    }
}

/// Runs one HTTP client until `stop`.
pub fn client(args: &Args, http: &str, c: usize, stop: &AtomicBool) -> HttpResult {
    let mut out = HttpResult::default();
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let base = format!("http://{http}");
    let worker = format!("bench-h{c}");
    let spec = json!({"id": worker, "capacity_blocks": HTTP_WORKER_BLOCKS * 2});
    match call(
        &agent,
        "POST",
        &format!("{base}/v1/workers"),
        Some(&spec.to_string()),
    ) {
        Ok(200 | 201) => {}
        Ok(s) => out.error(s.to_string()),
        Err(e) => out.error(e),
    }
    let per_client = args.http_rate as f64 / args.http_clients.max(1) as f64;
    let interval = Duration::from_secs_f64(1.0 / per_client.max(0.001));
    let mut next = Instant::now() + interval.mul_f64((c as f64 * 0.37) % 1.0);
    let mut live: VecDeque<Vec<u64>> = VecDeque::new();
    let mut i = 0u64;
    let events_url = format!("{base}/v1/workers/{worker}/events");
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += interval;
        let batch: Vec<u64> = (0..BATCH)
            .map(|b| mix(((c as u64) << 40) ^ (i << 8) ^ b))
            .collect();
        let mut events = vec![json!({"type": "stored", "tier": "device", "parent": null,
                                     "block_hashes": batch})];
        live.push_back(batch.clone());
        if live.len() * BATCH as usize > HTTP_WORKER_BLOCKS {
            if let Some(old) = live.pop_front() {
                events.push(json!({"type": "removed", "tier": "device", "block_hashes": old}));
            }
        }
        let body = json!({ "events": events }).to_string();
        expect(
            &mut out,
            call(&agent, "POST", &events_url, Some(&body)),
            200,
        );
        let id = format!("h{c}-{i}");
        let route = json!({"request_id": id, "block_hashes": batch}).to_string();
        match call(&agent, "POST", &format!("{base}/v1/route"), Some(&route)) {
            Ok(200) => {
                out.ops += 1;
                out.routes += 1;
                let fin = format!("{base}/v1/requests/{id}/finish");
                expect(&mut out, call(&agent, "POST", &fin, Some("{}")), 200);
            }
            Ok(s) => out.error(s.to_string()),
            Err(e) => {
                out.lost += 1;
                out.error(e);
            }
        }
        if i % GARBAGE_EVERY == GARBAGE_EVERY - 1 {
            let garbage = garbage_body(i);
            expect(
                &mut out,
                call(&agent, "POST", &format!("{base}/v1/route"), Some(&garbage)),
                400,
            );
        }
        i += 1;
    }
    out
}

fn expect(out: &mut HttpResult, r: Result<u16, String>, want: u16) {
    match r {
        Ok(s) if s == want => out.ops += 1,
        Ok(s) => out.error(s.to_string()),
        Err(e) => out.error(e),
    }
}

/// A body the router must refuse with 400: cut JSON, wrong types, or an unknown mode.
fn garbage_body(i: u64) -> String {
    match (i / GARBAGE_EVERY) % 3 {
        0 => "{\"request_id\": \"x\", \"block_hashes\": [1, 2,".to_string(),
        1 => json!({"request_id": 7, "block_hashes": "nope"}).to_string(),
        _ => json!({"request_id": "g", "block_hashes": [1], "mode": "nonsense"}).to_string(),
    }
}
