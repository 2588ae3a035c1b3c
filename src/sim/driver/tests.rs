//! Tests of the offline driver against test-double routers that check every call.

use super::*;
use crate::sim::bound::hit_rate_bound;
use crate::sim::trace::{read_mooncake, TraceOptions};
use std::collections::{HashMap as StdMap, HashSet};
use std::path::Path;

#[derive(Default)]
struct Life {
    first: bool,
    progress: u32,
    finished: bool,
}

/// Round-robin over aggregated workers (or prefill and decode pools when the fleet has
/// them). Mirrors every worker's cache from the events and rejects any call that breaks
/// the protocol, so a passing run proves the driver forwarded things exactly.
#[derive(Default)]
struct RoundRobinRouter {
    agg: Vec<String>,
    prefill: Vec<String>,
    decode: Vec<String>,
    capacity: StdMap<String, u64>,
    next: usize,
    mirror: StdMap<String, HashSet<u64>>,
    life: StdMap<String, Life>,
    /// Prefer the worker whose mirrored cache holds the longest prefix.
    prefix_affinity: bool,
    fail_every: Option<usize>,
    routed: usize,
    removed: usize,
}

impl RoundRobinRouter {
    fn pick(&self, pool: &[String], q: &RouteQuery) -> String {
        let rr = pool[self.next % pool.len()].clone();
        if !self.prefix_affinity {
            return rr;
        }
        let overlap = |w: &String| {
            let m = &self.mirror[w];
            q.hashes.iter().take_while(|h| m.contains(h)).count()
        };
        let best = pool.iter().map(overlap).max().unwrap_or(0);
        if best == 0 || overlap(&rr) == best {
            return rr;
        }
        pool.iter().find(|w| overlap(w) == best).unwrap().clone()
    }
}

impl RouterApi for RoundRobinRouter {
    fn register(&mut self, spec: &WorkerSpec) -> Result<(), String> {
        match spec.role {
            Role::Prefill => self.prefill.push(spec.id.clone()),
            Role::Decode => self.decode.push(spec.id.clone()),
            _ => self.agg.push(spec.id.clone()),
        }
        self.capacity.insert(spec.id.clone(), spec.capacity_blocks);
        self.mirror.insert(spec.id.clone(), HashSet::new());
        Ok(())
    }
    fn stored(&mut self, worker: &str, parent: Option<u64>, hashes: &[u64]) -> Result<(), String> {
        let m = self.mirror.get_mut(worker).ok_or("unknown worker")?;
        if parent.is_some_and(|p| !m.contains(&p)) {
            return Err("parent not stored".into());
        }
        for h in hashes {
            if !m.insert(*h) {
                return Err(format!("{h} stored twice"));
            }
        }
        if m.len() as u64 > self.capacity[worker] {
            return Err("more blocks than capacity".into());
        }
        Ok(())
    }
    fn removed(&mut self, worker: &str, hashes: &[u64]) -> Result<(), String> {
        let m = self.mirror.get_mut(worker).ok_or("unknown worker")?;
        for h in hashes {
            if !m.remove(h) {
                return Err(format!("{h} removed but not stored"));
            }
        }
        self.removed += hashes.len();
        Ok(())
    }
    fn route(&mut self, q: &RouteQuery, _now: u64) -> Result<Routed, String> {
        self.routed += 1;
        if self
            .fail_every
            .is_some_and(|n| self.routed.is_multiple_of(n))
        {
            return Err("injected failure".into());
        }
        if self.life.insert(q.id.clone(), Life::default()).is_some() {
            return Err("routed twice".into());
        }
        let r = if self.prefill.is_empty() {
            Routed {
                worker: self.pick(&self.agg, q),
                prefill_worker: None,
            }
        } else {
            Routed {
                worker: self.pick(&self.decode, q),
                prefill_worker: Some(self.pick(&self.prefill, q)),
            }
        };
        self.next += 1;
        Ok(r)
    }
    fn first_token(&mut self, id: &str, _now: u64) -> Result<(), String> {
        let l = self.life.get_mut(id).ok_or("unknown request")?;
        if l.first {
            return Err("first token twice".into());
        }
        l.first = true;
        Ok(())
    }
    fn progress(&mut self, id: &str, n: u32, _now: u64) -> Result<(), String> {
        let l = self.life.get_mut(id).ok_or("unknown request")?;
        if !l.first || l.finished || n <= l.progress {
            return Err("progress out of order".into());
        }
        l.progress = n;
        Ok(())
    }
    fn finish(&mut self, id: &str, _now: u64) -> Result<(), String> {
        let l = self.life.get_mut(id).ok_or("unknown request")?;
        if !l.first || l.finished {
            return Err("finish out of order".into());
        }
        l.finished = true;
        Ok(())
    }
}

