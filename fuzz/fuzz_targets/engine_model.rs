//! Fuzz target: random event / lifecycle sequences on `engine::Engine`, checked against
//! a reference model.
//!
//! The input is decoded (with `arbitrary::Unstructured`) into an engine configuration and
//! up to 256 operations over 4 worker ids (the registry holds at most 3), 6 request ids
//! and 8 block hashes: register (epoch, role, capacity), deregister, stored, removed,
//! cleared, route, first_token, progress, finish, prefill_failed, set_live, set_suspect.
//! The model is a plain map of worker → {(hash, tier)} plus request → decode worker.
//!
//! Checked after every operation:
//! - no panic; every call succeeds or fails exactly when the model says it must;
//! - the set of registered workers and each worker's `cached_blocks` equal the model's
//!   (stores past a worker's cap, counted over all shards, are refused, as documented
//!   in `index`);
//! - tracked requests equal the model's; a worker with no request decoding on it has
//!   zero `active_requests` and `decode_blocks`, one with none in prefill on it has zero
//!   `prefill_tokens`; a decision's overlap never exceeds the blocks the model holds
//!   (plus, with speculative indexing, the blocks of prompts routed to that worker).
//!
//! At the end every tracked request is finished, after which every worker's load must be
//! exactly zero (no leaked load).
#![no_main]

use arbitrary::{Result, Unstructured};
use kvroute::config::{Mode, PrefillLoadModel, RouterConfig};
use kvroute::engine::{Engine, EngineError, EngineLimits, KvEvent, RouteDecision, RouteRequest};
use kvroute::index::shard_of;
use kvroute::registry::RegistryError;
use kvroute::types::{Role, Tier, WorkerSpec};
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};

const WORKERS: [&str; 4] = ["w0", "w1", "w2", "w3"];
const REQUESTS: [&str; 6] = ["r0", "r1", "r2", "r3", "r4", "r5"];
const HASHES: [u64; 8] = [11, 22, 33, 44, 55, 66, 0x9e37_79b9_7f4a_7c15, u64::MAX];
const MAX_WORKERS: usize = 3;
const MAX_HASHES: usize = 8;
const BLOCK_SIZE: u32 = 4;

#[derive(Debug)]
struct ModelWorker {
    epoch: u64,
    /// Total cap (capacity clamped by the engine limit).
    cap: u64,
    blocks: BTreeSet<(u64, u8)>,
    /// Every block of a prompt routed to this worker since it registered (or since its
    /// epoch changed): a superset of the blocks speculative indexing may credit to it
    /// before its events confirm them (`index::pending`).
    routed: BTreeSet<u64>,
}

#[derive(Debug)]
struct ModelReq {
    decode: String,
    hashes: Vec<u64>,
    /// Worker the request is prefilling on, until its first token.
    prefill_on: Option<String>,
}

struct Model {
    shard_bits: u32,
    /// The engine's `max_blocks_per_worker`.
    max_blocks: u64,
    workers: BTreeMap<String, ModelWorker>,
    reqs: BTreeMap<String, ModelReq>,
}

impl Model {
    /// Stores as the index does: shard by shard (hashes of shard 0 first), each hash in
    /// turn, while the worker holds fewer than its cap of (hash, tier) entries over all
    /// shards (`ShardedIndex::set_worker_cap` is exact).
    fn store(&mut self, id: &str, tier: u8, hashes: &[u64]) {
        let bits = self.shard_bits;
        let Some(w) = self.workers.get_mut(id) else {
            return;
        };
        for s in 0..1usize << bits {
            for &h in hashes.iter().filter(|&&h| shard_of(h, bits) == s) {
                if !w.blocks.contains(&(h, tier)) && (w.blocks.len() as u64) < w.cap {
                    w.blocks.insert((h, tier));
                }
            }
        }
    }

