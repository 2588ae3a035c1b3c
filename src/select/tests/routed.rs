//! `balance_routed_min_ties`: a large near-tie set goes to the tied worker with the
//! fewest requests routed so far (counted in the [`Scratch`] by `decide_view`), a small
//! one in turn; the kernel and the row-by-row path agree.

use super::*;

/// A fleet laid out as the engine keeps it, deciding through `decide_view` with one
/// scratch (so the routed counts persist) and one cursor.
struct View {
    ws: Vec<W>,
    scratch: Scratch,
    rr: RrState,
    rng: SmallRng,
}

impl View {
    fn new(ws: Vec<W>) -> View {
        View {
            ws,
            scratch: Scratch::default(),
            rr: RrState::default(),
            rng: SmallRng::seed_from_u64(3),
        }
    }

    /// Decides once; returns the decode worker's position.
    fn route(&mut self, case: &Case) -> usize {
        let slots: Vec<(u16, &crate::types::WorkerSpec)> = (self.ws.iter().enumerate())
            .map(|(i, w)| (i as u16, &w.spec))
            .collect();
        let fleet = Fleet::with_slots(slots.iter().copied());
        let mut loads = Loads::new(&fleet);
        for (i, w) in self.ws.iter().enumerate() {
            loads.set_live(i as u16, w.live);
            loads.set_load(i as u16, &w.load, w.unique);
        }
        let mut hits = Hits::default();
        hits.begin(&fleet, Overlap::default());
        for (i, w) in self.ws.iter().enumerate() {
            hits.set_overlap(&fleet, i as u16, &w.overlap);
        }
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
        let d = decide_view(&input, &mut self.rng, &mut self.rr, &mut self.scratch).unwrap();
        usize::from(d.decode_worker)
    }
}

/// `n` idle workers (all tied under any slack).
fn idle(n: usize) -> Vec<W> {
    (0..n).map(|i| W::new(&format!("w{i}"))).collect()
}

fn pin(w: &str) -> Case {
    let w = w.to_string();
    Case::new().mode(Mode::Direct).filters(|f| f.pin = Some(w))
}

/// The same case through the row-by-row path: an allow-list of every worker keeps the
/// kernel out without removing anyone.
fn by_rows(case: Case, n: usize) -> Case {
    case.filters(|f| f.allow = Some((0..n).map(|i| format!("w{i}")).collect()))
}

#[test]
fn large_tie_set_goes_to_the_least_routed_worker() {
    for rows in [false, true] {
        let kv = |c: Case| if rows { by_rows(c, 8) } else { c };
        let mut v = View::new(idle(8));
        // w0 has received three (pinned) requests, the others none. In turn alone
        // the next tie (cursor 3) would go to w3, and w0 would get one in eight.
        for _ in 0..3 {
            assert_eq!(v.route(&pin("w0")), 0);
        }
        let got: Vec<usize> = (0..21).map(|_| v.route(&kv(Case::new()))).collect();
        // Every other worker first reaches w0's three, in turn among equals.
        assert!(!got.contains(&0), "rows {rows}: {got:?}");
        let mut per = [0u32; 8];
        for &p in &got {
            per[p] += 1;
        }
        assert_eq!(per, [0, 3, 3, 3, 3, 3, 3, 3], "rows {rows}: {got:?}");
        // Now all are level: w0 is tied again and gets its turn.
        let next: Vec<usize> = (0..8).map(|_| v.route(&kv(Case::new()))).collect();
        assert!(next.contains(&0), "rows {rows}: {next:?}");
    }
}

#[test]
fn small_tie_set_is_taken_in_turn_whatever_the_counts() {
    for rows in [false, true] {
        let kv = |c: Case| if rows { by_rows(c, 8) } else { c };
        // Two idle workers (w1, w5) tied, the others loaded far beyond the slack:
        // fewer tied workers than `balance_routed_min_ties` (6).
        let mut ws = idle(8);
        for (i, w) in ws.iter_mut().enumerate() {
            if i != 1 && i != 5 {
                *w = w.clone().unique(500.0);
            }
        }
        let mut v = View::new(ws);
        for _ in 0..4 {
            v.route(&pin("w1"));
        }
        let got: Vec<usize> = (0..6).map(|_| v.route(&kv(Case::new()))).collect();
        assert_eq!(
            got,
            [1, 5, 1, 5, 1, 5],
            "rows {rows}: in turn, w1's count ignored"
        );
    }
}

#[test]
fn knob_zero_takes_every_tie_in_turn() {
    let mut v = View::new(idle(8));
    for _ in 0..3 {
        v.route(&pin("w0"));
    }
    let off = Case::new().cfg(|c| c.balance_routed_min_ties = 0);
    let got: Vec<usize> = (0..8).map(|_| v.route(&off)).collect();
    assert_eq!(got, [3, 4, 5, 6, 7, 0, 1, 2], "the cursor alone");
    // The knob needs the slack: without it ties are exact and random, counts unused.
    let exact = Case::new().cfg(|c| c.balance_slack = 0.0);
    let f: Vec<usize> = (0..40).map(|_| v.route(&exact)).collect();
    assert!(f.contains(&0), "{f:?}");
}

#[test]
fn a_real_cost_gap_beats_the_counts() {
    // w2 is the cheapest by far (a cached prefix): it keeps the traffic however many
    // requests it has had; the count only decides among near-ties.
    let mut ws = idle(8);
    ws[2] = ws[2].clone().dev(6);
    let mut v = View::new(ws);
    let got: Vec<usize> = (0..20).map(|_| v.route(&Case::new())).collect();
    assert!(got.iter().all(|&p| p == 2), "{got:?}");
}

#[test]
fn forget_routed_starts_the_counts_afresh() {
    let mut v = View::new(idle(8));
    for _ in 0..3 {
        v.route(&pin("w0"));
    }
    v.scratch.forget_routed();
    // Cursor 3 now, all counts 0: the turn decides (w3), as with a fresh scratch.
    assert_eq!(v.route(&Case::new()), 3);
}

#[test]
fn kernel_and_rows_agree_with_counts() {
    // Costs in three bands (ties within 3% inside a band), a sequence of decisions
    // whose counts build up; both paths must choose the same worker every time.
    let ws: Vec<W> = (0..24)
        .map(|i| W::new(&format!("w{i}")).unique([100.0, 101.0, 150.0][i % 3]))
        .collect();
    let mut a = View::new(ws.clone());
    let mut b = View::new(ws);
    for step in 0..200u32 {
        let case = Case::new().req(128 * (step % 5));
        let pa = a.route(&case);
        let pb = b.route(&by_rows(case, 24));
        assert_eq!(pa, pb, "step {step}");
        assert_ne!(pa % 3, 2, "step {step}: outside the slack");
    }
}
