//! The executors' latency-ring timer, as kvroute's glommio patch keeps it: tests only.
//!
//! glommio keeps one timer at a time on each executor's latency ring: the preemption
//! timer while a task queue runs (its expiry makes `need_preempt` true), the next user
//! timer (a `glommio::timer::sleep`, a periodic probe) while the executor parks.
//! Upstream cancels and re-arms it on every turn of the executor loop and twice per
//! park; kvroute's patch (`vendor/glommio/KVROUTE_PATCH.md`, "The latency ring's timer
//! stays armed while it fires in time") keeps the timer in flight when it already fires
//! when the new one should: no later, and, before a park, at most 200 µs sooner.
//!
//! Guarantees, checked here through the running executor: a task queue that never
//! yields on its own is still preempted, and a user timer still wakes a parked
//! executor, at its deadline and not before, whichever timer was kept.

#[cfg(test)]
mod tests {
    use glommio::{timer::sleep, LocalExecutorBuilder, Placement};
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    /// Liveness bound: far beyond any deadline here, so a pass never depends on speed.
    const BOUND: Duration = Duration::from_secs(20);

    fn run<F, T>(preempt: Duration, f: impl FnOnce() -> F + Send + 'static) -> T
    where
        F: std::future::Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let ex = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(preempt)
            .spawn(f);
        match ex {
            Ok(h) => match h.join() {
                Ok(v) => v,
                Err(e) => panic!("executor: {e:?}"),
            },
            Err(e) => panic!("no executor: {e}"),
        }
    }

    /// A task that only yields when `need_preempt` says so lets a timer task run: the
    /// preemption timer fires though turns keep (not re-arm) the one in flight.
    #[test]
    fn a_busy_task_queue_is_still_preempted_for_a_timer() {
        let (spins, waited) = run(Duration::from_millis(5), || async {
            let done = Rc::new(Cell::new(false));
            let flag = done.clone();
            let start = Instant::now();
            let timer = glommio::spawn_local(async move {
                sleep(Duration::from_millis(20)).await;
                flag.set(true);
                start.elapsed()
            });
            let mut spins = 0u64;
            while !done.get() && start.elapsed() < BOUND {
                spins += 1;
                if glommio::executor().need_preempt() {
                    glommio::yield_if_needed().await;
                }
            }
            (spins, timer.await)
        });
        assert!(spins > 0);
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert!(waited < BOUND, "the timer task never ran: {waited:?}");
    }

    /// A parked executor wakes for its user timer, at its deadline and not before,
    /// while messages from another executor wake it many times first: each of those
    /// parks keeps the same timer in flight.
    #[test]
    fn a_timer_kept_across_parks_still_wakes_its_executor() {
        let (tx, rx) = glommio::channels::shared_channel::new_bounded::<u32>(4);
        let sender = LocalExecutorBuilder::new(Placement::Unbound).spawn(|| async move {
            let tx = tx.connect().await;
            for i in 0..40 {
                sleep(Duration::from_millis(1)).await;
                if tx.send(i).await.is_err() {
                    break;
                }
            }
        });
        let (got, long) = run(Duration::from_millis(100), || async move {
            let rx = rx.connect().await;
            let start = Instant::now();
            let long = glommio::spawn_local(async move {
                sleep(Duration::from_millis(80)).await;
                start.elapsed()
            });
            let mut got = 0;
            while rx.recv().await.is_some() {
                got += 1;
            }
            (got, long.await)
        });
        if let Ok(h) = sender {
            let _ = h.join();
        }
        assert_eq!(got, 40);
        assert!(long >= Duration::from_millis(80), "{long:?}");
        assert!(long < BOUND, "{long:?}");
    }

    /// A parked executor wakes for each user timer, at its deadline and not before,
    /// while short sleeps (parks with a nearer timer) come and go.
    #[test]
    fn a_parked_executor_wakes_for_its_timers_in_turn() {
        let results = run(Duration::from_millis(100), || async {
            let start = Instant::now();
            let long = glommio::spawn_local(async move {
                sleep(Duration::from_millis(60)).await;
                start.elapsed()
            });
            // Parks of ~1 ms, each with the long sleep as the next timer but one.
            let mut short = vec![];
            for _ in 0..30 {
                let t = Instant::now();
                sleep(Duration::from_millis(1)).await;
                short.push(t.elapsed());
            }
            (short, long.await)
        });
        let (short, long) = results;
        for s in &short {
            assert!(*s >= Duration::from_millis(1), "a sleep ended early: {s:?}");
            assert!(*s < BOUND);
        }
        assert!(long >= Duration::from_millis(60), "{long:?}");
        assert!(long < BOUND, "{long:?}");
    }
}
