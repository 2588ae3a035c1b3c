//! Sleeps that end when they are due, not on the next millisecond.
//!
//! tokio's timer wheel has a resolution of one millisecond: `tokio::time::sleep_until(t)`
//! completes on the first tick of its runtime at or after `t`. For the simulated fleet
//! and the replay client that rounding is not harmless:
//! - a simulated worker whose first token is due 100 µs after a request arrives answers
//!   on its runtime's next tick, up to 1 ms later;
//! - the replay client, pacing its requests with `sleep_until`, sends them on its own
//!   ticks (at 5,000 requests/s, five at once every millisecond).
//!
//! Between two processes the ticks keep a fixed phase for a whole run, so a router's
//! hop between client and worker was rounded up to a whole worker tick or down to none,
//! depending on that phase and on a few tens of µs of the router's own time: the
//! "added latency" of a proxy measured this way was a property of the phase, not of the
//! proxy (docs/PERFORMANCE.md, "Proxy overhead").
//!
//! This module keeps each deadline as given. One timer thread per process holds a heap
//! of (deadline, waker) and waits on a condition variable with a timeout, which Linux
//! implements with a high-resolution timer; the thread's timer slack is set to 1 µs so
//! the kernel does not coalesce its wake-ups by the default 50 µs. A sleep ends
//! within the wake-up latency of that thread and of the waiting task's runtime, the
//! same for every request, instead of somewhere within a millisecond.
//!
//! Guarantees: a `sleep_until` future completes at or after its deadline (never
//! before); entries of futures dropped before their deadline are discarded when due;
//! the heap holds at most one entry per pending poll, so it stays bounded by the
//! number of sleeping tasks.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// Completes at `at` (a tokio instant, so call sites keep tokio's types).
pub fn sleep_until(at: tokio::time::Instant) -> Sleep {
    Sleep {
        at: at.into_std(),
        armed: None,
    }
}

/// The future of [`sleep_until`].
pub struct Sleep {
    at: Instant,
    /// The waker registered with the timer thread, if any.
    armed: Option<Waker>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        // Polled again before the timer fired (spuriously, or by a select): the entry
        // already in the heap wakes this task, unless the task's waker changed.
        if !self.armed.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            timer().add(self.at, cx.waker().clone());
            self.armed = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

struct Entry {
    at: Instant,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest deadline first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

struct Timer {
    state: Mutex<State>,
    cv: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        }));
        // If the thread cannot be started, sleeps still complete: `add` then wakes the
        // task at once and the future polls the clock until due (a busy wait, but
        // correct).
        let started = std::thread::Builder::new()
            .name("sim-clock".into())
            .spawn(move || t.run());
        if started.is_err() {
            eprintln!("kvroute-sim: no timer thread; sleeps fall back to polling");
        }
        t
    })
}

impl Timer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, at: Instant, waker: Waker) {
        let mut st = self.lock();
        let earliest = st.heap.peek().is_none_or(|e| at < e.at);
        st.seq += 1;
        let seq = st.seq;
        st.heap.push(Entry { at, seq, waker });
        drop(st);
        if earliest {
            self.cv.notify_one();
        }
    }

    fn run(&self) {
        // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        let mut due = Vec::new();
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            while st.heap.peek().is_some_and(|e| e.at <= now) {
                if let Some(e) = st.heap.pop() {
                    due.push(e.waker);
                }
            }
            if !due.is_empty() {
                drop(st);
                for w in due.drain(..) {
                    w.wake();
                }
                st = self.lock();
                continue;
            }
            st = match st.heap.peek().map(|e| e.at - now) {
                Some(wait) => {
                    self.cv
                        .wait_timeout(st, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn never_completes_before_its_deadline() {
        rt().block_on(async {
            for us in [0u64, 1, 50, 120, 700, 1_500] {
                let at = tokio::time::Instant::now() + Duration::from_micros(us);
                sleep_until(at).await;
                assert!(tokio::time::Instant::now() >= at, "{us} µs");
            }
        });
    }

    #[test]
    fn many_sleepers_wake_in_deadline_order() {
        rt().block_on(async {
            let base = tokio::time::Instant::now() + Duration::from_millis(2);
            let order = std::sync::Arc::new(Mutex::new(Vec::new()));
            let mut hs = Vec::new();
            for i in (0..20u64).rev() {
                let o = order.clone();
                hs.push(tokio::spawn(async move {
                    sleep_until(base + Duration::from_micros(300 * i)).await;
                    o.lock().unwrap().push(i);
                }));
            }
            for h in hs {
                h.await.unwrap();
            }
            let got = order.lock().unwrap().clone();
            assert_eq!(got, (0..20).collect::<Vec<_>>());
        });
    }

    #[test]
    fn a_dropped_sleep_does_not_disturb_the_others() {
        rt().block_on(async {
            let far = tokio::time::Instant::now() + Duration::from_millis(1);
            let _ = tokio::time::timeout(Duration::from_micros(10), sleep_until(far)).await;
            let near = tokio::time::Instant::now() + Duration::from_micros(200);
            sleep_until(near).await;
            assert!(tokio::time::Instant::now() >= near);
        });
    }
}
