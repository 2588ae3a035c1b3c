use super::*;

fn queue_of_two() -> (SharedQueue<u32>, Enqueued<u32>, Enqueued<u32>) {
    let q = SharedQueue::new(QueueConfig::default());
    let entry = |item, priority| Entry {
        item,
        priority,
        deadline_us: None,
        tenant: None,
        arrival_us: 0,
    };
    let a = q.enqueue(entry(1, -5), 0).unwrap();
    let b = q.enqueue(entry(2, 5), 0).unwrap();
    (q, a, b)
}

/// The turn a waiter's core builds when it is nudged or granted.
fn turn(e: &Enqueued<u32>, item: u32) -> Grant<u32> {
    Grant {
        ticket: e.ticket,
        item: Waiting {
            waiter: e.waiter.clone(),
            item,
        },
        tenant: None,
        waited_us: 0,
    }
}

#[test]
fn a_release_during_a_nudged_try_grants_the_nudged_waiter_and_serving_passes_it_on() {
    let (q, a, b) = queue_of_two();
    assert_eq!(q.nudge(0, 100, 16), Some(1));
    assert!(a.waiter.take_nudge());
    assert_eq!(q.len(), 2, "a nudged waiter keeps its place");
    let g = q.freed(10).unwrap();
    assert_eq!((g.item.item, a.waiter.state()), (1, WaiterState::Granted));
    // Its try went through: the release's grant was not what let it in.
    let next = q.served(&turn(&a, 1), 20).unwrap();
    assert_eq!(next.item.item, 2);
    assert_eq!(b.waiter.state(), WaiterState::Granted);
    assert_eq!((a.waiter.state(), q.len()), (WaiterState::Gone, 0));
}

#[test]
fn a_served_nudge_leaves_the_queue_admitted_and_a_bounced_one_waits_in_place() {
    let (q, a, b) = queue_of_two();
    q.nudge(0, 100, 16);
    assert!(a.waiter.take_nudge());
    let r = q.retry(turn(&a, 1), q.epoch()).unwrap();
    assert!(!r.recheck && r.displaced.is_none());
    assert_eq!((q.len(), a.waiter.state()), (2, WaiterState::Waiting));
    // Nudged again, and this time a worker takes it.
    assert_eq!(q.nudge(200_000, 100, 16), Some(1));
    assert!(a.waiter.take_nudge());
    assert!(q.served(&turn(&a, 1), 10).is_none());
    assert_eq!(q.len(), 1);
    assert_eq!(q.counters().admitted, 1);
    assert_eq!(b.waiter.state(), WaiterState::Waiting);
}

#[test]
fn a_nudge_passes_over_a_waiter_already_trying_and_waits_out_a_recent_grant() {
    let (q, a, _b) = queue_of_two();
    assert_eq!(q.nudge(0, 100, 16), Some(1));
    assert!(a.waiter.take_nudge());
    assert!(!a.waiter.take_nudge(), "one nudge, one try");
    assert_eq!(q.nudge(0, 100, 16), Some(2), "the first is trying");
    assert_eq!(q.nudge(0, 100, 1), None, "only the first one scanned");
    // A grant at 1,000 µs: no nudge until 100 µs after it.
    let g = q.freed(1_000).unwrap();
    assert_eq!(g.item.item, 1);
    assert_eq!(q.nudge(1_099, 100, 16), None);
    assert_eq!(q.nudge(1_100, 100, 16), Some(2));
}

#[test]
fn a_nudged_waiter_that_leaves_is_removed_and_a_grant_it_held_passes_on() {
    let (q, a, b) = queue_of_two();
    q.nudge(0, 100, 16);
    assert!(a.waiter.take_nudge());
    assert!(matches!(q.leave(a.ticket, &a.waiter, 5), Leave::Removed));
    assert_eq!(q.len(), 1);
    // The second, nudged and then granted while it tried, leaves: the grant passes on
    // (to nobody: the queue is empty).
    q.nudge(0, 100, 16);
    assert!(b.waiter.take_nudge());
    q.freed(10).unwrap();
    assert!(matches!(
        q.leave(b.ticket, &b.waiter, 20),
        Leave::PassedOn(None)
    ));
    assert_eq!(q.len(), 0);
}