fn slice(n: usize) -> Vec<SimRequest> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mooncake_slice.jsonl");
    let opts = TraceOptions {
        limit: Some(n),
        ..Default::default()
    };
    read_mooncake(&path, &opts).unwrap()
}

fn jittered(mut f: FleetSpec) -> FleetSpec {
    f.timing.jitter = 0.1;
    f
}

#[test]
fn round_robin_completes_every_request_deterministically() {
    let reqs = slice(120);
    let fleet = jittered(FleetSpec::uniform(3, 2_000));
    let run = |seed| {
        let mut rr = RoundRobinRouter::default();
        let rep = run_offline(&mut rr, &fleet, &reqs, Mode::RoundRobin, seed).unwrap();
        assert!(rr.life.values().all(|l| l.finished));
        rep
    };
    let rep = run(42);
    assert_eq!(rep.errors, 0, "{:?}", rep.error_samples);
    assert_eq!((rep.requests, rep.finished), (120, 120));
    assert_eq!(rep.imbalance, 1.0, "120 requests over 3 workers");
    assert!(rep.events > 0 && rep.ttft_us.p50 > 0.0);
    assert!(rep.ttft_us.p50 <= rep.ttft_us.p90 && rep.ttft_us.p90 <= rep.ttft_us.p99);
    assert!(rep.e2e_us.p50 >= rep.ttft_us.p50);
    let bound = hit_rate_bound(&reqs, 128).ratio;
    assert!(rep.hit_rate > 0.0 && rep.hit_rate <= bound + 1e-12);
    assert_eq!(run(42), rep, "same seed, same report");
    assert_ne!(run(43).ttft_us, rep.ttft_us, "seed drives the jitter");
}

#[test]
fn evictions_are_mirrored_and_affinity_beats_round_robin() {
    let reqs = slice(500);
    // Small caches force evictions; the router rejects any event it cannot apply.
    let fleet = FleetSpec::uniform(4, 3_000);
    let mut rr = RoundRobinRouter::default();
    let base = run_offline(&mut rr, &fleet, &reqs, Mode::RoundRobin, 1).unwrap();
    assert_eq!(base.errors, 0, "{:?}", base.error_samples);
    assert_eq!(base.finished, 500);
    assert!(rr.removed > 1_000, "evictions happened: {}", rr.removed);
    let mut aff = RoundRobinRouter {
        prefix_affinity: true,
        ..Default::default()
    };
    let kv = run_offline(&mut aff, &fleet, &reqs, Mode::Kv, 1).unwrap();
    assert_eq!((kv.errors, kv.finished), (0, 500));
    assert!(
        kv.hit_rate > base.hit_rate,
        "affinity {} vs round-robin {}",
        kv.hit_rate,
        base.hit_rate
    );
    assert!(kv.hit_rate <= hit_rate_bound(&reqs, 128).ratio);
    eprintln!("{}", crate::sim::report::table(&[base, kv]));
}

#[test]
fn disaggregated_requests_prefill_then_decode() {
    let reqs = slice(60);
    let mut fleet = FleetSpec::uniform(4, 5_000);
    fleet.workers[0].role = Role::Prefill;
    fleet.workers[1].role = Role::Prefill;
    fleet.workers[2].role = Role::Decode;
    fleet.workers[3].role = Role::Decode;
    let mut rr = RoundRobinRouter::default();
    let rep = run_offline(&mut rr, &fleet, &reqs, Mode::Kv, 7).unwrap();
    assert_eq!(rep.errors, 0, "{:?}", rep.error_samples);
    assert_eq!(rep.finished, 60);
    let jobs: Vec<u64> = rep.jobs_per_worker.iter().map(|w| w.jobs).collect();
    // Single-token requests end on the prefill worker and never reach decode.
    let multi = reqs.iter().filter(|r| r.output_tokens > 1).count() as u64;
    assert!(multi < 60, "the slice has a single-token request");
    assert_eq!(jobs[0] + jobs[1], 60);
    assert_eq!(jobs[2] + jobs[3], multi);
    // Each hand-off moved its prompt's blocks.
    assert_eq!(rep.remote_prefills, multi);
    let blocks: usize = reqs
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| r.hashes.len())
        .sum();
    assert_eq!(rep.transferred_blocks, blocks as u64);
    // Decode workers received the KV: their mirrors hold prompt blocks too.
    assert!(!rr.mirror["w2"].is_empty() && !rr.mirror["w3"].is_empty());
    assert!(
        rep.hit_rate > 0.0,
        "prefill workers reuse the shared first hash id"
    );
}

