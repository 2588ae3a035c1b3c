//! A core's message loop: feeds [`Core::handle`] from the core's two inboxes
//! (`msg::Lane`), publishes load figures, flushes the outbox, parks when idle.
//!
//! Guarantees:
//! - every urgent message (routing queries, answers, commits, lifecycle, active
//!   blocks, forgets) announced before a bulk message is handled before it: a routing
//!   query waits behind at most one index batch, and every event source (binary,
//!   JSON, ZMQ) caps a batch at `index_batch::BATCH_HASHES` hashes;
//! - within a batch, a shard applies at most `ingest_slice_hashes` of its hashes
//!   between two looks at its urgent inbox (`runtime::ingest_slice`), so a routing query from
//!   another core waits behind at most one slice of ingest, whatever the batch size;
//!   bulk messages are still handled one at a time, each to its end, in order;
//! - the loop yields after every bulk message to the tasks of its queue (a routing
//!   task whose answer just arrived), and lets the executor poll its rings at least
//!   every [`BULK_SLICE`] of bulk work, and whenever a socket receive has completed
//!   (`glommio::yield_if_needed`), so connections keep being served while an index
//!   backlog drains;
//! - it parks on the doorbell only when both inboxes are empty and asleep
//!   (`sync::lanes`, loom-checked): no lost wake-up, spurious wake-ups are harmless;
//! - while one of this core's cross-core queries is outstanding and younger than
//!   `answer_spin_us`, or a query another core announced (`Msg::Expect`) is still to
//!   come and announced less than that ago (`answer_spin`), it does not park: it keeps polling its inboxes,
//!   between two looks letting the executor run its other tasks, and its rings at
//!   least every [`SPIN_POLL`], so the answer needs no doorbell and no wake-up of
//!   this core.
//!   The inboxes' SLEEPING bits stay down meanwhile, so the protocol is unchanged;
//!   the spin ends at the bound whatever happens;
//! - at shutdown it returns once in-flight work is done (or after 5 s).

use crate::service::metrics::KindLabel;
use crate::service::runtime::answer_spin;
use crate::service::runtime::core::Core;
use crate::service::runtime::msg::{Lane, Msg};
use crate::sync::lanes::{awake_both, try_sleep_both};
use crate::sync::mailbox::Mailbox;
use futures_lite::AsyncReadExt;
use glommio::net::UnixStream;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const PARKED: KindLabel = KindLabel { kind: "parked" };
const PARKED_LONG: KindLabel = KindLabel {
    kind: "parked_long",
};
const SPIN_EXPIRED: KindLabel = KindLabel {
    kind: "spin_expired",
};
const EXPECT_EXPIRED: KindLabel = KindLabel {
    kind: "expect_expired",
};

/// While spinning for an answer, the executor's rings are polled at least this often.
const SPIN_POLL: Duration = Duration::from_micros(20);

/// Urgent messages handled between two yields.
const URGENT_SLICE: usize = 256;

/// Bulk work between two polls of the executor's rings (socket reads and writes).
const BULK_SLICE: Duration = Duration::from_micros(50);

/// Handles every queued urgent message; returns how many.
async fn drain_urgent(core: &Core, urgent: &Mailbox<Msg>) -> usize {
    let mut n = 0usize;
    while let Some(m) = urgent.pop() {
        core.handle(m);
        n += 1;
        if n.is_multiple_of(URGENT_SLICE) {
            core.publish();
            core.flush();
            // Let the tasks these messages woke run (see the bulk loop in `run`).
            futures_lite::future::yield_now().await;
        }
    }
    if n > 0 {
        core.publish();
        core.flush();
    }
    n
}

