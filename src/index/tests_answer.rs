//! Property tests of the run-length answer form ([`ShardAnswer`]) and of [`merge`] over
//! it: against a per-position reference merge, and through the service's path (each
//! shard queried with its `(position, hash)` items as a core's `local_query` does, the
//! answers merged as `service::routing::router` does, including a core that did not reply).

use super::*;
use crate::types::{Overlap, Tier, WorkerSlot};
use proptest::prelude::*;
use std::collections::BTreeMap;

const SHARED: WorkerSlot = 3;

/// One position's holders, or `None`: the same as the previous position's.
type Spec = Option<Vec<(WorkerSlot, Tier)>>;

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Device), Just(Tier::Host), Just(Tier::Disk)]
}

/// Holders of one position: a few of workers 0..=3 (3 is shared) with tiers, possibly
/// none (a miss), often the same as the previous position's (`None`), so runs form.
fn holders() -> impl Strategy<Value = Spec> {
    prop_oneof![
        3 => Just(None),
        2 => prop::collection::vec((0..4u16, tier()), 0..4).prop_map(Some),
    ]
}

/// Per position: which answer (shard) owns it (`k` = nobody answers it) and its
/// holders; `k` answers.
fn layout() -> impl Strategy<Value = (usize, Vec<(usize, Spec)>)> {
    (1..4usize).prop_flat_map(|k| {
        let owner = prop_oneof![12 => 0..k, 1 => Just(k)];
        (Just(k), prop::collection::vec((owner, holders()), 0..14))
    })
}

/// The answers of a layout, built the way a shard does (stop at its first miss), and
/// the request length.
fn answers(k: usize, pos: &[(usize, Spec)]) -> Vec<ShardAnswer> {
    let mut ms: Vec<Vec<Match>> = vec![Vec::new(); k];
    let mut miss = vec![u32::MAX; k];
    let mut cur: Vec<(WorkerSlot, Tier)> = vec![(0, Tier::Device)];
    for (p, (owner, hs)) in pos.iter().enumerate() {
        if let Some(hs) = hs {
            cur = hs.clone();
        }
        if *owner >= k || miss[*owner] != u32::MAX {
            continue;
        }
        if cur.is_empty() {
            miss[*owner] = p as u32;
            continue;
        }
        for &(worker, tier) in &cur {
            ms[*owner].push(Match {
                pos: p as u32,
                worker,
                tier,
            });
        }
    }
    ms.iter()
        .zip(miss)
        .map(|(m, f)| ShardAnswer::from_matches(f, m))
        .collect()
}

/// DESIGN §1 walked position by position over the expanded matches: per worker its
/// best tier at each position below every answer's first miss.
fn reference(n: usize, answers: &[ShardAnswer], w: WorkerSlot) -> Overlap {
    let end = answers
        .iter()
        .map(|a| a.first_miss as usize)
        .fold(n, usize::min);
    let mut best: BTreeMap<(u32, WorkerSlot), Tier> = BTreeMap::new();
    for m in answers.iter().flat_map(|a| a.matches()) {
        let b = best.entry((m.pos, m.worker)).or_insert(m.tier);
        *b = (*b).min(m.tier);
    }
    let held = |p: usize, w: WorkerSlot| {
        if p >= end {
            return None;
        }
        best.get(&(p as u32, w)).copied()
    };
    let mut ov = Overlap::default();
    let mut p = 0;
    let mut phase = 0;
    if w != SHARED {
        while let Some(t) = held(p, w) {
            phase = phase.max(t as usize);
            *[&mut ov.device, &mut ov.host, &mut ov.disk][phase] += 1;
            p += 1;
        }
    }
    while held(p, SHARED).is_some() {
        ov.shared += 1;
        p += 1;
    }
    ov
}

