//! The admission queue against its documented order, bounds, aging bound and outcomes,
//! and against a plain model (a list sorted by the documented key) under random
//! operation sequences.

use super::*;
use proptest::prelude::*;

const S: u64 = 1_000_000;

fn cfg() -> QueueConfig {
    QueueConfig {
        max_len: 8,
        max_wait_us: 10 * S,
        tenant_share: 0.5,
        aging_us: S,
        max_priority: 3,
    }
}

fn entry(item: u32, priority: i32, deadline_us: Option<u64>, at: u64) -> Entry<u32> {
    Entry {
        item,
        priority,
        deadline_us,
        tenant: None,
        arrival_us: at,
    }
}

fn drain(q: &mut AdmissionQueue<u32>, now: u64) -> Vec<u32> {
    std::iter::from_fn(|| q.pop(now).map(|a| a.item)).collect()
}

#[test]
fn one_aging_step_goes_by_priority_then_deadline_then_arrival() {
    let mut q = AdmissionQueue::new(cfg());
    let t = 5 * S;
    for (item, p, d, at) in [
        (1, 1, None, t),
        (2, 0, None, t + 1),
        (3, 0, Some(t + 500), t + 2),
        (4, 0, Some(t + 400), t + 3),
        (5, -1, None, t + 4),
        (6, 0, None, t + 5),
    ] {
        q.push(entry(item, p, d, at)).unwrap();
    }
    assert_eq!(drain(&mut q, t + 10), vec![5, 4, 3, 2, 6, 1]);
    assert!(q.is_empty());
}

#[test]
fn priorities_are_clamped() {
    let mut q = AdmissionQueue::new(cfg());
    q.push(entry(1, -3, None, 0)).unwrap();
    // i32::MIN is clamped to -3: it ties on rank and goes by arrival.
    q.push(entry(2, i32::MIN, None, 1)).unwrap();
    q.push(entry(3, i32::MAX, None, 2)).unwrap();
    q.push(entry(4, 3, None, 3)).unwrap();
    assert_eq!(drain(&mut q, 10), vec![1, 2, 3, 4]);
}

#[test]
fn a_waiting_request_outranks_the_next_class_up_after_one_aging_step() {
    let mut q = AdmissionQueue::new(cfg());
    // Priority 1 at t = 0; priority 0 arrivals at 0.5 s (same step: it goes first)
    // and at 1.0 s (one step later: same rank, goes by deadline/arrival: after).
    q.push(entry(1, 1, None, 0)).unwrap();
    q.push(entry(2, 0, None, S / 2)).unwrap();
    q.push(entry(3, 0, None, S)).unwrap();
    q.push(entry(4, 0, None, 2 * S)).unwrap();
    assert_eq!(drain(&mut q, 3 * S), vec![2, 1, 3, 4]);
}

#[test]
fn without_aging_order_is_strict() {
    let mut q = AdmissionQueue::new(QueueConfig {
        aging_us: 0,
        ..cfg()
    });
    q.push(entry(1, 1, None, 0)).unwrap();
    q.push(entry(2, 0, None, 100 * S)).unwrap();
    q.push(entry(3, 0, Some(1), 200 * S)).unwrap();
    assert_eq!(drain(&mut q, 300 * S), vec![3, 2, 1]);
}

#[test]
fn a_full_queue_refuses_unless_the_newcomer_outranks_the_last() {
    let mut q = AdmissionQueue::new(QueueConfig {
        max_len: 2,
        ..cfg()
    });
    q.push(entry(1, 0, None, 0)).unwrap();
    q.push(entry(2, 1, None, 1)).unwrap();
    let r = q.push(entry(3, 1, None, 2)).unwrap_err();
    assert_eq!((r.reason, r.item), (Refusal::Full, 3));
    let p = q.push(entry(4, -1, None, 3)).unwrap();
    let d = p.displaced.unwrap();
    assert_eq!((d.item, d.waited_us), (2, 2));
    assert_eq!(q.len(), 2);
    assert_eq!(drain(&mut q, 5), vec![4, 1]);
    let c = q.counters();
    assert_eq!((c.queued, c.refused_full, c.admitted), (3, 2, 2));
    // A queue of length 0 queues nothing.
    let mut z = AdmissionQueue::new(QueueConfig {
        max_len: 0,
        ..cfg()
    });
    assert_eq!(
        z.push(entry(1, -3, None, 0)).unwrap_err().reason,
        Refusal::Full
    );
}

