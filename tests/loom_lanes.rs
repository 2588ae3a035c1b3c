//! loom model of a core's two inboxes behind one doorbell (`sync::lanes`).
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release
//! --no-default-features --test loom_lanes` (or `.ci/extra`).
//!
//! Two producers, one per lane (an API core sending a routing query to the urgent lane,
//! an ingest connection sending an index batch to the bulk lane), and the consumer of
//! `service::runtime::run_loop`: drain urgent, pop one bulk message after draining urgent again,
//! then park only if `try_sleep_both` agrees. The doorbell is a counter of pending
//! rings; a consumer that parks after every producer finished with no ring pending and
//! messages still queued has lost a wake-up, and the model fails. The twin
//! `first_lane_only_is_caught` parks after consulting only the urgent lane, the bug the
//! two-lane protocol exists to prevent, and loom finds the losing interleaving.
#![cfg(loom)]

use kvroute::sync::lanes::{awake_both, try_sleep_both};
use kvroute::sync::mailbox::Mailbox;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Core {
    lanes: [Mailbox<u32>; 2],
    /// Doorbell bytes not yet read.
    rings: AtomicUsize,
    /// Producers done sending.
    finished: AtomicUsize,
}

const URGENT: usize = 0;
const BULK: usize = 1;

impl Core {
    fn send(&self, lane: usize, msg: u32) {
        match self.lanes[lane].push(msg) {
            Ok(true) => {
                self.rings.fetch_add(1, Ordering::SeqCst);
            }
            Ok(false) => {}
            Err(_) => panic!("lane full in a model sized not to fill"),
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    fn park(&self) {
        loop {
            if self.rings.swap(0, Ordering::SeqCst) > 0 {
                return;
            }
            if self.finished.load(Ordering::SeqCst) == 2 {
                if self.rings.swap(0, Ordering::SeqCst) > 0 {
                    return;
                }
                panic!(
                    "lost wake-up: parked with {} urgent and {} bulk message(s) queued",
                    self.lanes[URGENT].len(),
                    self.lanes[BULK].len()
                );
            }
            thread::yield_now();
        }
    }
}

fn model(first_lane_only: bool) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = b.max_branches.max(5_000);
    b.check(move || {
        let core = Arc::new(Core {
            lanes: [Mailbox::new(2), Mailbox::new(2)],
            rings: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
        });
        let producers: Vec<_> = [(URGENT, 1u32), (BULK, 2u32)]
            .into_iter()
            .map(|(lane, msg)| {
                let core = core.clone();
                thread::spawn(move || core.send(lane, msg))
            })
            .collect();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let [urgent, bulk] = &core.lanes;
            while let Some(m) = urgent.pop() {
                seen.push(m);
            }
            if let Some(m) = bulk.pop() {
                while let Some(u) = urgent.pop() {
                    seen.push(u);
                }
                seen.push(m);
                continue;
            }
            if seen.len() == 2 {
                break;
            }
            let asleep = if first_lane_only {
                urgent.try_sleep()
            } else {
                try_sleep_both(urgent, bulk)
            };
            if asleep {
                core.park();
                awake_both(urgent, bulk);
            } else {
                thread::yield_now();
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        seen.sort_unstable();
        assert_eq!(seen, [1, 2], "each message exactly once");
    });
}

#[test]
fn two_lanes_no_lost_wakeup() {
    model(false);
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn first_lane_only_is_caught() {
    model(true);
}