    /// A worker restarted or left: its blocks and the requests decoding on it are gone;
    /// requests prefilling on it stop counting there.
    fn forget(&mut self, id: &str) {
        if let Some(w) = self.workers.get_mut(id) {
            w.blocks.clear();
            w.routed.clear();
        }
        self.reqs.retain(|_, r| r.decode != id);
        for r in self.reqs.values_mut() {
            if r.prefill_on.as_deref() == Some(id) {
                r.prefill_on = None;
            }
        }
    }

    /// Longest prefix of `hashes` the worker holds in any tier, or may hold
    /// speculatively (a block of a prompt routed to it).
    fn prefix(&self, id: &str, hashes: &[u64]) -> usize {
        let Some(w) = self.workers.get(id) else {
            return 0;
        };
        hashes
            .iter()
            .take_while(|&&h| {
                w.routed.contains(&h) || (0..3u8).any(|t| w.blocks.contains(&(h, t)))
            })
            .count()
    }

    fn routed(&mut self, id: &str, d: &RouteDecision, hashes: &[u64]) {
        assert!(self.workers.contains_key(&d.decode_worker), "{d:?}");
        let mut bound = self.prefix(&d.decode_worker, hashes);
        if let Some(p) = &d.prefill_worker {
            assert!(self.workers.contains_key(p), "{d:?}");
            bound = bound.max(self.prefix(p, hashes));
        }
        assert!(
            d.overlap.own() as usize <= bound,
            "overlap {:?} > {bound} blocks held",
            d.overlap
        );
        let prefill_on = d.prefill_worker.clone().unwrap_or(d.decode_worker.clone());
        for w in [Some(&d.decode_worker), d.prefill_worker.as_ref()]
            .into_iter()
            .flatten()
        {
            if let Some(mw) = self.workers.get_mut(w) {
                mw.routed.extend(hashes.iter().copied());
            }
        }
        self.reqs.insert(
            id.to_string(),
            ModelReq {
                decode: d.decode_worker.clone(),
                hashes: hashes.to_vec(),
                prefill_on: Some(prefill_on),
            },
        );
    }
}

fn pick<'a, T>(u: &mut Unstructured, xs: &'a [T]) -> Result<&'a T> {
    u.choose(xs)
}

fn hashes(u: &mut Unstructured) -> Result<Vec<u64>> {
    let n = u.int_in_range(0..=5)?;
    (0..n).map(|_| pick(u, &HASHES).copied()).collect()
}

fn tier(u: &mut Unstructured) -> Result<Tier> {
    pick(u, &Tier::ALL).copied()
}

fn engine(u: &mut Unstructured) -> Result<(Engine, Model)> {
    let shard_bits = u.int_in_range(0..=2)?;
    let cfg = RouterConfig {
        block_size: BLOCK_SIZE,
        mode: *pick(u, &Mode::ALL)?,
        assume_kv_reuse: u.arbitrary()?,
        track_output_blocks: u.arbitrary()?,
        prefill_load_model: *pick(u, &[PrefillLoadModel::Full, PrefillLoadModel::Predicted])?,
        router_temperature: *pick(u, &[0.0, 0.5])?,
        predictor_min_samples: 2,
        speculative_ttl_ms: *pick(u, &[0, 2_000])?,
        ..RouterConfig::default()
    };
    let limits = EngineLimits {
        max_workers: MAX_WORKERS,
        max_blocks_per_worker: *pick(u, &[2, 5, 1 << 20])?,
        max_hashes_per_request: MAX_HASHES,
    };
    let seed = u.arbitrary()?;
    let e = Engine::new(cfg, shard_bits, limits, seed).expect("valid config");
    let m = Model {
        shard_bits,
        max_blocks: limits.max_blocks_per_worker,
        workers: BTreeMap::new(),
        reqs: BTreeMap::new(),
    };
    Ok((e, m))
}