#[test]
fn a_tenant_holds_at_most_its_share() {
    let mut q = AdmissionQueue::new(cfg()); // 8 × 0.5 = 4 per tenant
    for i in 0..4 {
        let mut e = entry(i, 0, None, u64::from(i));
        e.tenant = Some(7);
        q.push(e).unwrap();
    }
    let mut e = entry(9, -3, None, 10);
    e.tenant = Some(7);
    assert_eq!(q.push(e).unwrap_err().reason, Refusal::TenantShare);
    // Another tenant, and requests without a tenant, are not held back.
    let mut other = entry(10, 0, None, 11);
    other.tenant = Some(8);
    q.push(other).unwrap();
    q.push(entry(11, 0, None, 12)).unwrap();
    assert_eq!((q.tenant_len(7), q.tenant_len(8)), (4, 1));
    // Once one leaves, the tenant may queue again.
    q.pop(20).unwrap();
    let mut e = entry(12, 0, None, 21);
    e.tenant = Some(7);
    q.push(e).unwrap();
    assert_eq!(q.counters().refused_tenant, 1);
    // The share is at least one entry.
    let tiny = QueueConfig {
        tenant_share: 0.01,
        ..cfg()
    };
    assert_eq!(tiny.tenant_cap(), 1);
    let nan = QueueConfig {
        tenant_share: f64::NAN,
        ..cfg()
    };
    assert_eq!(nan.tenant_cap(), 8);
}

#[test]
fn cancel_removes_at_once_and_only_once() {
    let mut q = AdmissionQueue::new(cfg());
    let a = q.push(entry(1, 0, None, 0)).unwrap().ticket;
    let b = q.push(entry(2, 0, None, 1)).unwrap().ticket;
    let l = q.cancel(a, 5).unwrap();
    assert_eq!((l.item, l.waited_us), (1, 5));
    assert!(q.cancel(a, 6).is_none());
    assert_eq!(q.len(), 1);
    assert_eq!(q.next_expiry(), Some(1 + 10 * S));
    assert_eq!(q.pop(7).map(|a| a.ticket), Some(b));
    assert!(
        q.cancel(b, 8).is_none(),
        "an admitted entry cannot be cancelled"
    );
    assert_eq!(q.counters().cancelled, 1);
}

#[test]
fn entries_time_out_at_the_wait_limit_or_their_deadline() {
    let mut q = AdmissionQueue::new(cfg());
    q.push(entry(1, 0, None, 0)).unwrap();
    q.push(entry(2, 0, Some(3 * S), S)).unwrap();
    q.push(entry(3, 0, Some(100 * S), 2 * S)).unwrap();
    q.push(entry(4, 0, Some(0), 2 * S)).unwrap(); // already past: next expire
    assert_eq!(q.next_expiry(), Some(0));
    let mut out = Vec::new();
    q.expire(3 * S - 1, &mut out);
    assert_eq!(out.iter().map(|l| l.item).collect::<Vec<_>>(), vec![4]);
    out.clear();
    q.expire(3 * S, &mut out);
    assert_eq!(
        out.iter()
            .map(|l| (l.item, l.waited_us))
            .collect::<Vec<_>>(),
        vec![(2, 2 * S)]
    );
    out.clear();
    q.expire(12 * S, &mut out);
    assert_eq!(out.iter().map(|l| l.item).collect::<Vec<_>>(), vec![1, 3]);
    assert!(q.is_empty());
    assert_eq!(q.next_expiry(), None);
    assert_eq!(q.counters().timed_out, 4);
}

#[test]
fn pop_where_skips_what_does_not_fit_and_keeps_its_place() {
    let mut q = AdmissionQueue::new(cfg());
    for i in 1..=4 {
        q.push(entry(i, 0, None, u64::from(i))).unwrap();
    }
    assert_eq!(q.pop_where(10, 8, |&i| i % 2 == 0).map(|a| a.item), Some(2));
    assert_eq!(q.pop_where(10, 1, |&i| i == 4).map(|a| a.item), None);
    assert_eq!(q.pop_where(10, 0, |_| true).map(|a| a.item), None);
    assert_eq!(drain(&mut q, 10), vec![1, 3, 4]);
}

#[test]
fn requeue_keeps_the_place_in_the_order() {
    let mut q = AdmissionQueue::new(cfg());
    q.push(entry(1, 0, None, 0)).unwrap();
    q.push(entry(2, 0, None, 1)).unwrap();
    let a = q.pop(5).unwrap();
    assert_eq!(a.item, 1);
    q.push(entry(3, 0, None, 6)).unwrap();
    q.requeue(a).unwrap();
    assert_eq!(drain(&mut q, 7), vec![1, 2, 3]);
}

