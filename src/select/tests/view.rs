//! `decide_view` (fleet + loads + sparse hits, the engine's and the service's input)
//! decides exactly like `decide` over the equivalent rows, and the `kv` kernel picks a
//! minimum-cost worker.

use super::*;
use crate::config::TopologyPolicy;
use rand::{Rng, SeedableRng};

/// A random fleet: mixed roles and topologies when `disagg`, random loads and
/// liveness, every 4th worker with a reuse count, a few suspect.
fn random_fleet(n: usize, disagg: bool, seed: u64) -> Vec<W> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let mut w = W::new(&format!("w{i}"))
                .topo(["a", "b", ""][i % 3])
                .cap(2_000)
                .unique(f64::from(rng.random_range(0..1_500u32)))
                .total(f64::from(rng.random_range(0..2_000u32)))
                .queued(f64::from(rng.random_range(0..3u32) * 512))
                .output(f64::from(rng.random_range(0..20u32)))
                .active(rng.random_range(0..9));
            if rng.random_bool(0.5) {
                w = w.ov(Overlap {
                    device: rng.random_range(0..12),
                    host: rng.random_range(0..3),
                    disk: rng.random_range(0..2),
                    shared: 1,
                });
            } else {
                w.overlap.shared = 1;
            }
            if i % 4 == 0 {
                w = w.reuse(rng.random_range(1..6));
            }
            if rng.random_bool(0.1) {
                w = w.dead();
            }
            if rng.random_bool(0.1) {
                w = w.suspect();
            }
            if disagg {
                w = w.role([Role::Prefill, Role::Decode, Role::Aggregated][i % 3]);
            }
            // Two seeds in three mix worker speeds (CPU workers, declared throughputs);
            // the rest keep an all-GPU fleet (the kernel's uniform-speed path).
            if !seed.is_multiple_of(3) && i % 5 == 1 {
                w = w.cpu();
            }
            if seed % 3 == 2 && i % 7 == 3 {
                w.spec.throughput_weight = Some([0.25, 1.5, 4.0][i % 3]);
            }
            w
        })
        .collect()
}

/// The same decision through `decide_view`, with slots `10 + position` and the
/// overlaps given as base (shared run 1) plus sparse hits.
fn decide_via_view(case: &Case, ws: &[W], seed: u64) -> Result<Decision, RouteError> {
    let specs: Vec<(u16, &crate::types::WorkerSpec)> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| (10 + i as u16, &w.spec))
        .collect();
    let fleet = Fleet::with_slots(specs.iter().copied());
    let mut loads = Loads::new(&fleet);
    let mut hits = Hits::default();
    let base = Overlap {
        shared: 1,
        ..Overlap::default()
    };
    hits.begin(&fleet, base);
    for (i, w) in ws.iter().enumerate() {
        let slot = 10 + i as u16;
        loads.set_live(slot, w.live);
        loads.set_suspect(slot, w.suspect);
        loads.set_load(slot, &w.load, w.unique);
        if w.overlap != base {
            hits.set_overlap(&fleet, slot, &w.overlap);
        }
        // Reuse arrives in two parts, as from two shards.
        if w.reuse > 0 {
            hits.add_reuse(&fleet, slot, 1);
            hits.add_reuse(&fleet, slot, w.reuse - 1);
        }
    }
    let input = ViewInput {
        cfg: &case.cfg,
        mode: case.mode,
        req: case.req,
        filters: &case.filters,
        fleet: &fleet,
        loads: &loads,
        hits: &hits,
        prefill_failed: case.prefill_failed,
        explain: case.explain,
    };
    let mut scratch = Scratch::default();
    let mut rng = SmallRng::seed_from_u64(seed);
    // Twice with the same scratch: its buffers must not leak between decisions (its
    // routed counts are state on purpose, `balance_routed_min_ties`: forgotten here,
    // since `decide` over rows has none).
    let _ = decide_view(
        &input,
        &mut SmallRng::seed_from_u64(seed + 1),
        &mut RrState::default(),
        &mut scratch,
    );
    scratch.forget_routed();
    decide_view(&input, &mut rng, &mut RrState::default(), &mut scratch)
}

/// Slots of a decision shifted back by 10.
fn unshift(mut d: Decision) -> Decision {
    d.decode_worker -= 10;
    d.prefill_worker = d.prefill_worker.map(|p| p - 10);
    for c in &mut d.candidates {
        c.worker -= 10;
    }
    for r in &mut d.rejected {
        r.worker -= 10;
    }
    d
}

#[test]
fn view_decides_like_rows() {
    for seed in 0..40u64 {
        let disagg = seed % 2 == 1;
        let ws = random_fleet(3 + seed as usize * 7, disagg, seed);
        let t = [0.0, 0.0, 0.7][seed as usize % 3];
        let mut case = Case::new().req(1_280 + 64 * seed as u32).cfg(|c| {
            c.router_temperature = t;
            c.busy_threshold = (seed % 4 == 0).then_some(0.9);
            c.topology_policy = [
                TopologyPolicy::None,
                TopologyPolicy::Restrict,
                TopologyPolicy::Prefer,
            ][seed as usize % 3];
            c.topology_penalty = 3.0;
            c.assume_device_reuse = seed % 4 == 1;
            c.weigh_by_throughput = seed % 7 != 6;
        });
        if seed % 5 == 0 {
            case = case.explain();
        }
        let rows = case.decide_with(
            &ws,
            &mut SmallRng::seed_from_u64(seed),
            &mut RrState::default(),
        );
        let view = decide_via_view(&case, &ws, seed).map(unshift);
        assert_eq!(rows, view, "seed {seed}");
    }
}

#[test]
fn kernel_picks_a_minimum_cost_worker() {
    for seed in 0..30u64 {
        let ws = random_fleet(1 + seed as usize * 37, false, seed);
        let slack = [0.0, 0.05][seed as usize % 2];
        let case = Case::new().req(2_048).cfg(|c| c.balance_slack = slack);
        let Ok(d) = case.decide_with(
            &ws,
            &mut SmallRng::seed_from_u64(seed),
            &mut RrState::default(),
        ) else {
            assert!(ws.iter().all(|w| !w.live), "seed {seed}");
            continue;
        };
        let best = ws
            .iter()
            .filter(|w| w.live)
            .map(|w| terms(&case.cfg, case.req, w).cost)
            .fold(f64::INFINITY, f64::min);
        let chosen = terms(&case.cfg, case.req, &ws[d.decode_worker as usize]).cost;
        assert!(
            chosen <= best + (1e-9f64).max(slack * best),
            "seed {seed}: {chosen} vs {best}"
        );
        assert_eq!(d.cost, chosen);
    }
}
