//! Selection: argmin tie-break, softmax sampling, and every routing mode.

use super::super::pick::normalized_load;
use super::*;

/// Workers whose kv cost is exactly `costs[i]` (empty prompt, decode blocks only).
fn with_costs(costs: &[f64]) -> Vec<W> {
    costs
        .iter()
        .enumerate()
        .map(|(i, &c)| W::new(&format!("w{i}")).unique(c))
        .collect()
}

/// Exact ties (`balance_slack` 0): the tie-break tests below are about `TIE_EPS`.
fn empty_prompt() -> Case {
    Case::new().req(0).cfg(|c| c.balance_slack = 0.0)
}

#[test]
fn balance_slack_takes_near_ties_in_turn() {
    // Slack 0.05 of the minimum 100: 100 and 104 are tied, 106 and 110 are not.
    let ws = with_costs(&[104.0, 110.0, 100.0, 106.0]);
    let case = Case::new().req(0).cfg(|c| c.balance_slack = 0.05);
    let f = case.frequencies(&ws, 200, 1);
    assert_eq!(f, vec![100, 0, 100, 0], "in turn, not by chance");
    // The same through the row-by-row path (an allow-list keeps the kernel out).
    let rows = case
        .clone()
        .filters(|f| f.allow = Some(vec!["w0".into(), "w1".into(), "w2".into(), "w3".into()]));
    assert_eq!(rows.frequencies(&ws, 200, 1), vec![100, 0, 100, 0]);
    // Slack 0: only the minimum.
    let exact = Case::new().req(0).cfg(|c| c.balance_slack = 0.0);
    assert_eq!(exact.frequencies(&ws, 50, 1), vec![0, 0, 50, 0]);
}

#[test]
fn temperature_zero_breaks_ties_at_random() {
    let ws = with_costs(&[3.0, 1.0, 1.0 + 1e-10, 2.0]);
    let f = empty_prompt().frequencies(&ws, 2000, 1);
    assert_eq!(f[0] + f[3], 0, "{f:?}");
    assert!(f[1] > 850 && f[2] > 850, "both tied workers chosen: {f:?}");
}

#[test]
fn temperature_zero_distinguishes_beyond_epsilon() {
    let ws = with_costs(&[1.0 + 1e-6, 1.0, 1.0 + 1e-6]);
    let f = empty_prompt().frequencies(&ws, 200, 2);
    assert_eq!(f, vec![0, 200, 0]);
}

#[test]
fn tie_break_depends_on_the_rng_seed_only() {
    let ws = with_costs(&[1.0; 8]);
    let a = empty_prompt().frequencies(&ws, 50, 9);
    let b = empty_prompt().frequencies(&ws, 50, 9);
    assert_eq!(a, b);
    assert!(a.iter().filter(|&&n| n > 0).count() >= 6, "{a:?}");
}

#[test]
fn softmax_matches_analytic_frequencies() {
    let costs = [0.0, 5.0, 10.0];
    for t in [0.5, 1.0] {
        let ws = with_costs(&costs);
        let case = empty_prompt().cfg(|c| c.router_temperature = t);
        let n = 20_000;
        let f = case.frequencies(&ws, n, 42);
        let weights: Vec<f64> = costs.iter().map(|c| (-(c / 10.0) / t).exp()).collect();
        let total: f64 = weights.iter().sum();
        for i in 0..3 {
            let want = weights[i] / total;
            let got = f64::from(f[i]) / f64::from(n);
            assert!((got - want).abs() < 0.02, "T={t} w{i}: {got} vs {want}");
        }
    }
}

/// Pools of 256+ workers sample by rejection first (`kernel::reject`); the group
/// frequencies must still follow the softmax, with filtered workers never chosen, and
/// a low temperature (proposals mostly rejected, full pass) must still favour the
/// cheapest worker as the softmax does.
#[test]
fn softmax_of_a_large_pool_matches_analytic_frequencies() {
    let costs: Vec<f64> = (0..300).map(|i| [0.0, 5.0, 10.0][i % 3]).collect();
    let mut ws = with_costs(&costs);
    for w in ws.iter_mut().skip(1).step_by(7) {
        w.live = false;
    }
    let live: Vec<bool> = ws.iter().map(|w| w.live).collect();
    let t = 0.5;
    // 6,000 draws: standard error ≤ 0.0065 per group, so 0.02 is a 3σ bound.
    let n = 6_000;
    let f = empty_prompt()
        .cfg(|c| c.router_temperature = t)
        .frequencies(&ws, n, 11);
    let weight = |c: f64| (-(c / 10.0) / t).exp();
    let total: f64 = (0..300)
        .filter(|&i| live[i])
        .map(|i| weight(costs[i]))
        .sum();
    for g in 0..3 {
        let members = (0..300).filter(|&i| i % 3 == g && live[i]);
        let want: f64 = members.clone().map(|i| weight(costs[i])).sum::<f64>() / total;
        let got = members.map(|i| f64::from(f[i])).sum::<f64>() / f64::from(n);
        assert!((got - want).abs() < 0.02, "group {g}: {got} vs {want}");
    }
    for (i, &ok) in live.iter().enumerate() {
        assert!(ok || f[i] == 0, "filtered worker {i} chosen {} times", f[i]);
    }
    let mut sharp = vec![10.0; 300];
    sharp[17] = 0.0;
    let f = empty_prompt()
        .cfg(|c| c.router_temperature = 0.05)
        .frequencies(&with_costs(&sharp), 500, 12);
    assert_eq!(f[17], 500, "weight ratio e^20: the cheapest every time");
}