fn step(u: &mut Unstructured, e: &mut Engine, m: &mut Model, now: &mut u64) -> Result<()> {
    *now += u.int_in_range(0..=5_000)?;
    let now = *now;
    let w = *pick(u, &WORKERS)?;
    let r = *pick(u, &REQUESTS)?;
    let known_w = m.workers.contains_key(w);
    let known_r = m.reqs.contains_key(r);
    match u.int_in_range(0..=11)? {
        0 => {
            let mut spec = WorkerSpec::new(w);
            spec.epoch = u.int_in_range(0..=2)?;
            spec.role = *pick(
                u,
                &[Role::Aggregated, Role::Prefill, Role::Decode, Role::Shared],
            )?;
            spec.capacity_blocks = *pick(u, &[1, 3, 1 << 20])?;
            let cap = spec.capacity_blocks.min(m.max_blocks);
            let epoch = spec.epoch;
            let res = e.register(spec);
            if !known_w && m.workers.len() >= MAX_WORKERS {
                assert!(
                    matches!(res, Err(EngineError::Registry(RegistryError::Full(_)))),
                    "{res:?}"
                );
                return Ok(());
            }
            assert!(res.is_ok(), "{res:?}");
            let new_epoch = m.workers.get(w).is_some_and(|mw| mw.epoch != epoch);
            if new_epoch {
                m.forget(w);
            }
            let mw = m.workers.entry(w.to_string()).or_insert(ModelWorker {
                epoch,
                cap,
                blocks: BTreeSet::new(),
                routed: BTreeSet::new(),
            });
            mw.epoch = epoch;
            mw.cap = cap;
        }
        1 => {
            let res = e.deregister(w);
            if known_w {
                assert_eq!(res, Ok(()));
                m.forget(w);
                m.workers.remove(w);
            } else {
                assert_eq!(res, Err(EngineError::UnknownWorker(w.into())));
            }
        }
        op @ 2..=4 => {
            let t = tier(u)?;
            let hs = hashes(u)?;
            let ev = match op {
                2 => KvEvent::Stored {
                    tier: t,
                    parent: None,
                    block_hashes: hs.clone(),
                },
                3 => KvEvent::Removed {
                    tier: t,
                    block_hashes: hs.clone(),
                },
                _ => KvEvent::Cleared {
                    tier: if u.arbitrary()? { Some(t) } else { None },
                },
            };
            let res = e.apply(w, &ev);
            if !known_w {
                assert_eq!(res, Err(EngineError::UnknownWorker(w.into())));
                return Ok(());
            }
            assert_eq!(res, Ok(()));
            let mw = m.workers.get_mut(w).expect("known");
            match ev {
                KvEvent::Stored { .. } => m.store(w, t as u8, &hs),
                KvEvent::Removed { .. } => {
                    for h in hs {
                        mw.blocks.remove(&(h, t as u8));
                    }
                }
                KvEvent::Cleared { tier: Some(t) } => mw.blocks.retain(|b| b.1 != t as u8),
                KvEvent::Cleared { tier: None } => mw.blocks.clear(),
            }
        }
        5 => {
            let hs = hashes(u)?;
            let req = RouteRequest {
                request_id: r.into(),
                block_hashes: Some(hs.clone()),
                input_tokens: if u.arbitrary()? {
                    Some(hs.len() as u32 * BLOCK_SIZE + u.int_in_range(0..=7)?)
                } else {
                    None
                },
                expected_output_tokens: u.arbitrary::<Option<u8>>()?.map(u32::from),
                pin: if u.ratio(1, 4)? { Some(w.into()) } else { None },
                mode: if u.ratio(1, 3)? {
                    Some(*pick(u, &Mode::ALL)?)
                } else {
                    None
                },
                explain: u.arbitrary()?,
                ..RouteRequest::default()
            };
            let res = e.route(&req, now);
            match res {
                Ok(d) => {
                    assert!(!known_r, "duplicate request routed: {d:?}");
                    assert_eq!(d.request_id, r);
                    m.routed(r, &d, &hs);
                }
                Err(EngineError::Duplicate(_)) => assert!(known_r),
                Err(EngineError::Route(_)) => assert!(!known_r),
                Err(other) => panic!("unexpected route error {other:?}"),
            }
        }
        op @ 6..=8 => {
            let tokens = u.int_in_range(0..=40)?;
            let res = match op {
                6 => e.first_token(r, now),
                7 => e.progress(r, tokens, now),
                _ => e.finish(r, now),
            };
            if !known_r {
                assert_eq!(res, Err(EngineError::UnknownRequest(r.into())));
                return Ok(());
            }
            assert_eq!(res, Ok(()));
            if op == 8 {
                m.reqs.remove(r);
            } else if op == 6 || tokens > 0 {
                // First token (progress > 0 implies it; progress 0 carries nothing).
                m.reqs.get_mut(r).expect("known").prefill_on = None;
            }
        }
        9 => {
            let res = e.prefill_failed(r, now);
            if !known_r {
                assert_eq!(res, Err(EngineError::UnknownRequest(r.into())));
                return Ok(());
            }
            // The request leaves the tracker; a decode-only decision routes it again.
            let old = m.reqs.remove(r).expect("known");
            if let Ok(d) = res {
                m.routed(r, &d, &old.hashes);
                assert!(d.prefill_worker.is_none(), "{d:?}");
            }
        }
        op => {
            let flag = u.arbitrary()?;
            let res = if op == 10 {
                e.set_live(w, flag)
            } else {
                e.set_suspect(w, flag)
            };
            if known_w {
                assert_eq!(res, Ok(()));
            } else {
                assert_eq!(res, Err(EngineError::UnknownWorker(w.into())));
            }
        }
    }
    Ok(())
}