/// The answer's documented form: positions increasing, runs tiling them, non-empty,
/// consecutive runs different, holders sorted by worker and one per worker.
fn check_form(a: &ShardAnswer) -> Result<(), TestCaseError> {
    prop_assert!(a.positions.windows(2).all(|w| w[0] < w[1]));
    prop_assert_eq!(
        a.runs.last().map_or(0, |r| r.end as usize),
        a.positions.len()
    );
    prop_assert_eq!(
        a.runs.last().map_or(0, |r| r.holders_end as usize),
        a.holders.len()
    );
    let runs: Vec<_> = a.iter_runs().collect();
    prop_assert_eq!(runs.len(), a.runs.len());
    for (i, (ps, hs)) in runs.iter().enumerate() {
        prop_assert!(!ps.is_empty() && !hs.is_empty());
        prop_assert!(hs.windows(2).all(|w| w[0].worker < w[1].worker));
        if i > 0 {
            prop_assert_ne!(runs[i - 1].1, *hs);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn run_length_answers_merge_like_the_per_position_reference((k, pos) in layout()) {
        let ans = answers(k, &pos);
        for a in &ans {
            check_form(a)?;
            let expanded: Vec<Match> = a.matches().collect();
            prop_assert_eq!(&ShardAnswer::from_matches(a.first_miss, &expanded), a);
        }
        let n = pos.len();
        let mut r = MergeResult::new();
        // Twice, so the second merge runs on a reused (stamped) result.
        for _ in 0..2 {
            merge(n, &ans, |w| w == SHARED, &mut r);
            let mut want_workers = Vec::new();
            for w in 0..6u16 {
                let want = reference(n, &ans, w);
                prop_assert_eq!(r.get(w), want, "worker {}", w);
                if w != SHARED && want.own() > 0 {
                    want_workers.push(w);
                }
            }
            prop_assert_eq!(r.workers(), &want_workers[..]);
        }
    }

    /// The service's path: every core's shard answers the positions it owns, given as
    /// `(position, hash)` items; the router merges the answers it got (one core may
    /// not reply). Must equal the one-shard index's answer, cut at the first position
    /// of a missing core.
    #[test]
    fn service_style_scatter_and_merge_matches_one_shard(
        stores in prop::collection::vec((0..4u16, tier(), 0..30u64, 1..12u64), 1..30),
        q in (0..10u64, 0..20u64).prop_map(|(s, l)| (s..s + l).collect::<Vec<u64>>()),
        bits in 1..3u32,
        drop in prop::option::of(0..4usize),
    ) {
        let mut one = ShardedIndex::new(0);
        let mut many = ShardedIndex::new(bits);
        for (w, t, s, l) in &stores {
            let hs: Vec<u64> = (*s..s + l).collect();
            one.stored(*w, *t, &hs);
            many.stored(*w, *t, &hs);
        }
        let cores = many.shard_count();
        let drop = drop.filter(|&d| d < cores);
        let mut items = vec![Vec::new(); cores];
        for (i, &h) in q.iter().enumerate() {
            items[shard_of(h, bits)].push((i as u32, h));
        }
        let mut got = Vec::new();
        for (c, it) in items.iter().enumerate() {
            if Some(c) == drop {
                continue;
            }
            let mut a = ShardAnswer::default();
            many.shards[c].query(it, &mut a);
            check_form(&a)?;
            got.push(a);
        }
        // A missing core's positions are held by nobody: the request is cut before
        // its first one.
        let cut = drop
            .and_then(|d| items[d].first().map(|&(p, _)| p as usize))
            .unwrap_or(q.len());
        let mut r = MergeResult::new();
        merge(q.len(), &got, |w| w == SHARED, &mut r);
        let mut want = MergeResult::new();
        one.query(&q[..cut], |w| w == SHARED, &mut want);
        for w in 0..5u16 {
            prop_assert_eq!(r.get(w), want.get(w), "worker {}", w);
        }
        let (mut a, mut b) = (r.workers().to_vec(), want.workers().to_vec());
        a.sort_unstable();
        b.sort_unstable();
        prop_assert_eq!(a, b);
        // And the sharded index's own scatter agrees when nothing is dropped.
        if drop.is_none() {
            many.query(&q, |w| w == SHARED, &mut r);
            for w in 0..5u16 {
                prop_assert_eq!(r.get(w), want.get(w), "worker {}", w);
            }
        }
    }
}
