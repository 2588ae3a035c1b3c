//! `affinity_slack`: the worker a request's prefix was last routed to
//! ([`Hits::set_affinity`]) wins when its cost is within the slack of the minimum, and
//! only then; the kernel and the row-by-row path agree.

use super::*;

/// Decides once through `decide_view` with `affinity` (a slot) set on the hits;
/// returns the decode worker.
fn route(ws: &[W], case: &Case, affinity: Option<u16>, rng: &mut SmallRng) -> u16 {
    let fleet = Fleet::with_slots(ws.iter().enumerate().map(|(i, w)| (i as u16, &w.spec)));
    let mut loads = Loads::new(&fleet);
    let mut hits = Hits::default();
    hits.begin(&fleet, Overlap::default());
    for (i, w) in ws.iter().enumerate() {
        loads.set_live(i as u16, w.live);
        loads.set_load(i as u16, &w.load, w.unique);
        hits.set_overlap(&fleet, i as u16, &w.overlap);
    }
    hits.set_affinity(&fleet, affinity);
    let input = ViewInput {
        cfg: &case.cfg,
        mode: case.mode,
        req: case.req,
        filters: &case.filters,
        fleet: &fleet,
        loads: &loads,
        hits: &hits,
        prefill_failed: false,
        explain: false,
    };
    let mut rr = RrState::default();
    let mut scratch = Scratch::default();
    decide_view(&input, rng, &mut rr, &mut scratch)
        .unwrap()
        .decode_worker
}

/// Four workers whose `kv` costs (10-block prompt + held blocks) are 110, 118, 210
/// and 310: w1 is within 10 % of the minimum but outside the default 3 % slack.
fn fleet4() -> Vec<W> {
    [100.0, 108.0, 200.0, 300.0]
        .iter()
        .enumerate()
        .map(|(i, &u)| W::new(&format!("w{i}")).unique(u))
        .collect()
}

/// The case as is (kernel) and with an allow-list of every worker (row by row).
fn both(case: Case, n: usize) -> [Case; 2] {
    let all = (0..n).map(|i| format!("w{i}")).collect();
    [case.clone(), case.filters(|f| f.allow = Some(all))]
}

#[test]
fn the_affinity_worker_wins_within_its_slack_and_only_there() {
    let ws = fleet4();
    let mut rng = SmallRng::seed_from_u64(5);
    for (path, c) in both(Case::new().cfg(|c| c.affinity_slack = 0.1), 4)
        .iter()
        .enumerate()
    {
        assert_eq!(route(&ws, c, None, &mut rng), 0, "path {path}: no affinity");
        assert_eq!(
            route(&ws, c, Some(1), &mut rng),
            1,
            "path {path}: 118 <= 121"
        );
        assert_eq!(
            route(&ws, c, Some(2), &mut rng),
            0,
            "path {path}: 210 > 121"
        );
        assert_eq!(
            route(&ws, c, Some(9), &mut rng),
            0,
            "path {path}: unknown slot"
        );
    }
    // A slack of 5 %: 118 > 115.5, the cheaper worker keeps the request.
    for c in both(Case::new().cfg(|c| c.affinity_slack = 0.05), 4) {
        assert_eq!(route(&ws, &c, Some(1), &mut rng), 0);
    }
}

#[test]
fn with_no_slack_the_affinity_worker_breaks_exact_ties() {
    // Four idle workers: exact ties. Without affinity the pick is random; with it,
    // always the affinity worker.
    let ws: Vec<W> = (0..4).map(|i| W::new(&format!("w{i}"))).collect();
    let case = Case::new().cfg(|c| {
        c.affinity_slack = 0.0;
        c.balance_slack = 0.0;
    });
    let mut rng = SmallRng::seed_from_u64(1);
    for c in both(case, 4) {
        let got: Vec<u16> = (0..16).map(|_| route(&ws, &c, Some(2), &mut rng)).collect();
        assert!(got.iter().all(|&w| w == 2), "{got:?}");
        let free: std::collections::HashSet<u16> =
            (0..32).map(|_| route(&ws, &c, None, &mut rng)).collect();
        assert!(free.len() > 1, "ties are random without affinity: {free:?}");
    }
}