/// Engine state equals the model's.
fn check(e: &Engine, m: &Model, now: u64) {
    assert_eq!(e.active_requests(), m.reqs.len(), "tracked requests");
    let ws = e.workers(now);
    let ids: BTreeSet<&str> = ws.iter().map(|s| s.id.as_str()).collect();
    let want: BTreeSet<&str> = m.workers.keys().map(|s| s.as_str()).collect();
    assert_eq!(ids, want, "registered workers");
    for s in &ws {
        let mw = &m.workers[&s.id];
        assert_eq!(
            s.cached_blocks,
            mw.blocks.len() as u64,
            "cached blocks of {}",
            s.id
        );
        assert_eq!(s.epoch, mw.epoch);
        let decoding = m.reqs.values().filter(|r| r.decode == s.id).count();
        assert_eq!(
            s.active_requests as usize, decoding,
            "active requests of {}",
            s.id
        );
        if decoding == 0 {
            assert_eq!(s.decode_blocks, 0.0, "leaked decode blocks on {}", s.id);
        }
        let prefilling = m
            .reqs
            .values()
            .any(|r| r.prefill_on.as_deref() == Some(s.id.as_str()));
        if !prefilling {
            assert_eq!(s.prefill_tokens, 0.0, "leaked prefill tokens on {}", s.id);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok((mut e, mut m)) = engine(&mut u) else {
        return;
    };
    let mut now = 1_000u64;
    for _ in 0..256 {
        if u.is_empty() || step(&mut u, &mut e, &mut m, &mut now).is_err() {
            break;
        }
        check(&e, &m, now);
    }
    // Finish everything still tracked: afterwards no worker may carry any load.
    let ids: Vec<String> = m.reqs.keys().cloned().collect();
    for id in ids {
        assert_eq!(e.finish(&id, now), Ok(()), "finish {id}");
        m.reqs.remove(&id);
    }
    check(&e, &m, now);
    for s in e.workers(now) {
        assert_eq!(s.active_requests, 0, "{s:?}");
        assert_eq!(s.prefill_tokens, 0.0, "{s:?}");
        assert_eq!(s.decode_blocks, 0.0, "{s:?}");
    }
});