#[test]
fn softmax_normalises_costs_so_scale_does_not_matter() {
    // Same relative spread at 100x the scale → same distribution.
    let small = empty_prompt()
        .cfg(|c| c.router_temperature = 0.5)
        .frequencies(&with_costs(&[0.0, 5.0, 10.0]), 20_000, 3);
    let big = empty_prompt()
        .cfg(|c| c.router_temperature = 0.5)
        .frequencies(&with_costs(&[100.0, 600.0, 1100.0]), 20_000, 4);
    for i in 0..3 {
        assert!(
            (f64::from(small[i]) - f64::from(big[i])).abs() < 600.0,
            "{small:?} {big:?}"
        );
    }
}

#[test]
fn softmax_with_equal_costs_is_uniform() {
    let ws = with_costs(&[4.0; 4]);
    let f = empty_prompt()
        .cfg(|c| c.router_temperature = 0.7)
        .frequencies(&ws, 8000, 5);
    for n in f {
        assert!((1750..=2250).contains(&n), "{n}");
    }
}

#[test]
fn softmax_never_picks_a_filtered_worker() {
    let mut ws = with_costs(&[0.0, 1.0, 2.0]);
    ws[0].live = false;
    let f = empty_prompt()
        .cfg(|c| c.router_temperature = 2.0)
        .frequencies(&ws, 2000, 6);
    assert_eq!(f[0], 0);
    assert!(f[1] > 0 && f[2] > 0);
}

#[test]
fn mode_random_is_uniform_over_eligible() {
    let mut ws = with_costs(&[0.0, 50.0, 100.0, 150.0, 0.0]);
    ws[4] = ws[4].clone().dead();
    let f = Case::new().mode(Mode::Random).frequencies(&ws, 8000, 11);
    assert_eq!(f[4], 0);
    for &n in &f[..4] {
        assert!((1800..=2200).contains(&n), "{f:?}");
    }
}

#[test]
fn mode_round_robin_cycles_over_eligible_workers() {
    let ws = vec![W::new("a"), W::new("b"), W::new("c").dead(), W::new("d")];
    let case = Case::new().mode(Mode::RoundRobin);
    let mut rng = SmallRng::seed_from_u64(1);
    let mut rr = RrState::default();
    let seq: Vec<u16> = (0..6)
        .map(|_| {
            case.decide_with(&ws, &mut rng, &mut rr)
                .unwrap()
                .decode_worker
        })
        .collect();
    assert_eq!(seq, vec![0, 1, 3, 0, 1, 3]);
    assert_eq!(rr.counter, 6);
    let mut rr = RrState {
        counter: 4,
        ..Default::default()
    };
    let d = case.decide_with(&ws, &mut rng, &mut rr).unwrap();
    assert_eq!(d.decode_worker, 1);
    assert_eq!(rr.counter, 5);
}

#[test]
fn round_robin_cursor_untouched_by_other_modes_and_errors() {
    let ws = vec![W::new("a").dead()];
    let mut rng = SmallRng::seed_from_u64(1);
    let mut rr = RrState {
        counter: 3,
        ..Default::default()
    };
    let rrcase = Case::new().mode(Mode::RoundRobin);
    assert!(rrcase.decide_with(&ws, &mut rng, &mut rr).is_err());
    let ws = vec![W::new("a")];
    Case::new().decide_with(&ws, &mut rng, &mut rr).unwrap();
    assert_eq!(rr.counter, 3);
}

#[test]
fn mode_direct_needs_a_pin_and_takes_the_pinned_worker() {
    let ws = worked_example();
    let direct = Case::new().mode(Mode::Direct);
    assert_eq!(direct.decide(&ws), Err(RouteError::DirectNeedsPin));
    let d = direct
        .clone()
        .filters(|f| f.pin = Some("w1".into()))
        .decide(&ws)
        .unwrap();
    assert_eq!(d.decode_worker, 0);
    assert_eq!(d.cost, 28.0, "kv cost still reported");
    let err = direct
        .filters(|f| f.pin = Some("nope".into()))
        .decide(&ws)
        .unwrap_err();
    assert!(matches!(err, RouteError::PinNotFound { ref pin, .. } if pin == "nope"));
}