#[test]
fn an_ineligible_affinity_worker_is_passed_over() {
    let mut ws = fleet4();
    let mut rng = SmallRng::seed_from_u64(2);
    let case = Case::new().cfg(|c| c.affinity_slack = 0.5);
    // Filtered out by the allow-list (row path).
    let allow = case
        .clone()
        .filters(|f| f.allow = Some(vec!["w0".into(), "w2".into()]));
    assert_eq!(route(&ws, &allow, Some(1), &mut rng), 0);
    // Not live (kernel and rows).
    ws[1] = ws[1].clone().dead();
    for c in both(case, 4) {
        assert_eq!(route(&ws, &c, Some(1), &mut rng), 0);
    }
}

#[test]
fn begin_forgets_the_affinity_of_the_previous_request() {
    let ws = fleet4();
    let fleet = Fleet::with_slots(ws.iter().enumerate().map(|(i, w)| (i as u16, &w.spec)));
    let mut hits = Hits::default();
    hits.begin(&fleet, Overlap::default());
    hits.set_affinity(&fleet, Some(3));
    assert_eq!(hits.affinity(), fleet.position(3));
    hits.begin(&fleet, Overlap::default());
    assert_eq!(hits.affinity(), None);
}

#[test]
fn affinity_map_feeds_the_decision_of_a_conversations_next_turn() {
    // End to end over the pure parts: turn 1 routed to w1 (noted), turn 2 (turn 1's
    // prompt plus more) looks it up and, near-tied, stays on w1.
    let ws = fleet4();
    let mut rng = SmallRng::seed_from_u64(4);
    let map = Affinity::new(64);
    let turn1: Vec<u64> = (100..116).collect();
    map.note(&turn1, 1);
    let turn2: Vec<u64> = (100..124).collect();
    let near = map.lookup(&turn2);
    assert_eq!(near, Some(1));
    let case = Case::new().cfg(|c| c.affinity_slack = 0.1);
    assert_eq!(route(&ws, &case, near, &mut rng), 1);
}

#[test]
fn a_large_near_tie_set_goes_by_the_routed_counts_not_the_affinity() {
    // Eight idle workers: at least `balance_routed_min_ties` (6) tied, so the counts
    // (all 0: the first in turn, w0) decide and the fleet stays balanced; with the
    // count rule off (0) the tie set is taken in turn and the affinity worker wins.
    let ws: Vec<W> = (0..8).map(|i| W::new(&format!("w{i}"))).collect();
    let mut rng = SmallRng::seed_from_u64(6);
    for c in both(Case::new(), 8) {
        assert_eq!(route(&ws, &c, Some(3), &mut rng), 0);
    }
    for c in both(Case::new().cfg(|c| c.balance_routed_min_ties = 0), 8) {
        assert_eq!(route(&ws, &c, Some(3), &mut rng), 3);
    }
}

/// A worker the index sees holding more of the prompt cancels the affinity: the
/// remembered worker had the prefix routed to it, but the cache is elsewhere now.
#[test]
fn a_bigger_cache_elsewhere_cancels_the_affinity() {
    // w0 holds 6 of the 10-block prompt (cost 4); w1, the affinity worker, holds
    // none (cost 10), within the default slack (3x) of w0's.
    let ws = vec![W::new("w0").dev(6), W::new("w1")];
    let mut rng = SmallRng::seed_from_u64(5);
    for c in both(Case::new(), 2) {
        assert_eq!(route(&ws, &c, Some(1), &mut rng), 0, "the cache wins");
        assert_eq!(route(&ws, &c, Some(0), &mut rng), 0);
    }
    // Nobody holds anything: a load gap within the slack (10 against 22) does not
    // move the request away from the affinity worker.
    let ws = vec![W::new("w0"), W::new("w1").unique(12.0)];
    for c in both(Case::new(), 2) {
        assert_eq!(route(&ws, &c, Some(1), &mut rng), 1, "the affinity wins");
    }
}
