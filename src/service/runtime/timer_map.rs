//! The executors' timer map, as kvroute's glommio patch keeps it: tests only.
//!
//! Every glommio timer a task waits on (`glommio::timer::sleep`, a connection's
//! deadline) is an entry of its executor's ordered map, keyed by deadline. Upstream
//! split that map on every pass of the executor loop to take the timers due, and
//! removed and re-inserted a timer each time it was polled. kvroute's patch
//! (`vendor/glommio/KVROUTE_PATCH.md`, "Due timers are taken from the front") pops the
//! due timers from the front instead, and a timer polled again with its deadline
//! unchanged keeps its entry, its waker replaced only when another task polls it.
//!
//! Guarantees, checked here through the running executor: every timer fires, not
//! before its deadline, whatever order timers were set, polled again or dropped in; a
//! timer dropped first never wakes anything; a timer polled last by another task wakes
//! that task.

#[cfg(test)]
mod tests {
    use glommio::timer::{sleep, Timer};
    use glommio::{LocalExecutorBuilder, Placement};
    use std::cell::RefCell;
    use std::future::Future;
    use std::pin::Pin;
    use std::rc::Rc;
    use std::sync::mpsc;
    use std::task::Poll;
    use std::time::{Duration, Instant};

    /// Liveness bound: far beyond any deadline here, so a pass never depends on speed.
    /// A lost wake-up leaves the executor parked for good, so the bound is kept by a
    /// thread outside it.
    const BOUND: Duration = Duration::from_secs(20);

    fn run<F, T>(f: impl FnOnce() -> F + Send + 'static) -> T
    where
        F: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let ex = LocalExecutorBuilder::new(Placement::Unbound).spawn(move || async move {
            let _ = tx.send(f().await);
        });
        if let Err(e) = ex {
            panic!("no executor: {e}");
        }
        match rx.recv_timeout(BOUND) {
            Ok(v) => v,
            Err(e) => panic!("the executor did not finish in {BOUND:?}: {e}"),
        }
    }

    /// Timers set in shuffled order, a third of them dropped before they are due and
    /// the rest polled many times while pending: each of the rest fires, none before
    /// its deadline.
    #[test]
    fn timers_fire_in_time_however_they_were_set_polled_or_dropped() {
        let late = run(|| async {
            let start = Instant::now();
            let mut tasks = vec![];
            for i in 0..120u64 {
                // Deadlines 1..=40 ms, in an order that is not sorted.
                let ms = 1 + (i * 37) % 40;
                let dropped = i % 3 == 0;
                tasks.push(glommio::spawn_local(async move {
                    let mut t = Timer::new(Duration::from_millis(ms));
                    let mut polls = 0;
                    let fired = std::future::poll_fn(|cx| {
                        polls += 1;
                        if dropped && polls > 2 {
                            return Poll::Ready(false);
                        }
                        match Pin::new(&mut t).poll(cx) {
                            Poll::Ready(_) => Poll::Ready(true),
                            Poll::Pending => {
                                // Polled again at once, a few times: same deadline.
                                if polls < 5 {
                                    cx.waker().wake_by_ref();
                                }
                                Poll::Pending
                            }
                        }
                    })
                    .await;
                    (ms, fired, start.elapsed())
                }));
            }
            let mut out = vec![];
            for t in tasks {
                out.push(t.await);
            }
            out
        });
        let mut fired = 0;
        for (ms, did, at) in late {
            if did {
                fired += 1;
                assert!(at >= Duration::from_millis(ms), "{ms} ms timer at {at:?}");
            }
        }
        assert_eq!(fired, 80);
    }

    /// A timer polled by one task and then by another wakes the second when it fires.
    #[test]
    fn a_timer_polled_by_another_task_wakes_that_task() {
        let waited = run(|| async {
            let start = Instant::now();
            let timer = Rc::new(RefCell::new(Timer::new(Duration::from_millis(30))));
            // The first task polls it once (its waker is registered), then ends.
            let first = timer.clone();
            glommio::spawn_local(async move {
                std::future::poll_fn(|cx| {
                    let _ = Pin::new(&mut *first.borrow_mut()).poll(cx);
                    Poll::Ready(())
                })
                .await;
            })
            .await;
            // The second waits on the same timer, same deadline: only its waker wakes.
            let second = glommio::spawn_local(async move {
                std::future::poll_fn(|cx| Pin::new(&mut *timer.borrow_mut()).poll(cx)).await;
                start.elapsed()
            });
            second.await
        });
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
    }

    /// Short sleeps on a loop that also keeps many far timers pending: the due ones
    /// are taken from the front without disturbing the rest, which fire later.
    #[test]
    fn due_timers_are_taken_and_the_rest_stay() {
        let (short, long) = run(|| async {
            let start = Instant::now();
            let far: Vec<_> = (0..50u64)
                .map(|i| {
                    glommio::spawn_local(async move {
                        let ms = 40 + i % 7;
                        sleep(Duration::from_millis(ms)).await;
                        (ms, start.elapsed())
                    })
                })
                .collect();
            let mut short = vec![];
            for _ in 0..20 {
                let t = Instant::now();
                sleep(Duration::from_millis(1)).await;
                short.push(t.elapsed());
            }
            let mut long = vec![];
            for f in far {
                long.push(f.await);
            }
            (short, long)
        });
        for s in short {
            assert!(s >= Duration::from_millis(1), "{s:?}");
        }
        for (ms, at) in long {
            assert!(at >= Duration::from_millis(ms), "{ms} ms timer at {at:?}");
        }
    }
}