proptest! {
    /// The aging bound: an entry is never passed by one that arrived more than
    /// `(p + max_priority + 1) × aging_us` after it.
    #[test]
    fn no_entry_is_passed_by_a_much_later_arrival(
        reqs in prop::collection::vec((0u64..20 * S, -5i32..5, prop::option::of(0u64..30 * S)), 1..60),
    ) {
        let c = cfg();
        let mut q = AdmissionQueue::new(QueueConfig { max_len: 1000, max_wait_us: u64::MAX, ..c });
        let mut meta = Vec::new();
        for (i, &(at, p, d)) in reqs.iter().enumerate() {
            q.push(entry(i as u32, p, d, at)).unwrap();
            meta.push((at, c.clamp_priority(p)));
        }
        let order = drain(&mut q, 40 * S);
        prop_assert_eq!(order.len(), reqs.len());
        for (pos, &x) in order.iter().enumerate() {
            let (ax, px) = meta[x as usize];
            let window = (px + c.max_priority + 1) as u64 * c.aging_us;
            // Everything served before x arrived before x's window closed.
            for &y in &order[..pos] {
                let (ay, _) = meta[y as usize];
                prop_assert!(ay < (ax / c.aging_us) * c.aging_us + window,
                    "{y} (at {ay}) passed {x} (at {ax}, p {px})");
            }
        }
    }

    /// Random operations against a plain model: a list of live entries sorted by the
    /// documented key; every entry leaves exactly once.
    #[test]
    fn matches_a_sorted_list_model(
        ops in prop::collection::vec((0u8..6, -4i32..4, 0u64..4 * S, 0u8..3, any::<bool>()), 0..120),
    ) {
        let c = QueueConfig { max_len: 6, max_wait_us: 3 * S, tenant_share: 0.5, aging_us: S / 2, max_priority: 2 };
        let mut q = AdmissionQueue::new(c);
        // (key, item, tenant, expires)
        let mut model: Vec<(Ticket, u32, Option<u64>, u64)> = Vec::new();
        let mut tickets = Vec::new();
        let mut now = 0u64;
        let mut left = 0u64;
        let mut pushed = 0u64;
        let mut displaced = 0u64;
        for (i, &(op, p, dt, tenant, has_deadline)) in ops.iter().enumerate() {
            now += dt / 8;
            let item = i as u32;
            match op {
                0..=2 => {
                    let tenant = (tenant > 0).then_some(u64::from(tenant));
                    let deadline = has_deadline.then_some(now + dt);
                    let e = Entry { item, priority: p, deadline_us: deadline, tenant, arrival_us: now };
                    let key = q.ticket_for(p, deadline, now);
                    let held = model.iter().filter(|m| tenant.is_some() && m.2 == tenant).count();
                    let expect_tenant_refusal = tenant.is_some() && held >= c.tenant_cap();
                    match q.push(e) {
                        Ok(pu) => {
                            pushed += 1;
                            prop_assert!(!expect_tenant_refusal);
                            prop_assert_eq!(pu.ticket, key);
                            if model.len() >= c.max_len {
                                let last = model.pop().unwrap();
                                prop_assert!(key < last.0);
                                prop_assert_eq!(pu.displaced.map(|d| d.item), Some(last.1));
                                left += 1;
                                displaced += 1;
                            }
                            let exp = (now + c.max_wait_us).min(deadline.unwrap_or(u64::MAX));
                            model.push((key, item, tenant, exp));
                            model.sort_by_key(|m| m.0);
                            tickets.push(key);
                        }
                        Err(r) => {
                            prop_assert_eq!(r.item, item);
                            if expect_tenant_refusal {
                                prop_assert_eq!(r.reason, Refusal::TenantShare);
                            } else {
                                prop_assert_eq!(r.reason, Refusal::Full);
                                prop_assert!(model.len() >= c.max_len && key > model[model.len() - 1].0);
                            }
                        }
                    }
                }
                3 => {
                    let got = q.pop(now).map(|a| a.item);
                    let want = (!model.is_empty()).then(|| model.remove(0).1);
                    prop_assert_eq!(got, want);
                    left += u64::from(got.is_some());
                }
                4 => {
                    if let Some(&t) = tickets.get(dt as usize % tickets.len().max(1)) {
                        let got = q.cancel(t, now).map(|l| l.item);
                        let want = model.iter().position(|m| m.0 == t).map(|i| model.remove(i).1);
                        prop_assert_eq!(got, want);
                        left += u64::from(got.is_some());
                    }
                }
                _ => {
                    let mut out = Vec::new();
                    q.expire(now, &mut out);
                    let mut want: Vec<_> = model.iter().filter(|m| m.3 <= now).map(|m| (m.3, m.0.seq, m.1)).collect();
                    want.sort();
                    model.retain(|m| m.3 > now);
                    prop_assert_eq!(out.iter().map(|l| l.item).collect::<Vec<_>>(), want.iter().map(|w| w.2).collect::<Vec<_>>());
                    left += out.len() as u64;
                }
            }
            prop_assert_eq!(q.len(), model.len());
            prop_assert!(q.len() <= c.max_len);
            for t in 1..3u64 {
                prop_assert_eq!(q.tenant_len(t), model.iter().filter(|m| m.2 == Some(t)).count());
            }
            prop_assert_eq!(q.iter().map(|(_, &i)| i).collect::<Vec<_>>(), model.iter().map(|m| m.1).collect::<Vec<_>>());
            prop_assert_eq!(pushed, left + q.len() as u64);
        }
        let cn = q.counters();
        prop_assert_eq!(cn.queued, pushed);
        prop_assert_eq!(cn.admitted + cn.cancelled + cn.timed_out + displaced, left);
    }
}