/// Runs core `core`'s loop until shutdown. `bell` is the read end of its doorbell.
pub async fn run(core: Rc<Core>, bell: std::os::unix::net::UnixStream) {
    // SAFETY: the fd comes from a live std UnixStream we own and give up here.
    let mut bell = unsafe { UnixStream::from_raw_fd(bell.into_raw_fd()) };
    let shared = core.shared.clone();
    let urgent = shared.mailbox(core.id, Lane::Urgent);
    let bulk = shared.mailbox(core.id, Lane::Bulk);
    let mut buf = [0u8; 64];
    let mut shutdown_since: Option<std::time::Instant> = None;
    let slice_hashes = shared.settings.ingest_slice_hashes;
    let mut spare: Vec<u64> = Vec::new();
    let answer_spin = Duration::from_micros(shared.settings.answer_spin_us);
    let spin_before_park = Duration::from_micros(shared.settings.spin_before_park_us);
    // Whether the previous pass spun for an answer (to count a spin that ran out).
    let mut spinning = false;
    // Last pass through the executor's rings (a park, or a poll while spinning).
    let mut spin_poll = Instant::now();
    loop {
        let mut n = drain_urgent(&core, urgent).await;
        let mut slice = Instant::now();
        while let Some(m) = bulk.pop() {
            // Whatever was announced before this message goes first (a Forget before
            // the first batch of a slot's new identity, and every routing query).
            n += drain_urgent(&core, urgent).await;
            n += 1;
            match core.begin_index(m) {
                Err(m) => core.handle(m),
                Ok(mut cur) => {
                    cur.reuse(std::mem::take(&mut spare));
                    // Slice by slice: routing work queued meanwhile waits for at most
                    // `ingest_slice_hashes` of this shard's hashes, not for the batch.
                    // The next bulk message starts only once this one is done, so
                    // one worker's batches keep their order (`runtime::ingest_slice`).
                    while core.apply_index_slice(&mut cur, slice_hashes) {
                        if !urgent.is_empty() {
                            n += drain_urgent(&core, urgent).await;
                            // Let the routing tasks those messages woke run.
                            futures_lite::future::yield_now().await;
                        }
                        if slice.elapsed() >= BULK_SLICE {
                            core.publish();
                            core.flush();
                            crate::service::net::conn::yield_to_poll().await;
                            slice = Instant::now();
                        }
                    }
                    spare = cur.into_buf();
                }
            }
            core.publish();
            core.flush();
            // Unconditional: an urgent message handled above may have woken a local
            // task (a routing query's answer); let it run now.
            futures_lite::future::yield_now().await;
            if slice.elapsed() >= BULK_SLICE {
                // While this loop stays runnable glommio never polls its rings.
                crate::service::net::conn::yield_to_poll().await;
                slice = Instant::now();
            } else {
                glommio::yield_if_needed().await;
            }
        }
        core.publish();
        let flushed = core.flush();
        if shared.shutdown.load(Ordering::Acquire) {
            let since = *shutdown_since.get_or_insert_with(std::time::Instant::now);
            let idle = shared.inflight.load(Ordering::SeqCst) == 0
                && urgent.is_empty()
                && bulk.is_empty()
                && flushed;
            if idle || since.elapsed() > Duration::from_secs(5) {
                return;
            }
            glommio::timer::sleep(Duration::from_millis(1)).await;
            continue;
        }
        if !flushed {
            // A peer's inbox is full: retry shortly, keep draining ours meanwhile.
            glommio::timer::sleep(Duration::from_micros(20)).await;
            continue;
        }
        if n > 0 {
            spinning = false;
        }
        if n == 0 && answer_spin::should_spin(answer_spin) {
            // An answer is on its way: look again soon instead of parking. Between
            // two looks the executor runs this core's other tasks; its rings (socket
            // completions) only every `SPIN_POLL`, since each pass through the
            // reactor costs system calls (io_uring submissions).
            spinning = true;
            if spin_poll.elapsed() >= SPIN_POLL {
                crate::service::net::conn::yield_to_poll().await;
                spin_poll = Instant::now();
            } else {
                futures_lite::future::yield_now().await;
            }
            continue;
        }
        if n == 0 && try_sleep_both(urgent, bulk) {
            let waits = &shared.metrics.answer_waits;
            let awaited = answer_spin::outstanding() > 0;
            if std::mem::take(&mut spinning) && awaited {
                waits.get_or_create(&SPIN_EXPIRED).inc();
            }
            let expired = answer_spin::take_expired();
            if expired > 0 {
                waits.get_or_create(&EXPECT_EXPIRED).inc_by(expired);
            }
            let t0 = awaited.then(Instant::now);
            // Parked, but a task of this core that begins to wait for another core's
            // answer wakes us (locally) to spin for it, and one that queued work in
            // this core's own inbox wakes us to do it. A doorbell byte left unread by
            // the dropped read is a spurious wake-up later.
            let rung = async {
                let _ = bell.read(&mut buf).await;
            };
            futures_lite::future::or(rung, answer_spin::next_wait()).await;
            if let Some(t0) = t0 {
                waits.get_or_create(&PARKED).inc();
                if t0.elapsed() > spin_before_park {
                    waits.get_or_create(&PARKED_LONG).inc();
                }
            }
            awake_both(urgent, bulk);
            spin_poll = Instant::now();
        } else if n > 0 {
            glommio::yield_if_needed().await;
        } else {
            // A message is announced but not yet in the queue: let other tasks run.
            futures_lite::future::yield_now().await;
        }
    }
}