#[test]
fn mode_least_loaded_picks_fewest_active_ties_random() {
    let ws = vec![
        W::new("a").active(5).dev(10),
        W::new("b").active(2),
        W::new("c").active(2),
        W::new("d").active(1).dead(),
    ];
    let f = Case::new()
        .mode(Mode::LeastLoaded)
        .frequencies(&ws, 1000, 3);
    assert_eq!(f[0] + f[3], 0);
    assert!(f[1] > 400 && f[2] > 400, "{f:?}");
}

#[test]
fn non_kv_modes_report_kv_terms_of_the_chosen_worker() {
    let ws = worked_example();
    for mode in [
        Mode::Random,
        Mode::RoundRobin,
        Mode::LeastLoaded,
        Mode::DeviceAwareWeighted,
    ] {
        let mut rng = SmallRng::seed_from_u64(8);
        let mut rr = RrState::default();
        let case = Case::new().mode(mode);
        for _ in 0..6 {
            let d = case.decide_with(&ws, &mut rng, &mut rr).unwrap();
            let w = &ws[d.decode_worker as usize];
            let t = terms(&case.cfg, case.req, w);
            assert_eq!((d.cost, d.overlap), (t.cost, t.overlap), "{mode:?}");
        }
    }
}

#[test]
fn device_aware_group_math() {
    assert_eq!(normalized_load(16, 2, 8.0), 1.0);
    assert_eq!(normalized_load(3, 2, 1.0), 1.5);
}

/// GPU workers with the given active counts followed by CPU workers.
fn fleet(gpu: &[u32], cpu: &[u32]) -> Vec<W> {
    let g = gpu
        .iter()
        .enumerate()
        .map(|(i, &a)| W::new(&format!("g{i}")).active(a));
    let c = cpu
        .iter()
        .enumerate()
        .map(|(i, &a)| W::new(&format!("c{i}")).active(a).cpu());
    g.chain(c).collect()
}

fn daw() -> Case {
    Case::new().mode(Mode::DeviceAwareWeighted)
}

#[test]
fn device_aware_gpu_group_wins_when_less_loaded() {
    // GPU: 16 / (2 * 8) = 1; CPU: 2 / 1 = 2 → GPU, then least-loaded inside it.
    let ws = fleet(&[9, 7], &[2]);
    assert_eq!(daw().decide(&ws).unwrap().decode_worker, 1);
}

#[test]
fn device_aware_cpu_group_wins_when_less_loaded() {
    // GPU: 24 / 8 = 3; CPU: (1 + 3) / 2 = 2 → CPU.
    let ws = fleet(&[24], &[3, 1]);
    assert_eq!(daw().decide(&ws).unwrap().decode_worker, 2);
}

#[test]
fn device_aware_tie_goes_to_gpu() {
    // GPU: 8 / 8 = 1; CPU: 1 / 1 = 1.
    let ws = fleet(&[8], &[1]);
    let f = daw().frequencies(&ws, 100, 4);
    assert_eq!(f, vec![100, 0]);
}

#[test]
fn device_aware_ratio_knob_shifts_the_choice() {
    // GPU: 16 / (2 * r); CPU: 2. r = 8 → 1 (GPU); r = 1 → 8 (CPU).
    let ws = fleet(&[8, 8], &[2]);
    assert!(daw().decide(&ws).unwrap().decode_worker < 2);
    let d = daw()
        .cfg(|c| c.cuda_to_cpu_ratio = 1.0)
        .decide(&ws)
        .unwrap();
    assert_eq!(d.decode_worker, 2);
}

#[test]
fn device_aware_single_class_is_plain_least_loaded() {
    let ws = fleet(&[], &[4, 1, 3]);
    assert_eq!(daw().decide(&ws).unwrap().decode_worker, 1);
    let ws = fleet(&[5, 2, 6], &[]);
    assert_eq!(daw().decide(&ws).unwrap().decode_worker, 1);
}

#[test]
fn device_aware_ignores_filtered_workers_in_group_math() {
    // The idle CPU worker is dead: CPU group = {c1: 9} → 9 > GPU 8/8 = 1.
    let mut ws = fleet(&[8], &[0, 9]);
    ws[1].live = false;
    assert_eq!(daw().decide(&ws).unwrap().decode_worker, 0);
}

#[test]
fn fast_exp_matches_std() {
    use super::super::pick::exp_neg;
    let mut y = 0.0f64;
    while y > -720.0 {
        let (got, want) = (exp_neg(y), y.exp());
        if y > -708.0 {
            assert!((got - want).abs() <= 1e-8 * want, "{y}: {got} vs {want}");
        } else {
            assert!(got == 0.0 && want < 1e-307, "{y}");
        }
        y -= 0.0137;
    }
    assert_eq!(exp_neg(0.0), 1.0);
    assert_eq!(exp_neg(f64::NAN), 0.0);
    assert_eq!(exp_neg(f64::NEG_INFINITY), 0.0);
}
