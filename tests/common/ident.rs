//! Helpers of `tests/identity_hardening.rs`: bounded
//! child waits, maximum-size specs, HTTP calls with a bearer token, and stores that
//! wait until the shards have applied (or refused) every hash.

use super::Server;
use std::time::{Duration, Instant};

/// Waits for a child to exit (bounded); kills it and fails if it does not.
pub fn wait_exit(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops a child router however the test ends.
pub struct Stop(pub std::process::Child);

impl Drop for Stop {
    fn drop(&mut self) {
        kvroute::process::terminate(&mut self.0, Duration::from_secs(10));
    }
}

/// A worker spec at every documented maximum (id 128 bytes, model and topology 256,
/// 64 taints of 128 bytes).
pub fn max_spec(i: usize) -> kvroute::types::WorkerSpec {
    let mut s = kvroute::types::WorkerSpec::new(format!("{:0<128}", format!("w{i}-")));
    s.model = "m".repeat(256);
    s.topology = "t".repeat(256);
    s.taints = (0..64)
        .map(|k| format!("{:z<128}", format!("{k}-")))
        .collect();
    s.capacity_blocks = 1000;
    s
}

pub fn spec_json(sp: &kvroute::types::WorkerSpec) -> serde_json::Value {
    serde_json::to_value(sp).unwrap()
}

pub fn call(method: &str, url: &str, token: &str, body: Option<serde_json::Value>) -> u16 {
    let r = ureq::request(method, url).set("Authorization", &format!("Bearer {token}"));
    let res = match body {
        Some(b) => r.send_json(b),
        None => r.call(),
    };
    match res {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("{method} {url}: {e}"),
    }
}

/// Stores `hashes` for `worker` over HTTP and waits until the shards applied them
/// (the refused-store counter plus the cached count account for every hash).
pub fn store_and_settle(s: &Server, worker: &str, hashes: &[u64]) {
    let before = cached_total(s) + refused(s, "worker_limit") + refused(s, "index_budget");
    s.store(worker, "device", hashes);
    let want = before + hashes.len() as f64;
    s.wait_until("store applied", |s| {
        cached_total(s) + refused(s, "worker_limit") + refused(s, "index_budget") >= want
    });
}

pub fn cached_total(s: &Server) -> f64 {
    s.workers()
        .iter()
        .filter_map(|w| w["cached_blocks"].as_u64())
        .sum::<u64>() as f64
}

pub fn refused(s: &Server, kind: &str) -> f64 {
    s.metric(&format!("kvroute_index_refused_total{{kind=\"{kind}\"}}"))
}
