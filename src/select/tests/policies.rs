//! Session affinity and conditional disaggregation in decisions: a session's worker
//! keeps the request within the affinity slack even where a prefix affinity would be
//! cancelled, explain records say which affinity was offered and kept, and a
//! disaggregated request prefills on its decode worker exactly when the rule says so.

use super::*;

/// Decides once through `decide_view` with a prefix and a session affinity (slots).
fn decide_with_affinity(
    ws: &[W],
    case: &Case,
    prefix: Option<u16>,
    session: Option<u16>,
) -> Decision {
    let fleet = Fleet::with_slots(ws.iter().enumerate().map(|(i, w)| (i as u16, &w.spec)));
    let mut loads = Loads::new(&fleet);
    let mut hits = Hits::default();
    hits.begin(&fleet, Overlap::default());
    for (i, w) in ws.iter().enumerate() {
        loads.set_live(i as u16, w.live);
        loads.set_suspect(i as u16, w.suspect);
        loads.set_load(i as u16, &w.load, w.unique);
        hits.set_overlap(&fleet, i as u16, &w.overlap);
    }
    hits.set_affinity(&fleet, prefix);
    hits.set_session(&fleet, session);
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
    let mut rng = SmallRng::seed_from_u64(3);
    decide_view(
        &input,
        &mut rng,
        &mut RrState::default(),
        &mut Scratch::default(),
    )
    .unwrap()
}

#[test]
fn a_session_worker_keeps_the_turn_where_a_prefix_affinity_is_cancelled() {
    // w0 holds 6 of the 10-block prompt (cost 4); w1 (the session's worker) none
    // (cost 10): within the default slack (1 + 2 = 3x).
    let ws = vec![W::new("w0").dev(6), W::new("w1")];
    let c = Case::new();
    let prefix = decide_with_affinity(&ws, &c, Some(1), None);
    assert_eq!(
        prefix.decode_worker, 0,
        "the bigger cache cancels a prefix affinity"
    );
    assert_eq!(prefix.affinity, None);
    let session = decide_with_affinity(&ws, &c, Some(0), Some(1));
    assert_eq!(session.decode_worker, 1, "the session's worker keeps it");
    assert_eq!(
        session.affinity,
        Some(AffinityUse {
            worker: 1,
            source: AffinitySource::Session,
            kept: true
        })
    );
    // Beyond the slack (w1 carries 100 active blocks) the session's worker loses, and
    // the record says so.
    let ws = vec![W::new("w0").dev(8), W::new("w1").unique(100.0)];
    let lost = decide_with_affinity(&ws, &c, None, Some(1));
    assert_eq!(lost.decode_worker, 0);
    assert_eq!(
        lost.affinity.map(|a| (a.source, a.kept)),
        Some((AffinitySource::Session, false))
    );
    // A session naming no worker of the fleet leaves the prefix affinity in place.
    let ws = vec![W::new("w0"), W::new("w1")];
    let kept = decide_with_affinity(&ws, &c, Some(1), Some(9));
    assert_eq!(
        kept.affinity.map(|a| (a.worker, a.source, a.kept)),
        Some((1, AffinitySource::Prefix, true))
    );
}

#[test]
fn sessions_are_a_preference_not_a_pin() {
    // The session's worker is dead or filtered out: the decision goes elsewhere.
    let ws = vec![W::new("w0"), W::new("w1").dead()];
    let d = decide_with_affinity(&ws, &Case::new(), None, Some(1));
    assert_eq!(d.decode_worker, 0);
    assert_eq!(d.affinity.map(|a| a.kept), Some(false));
    let ws = vec![W::new("w0"), W::new("w1")];
    let c = Case::new().filters(|f| f.allow = Some(vec!["w0".into()]));
    assert_eq!(
        decide_with_affinity(&ws, &c, None, Some(1)).decode_worker,
        0
    );
}

fn pd(decode_held: u32) -> Vec<W> {
    vec![
        W::new("p0").role(Role::Prefill),
        W::new("d1").role(Role::Decode).dev(decode_held),
        W::new("d2").role(Role::Decode).unique(50.0).total(50.0),
    ]
}

#[test]
fn local_prefill_when_the_decode_worker_holds_enough_of_the_prompt() {
    let half = Case::new().cfg(|c| c.local_prefill_min_cached_fraction = Some(0.5));
    for (held, local) in [(4, false), (5, true), (10, true)] {
        for d in [
            half.decide(&pd(held)).unwrap(),
            decide_with_affinity(&pd(held), &half, None, None),
        ] {
            assert_eq!(d.decode_worker, 1);
            if local {
                assert_eq!(d.local_prefill, Some(LocalPrefill::Cached));
                assert_eq!(
                    (d.prefill_worker, d.prefill_dp_rank, d.prefill_cost),
                    (None, None, None)
                );
                assert_eq!(
                    d.overlap.device, held,
                    "the overlap of the worker that prefills"
                );
                assert_eq!(d.fallback, Fallback::None);
            } else {
                assert_eq!((d.local_prefill, d.prefill_worker), (None, Some(0)));
            }
        }
    }
    // Off by default.
    assert_eq!(Case::new().decide(&pd(10)).unwrap().prefill_worker, Some(0));
}

#[test]
fn local_prefill_when_little_is_left_to_compute() {
    // 1,280-token prompt; d1 holds 7 blocks (896 tokens): 384 uncached.
    let c = Case::new().cfg(|c| c.local_prefill_max_uncached_tokens = 384);
    let d = c.decide(&pd(7)).unwrap();
    assert_eq!(
        (d.local_prefill, d.prefill_worker),
        (Some(LocalPrefill::Short), None)
    );
    let d = c
        .clone()
        .cfg(|c| c.local_prefill_max_uncached_tokens = 383)
        .decide(&pd(7))
        .unwrap();
    assert_eq!(d.prefill_worker, Some(0));
    // A short prompt needs no cache at all.
    let short = c.req(300);
    assert_eq!(
        short.decide(&pd(0)).unwrap().local_prefill,
        Some(LocalPrefill::Short)
    );
}

#[test]
fn local_prefill_trusts_no_suspect_index_and_keeps_explain_and_fallbacks() {
    let c = Case::new().cfg(|c| c.local_prefill_min_cached_fraction = Some(0.1));
    let mut ws = pd(10);
    ws[1] = ws[1].clone().suspect();
    assert_eq!(c.decide(&ws).unwrap().prefill_worker, Some(0));
    // Both stages' candidates are still explained.
    let d = c.clone().explain().decide(&pd(10)).unwrap();
    assert_eq!(d.local_prefill, Some(LocalPrefill::Cached));
    assert!(d.candidates.iter().any(|e| e.stage == Stage::Prefill));
    assert!(d.candidates.iter().any(|e| e.stage == Stage::Decode));
    // A decode-only fallback is a fallback, not a local prefill.
    let d = c.clone().prefill_failed().decide(&pd(10)).unwrap();
    assert_eq!(
        (d.local_prefill, d.fallback),
        (None, Fallback::PrefillFailed)
    );
    // An aggregated fleet never reports it.
    let agg = vec![W::new("w0").dev(10)];
    assert_eq!(c.decide(&agg).unwrap().local_prefill, None);
}