#[test]
fn router_failures_are_counted_not_fatal() {
    let reqs = slice(30);
    let fleet = FleetSpec::uniform(2, 10_000);
    let mut rr = RoundRobinRouter {
        fail_every: Some(5),
        ..Default::default()
    };
    let rep = run_offline(&mut rr, &fleet, &reqs, Mode::RoundRobin, 0).unwrap();
    assert_eq!((rep.requests, rep.finished, rep.errors), (30, 24, 6));
    assert!(rep.error_samples[0].contains("injected failure"));

    struct Bad;
    impl RouterApi for Bad {
        fn register(&mut self, _: &WorkerSpec) -> Result<(), String> {
            Ok(())
        }
        fn stored(&mut self, _: &str, _: Option<u64>, _: &[u64]) -> Result<(), String> {
            Ok(())
        }
        fn removed(&mut self, _: &str, _: &[u64]) -> Result<(), String> {
            Ok(())
        }
        fn route(&mut self, _: &RouteQuery, _: u64) -> Result<Routed, String> {
            Ok(Routed {
                worker: "ghost".into(),
                prefill_worker: None,
            })
        }
        fn first_token(&mut self, _: &str, _: u64) -> Result<(), String> {
            Ok(())
        }
        fn progress(&mut self, _: &str, _: u32, _: u64) -> Result<(), String> {
            Ok(())
        }
        fn finish(&mut self, _: &str, _: u64) -> Result<(), String> {
            Ok(())
        }
    }
    let rep = run_offline(&mut Bad, &fleet, &reqs, Mode::Direct, 0).unwrap();
    assert_eq!((rep.finished, rep.errors), (0, 30));
    assert!(rep.error_samples[0].contains("unknown worker ghost"));
}

#[test]
fn invalid_fleets_are_rejected() {
    let mut rr = RoundRobinRouter::default();
    let empty = FleetSpec::uniform(0, 10);
    assert!(run_offline(&mut rr, &empty, &[], Mode::Kv, 0).is_err());
    let mut dup = FleetSpec::uniform(2, 10);
    dup.workers[1].id = "w0".into();
    assert!(dup.validate().unwrap_err().contains("duplicate"));
    let mut shared = FleetSpec::uniform(1, 10);
    shared.workers[0].role = Role::Shared;
    assert!(shared.validate().is_err());
    let mut zero = FleetSpec::uniform(1, 10);
    zero.block_size = 0;
    assert!(zero.validate().is_err());
    let toml_fleet: FleetSpec = toml::from_str(
        "block_size = 64\n[[workers]]\nid = \"g0\"\n[[workers]]\nid = \"c0\"\ndevice = \"cpu\"\ncapacity_blocks = 100\n",
    )
    .unwrap();
    toml_fleet.validate().unwrap();
    assert_eq!(toml_fleet.workers[1].device, DeviceClass::Cpu);
    assert_eq!(toml_fleet.timing, TimingModel::default());
}

#[test]
fn timed_router_measures_route_calls_with_the_given_clock() {
    let reqs = slice(10);
    let fleet = FleetSpec::uniform(2, 10_000);
    let mut ticks = 0u64;
    let clock = move || {
        ticks += 1_500;
        ticks
    };
    let mut timed = TimedRouter::new(RoundRobinRouter::default(), clock);
    let mut rep = run_offline(&mut timed, &fleet, &reqs, Mode::RoundRobin, 0).unwrap();
    assert_eq!(timed.latencies_us(), &[1.5; 10]);
    rep.set_decision_latencies(timed.latencies_us());
    assert_eq!(rep.decision_us.map(|d| d.p99), Some(1.5));
    assert!(timed.inner.life.values().all(|l| l.finished));
}

/// Whole conversation trace on 16 workers, round-robin vs prefix affinity. Ignored by
/// default (the trace is not in the repository; `KVROUTE_MOONCAKE_TRACE` points at it).
#[test]
#[ignore]
fn full_trace_offline() {
    let path = crate::sim::trace::full_trace_path();
    let reqs = read_mooncake(Path::new(&path), &TraceOptions::default()).unwrap();
    let fleet = FleetSpec::uniform(16, 20_000);
    let mut rr = RoundRobinRouter::default();
    let base = run_offline(&mut rr, &fleet, &reqs, Mode::RoundRobin, 1).unwrap();
    let mut aff = RoundRobinRouter {
        prefix_affinity: true,
        ..Default::default()
    };
    let kv = run_offline(&mut aff, &fleet, &reqs, Mode::Kv, 1).unwrap();
    eprintln!("bound {:?}", hit_rate_bound(&reqs, 128));
    eprintln!("{}", crate::sim::report::table(&[base.clone(), kv.clone()]));
    for r in [&base, &kv] {
        assert_eq!((r.errors, r.finished), (0, reqs.len() as u64));
    }
    assert!(kv.hit_rate > base.hit_rate);
}
