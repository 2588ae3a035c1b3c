//! A core's message loop: feeds [`Core::handle`] from the core's two inboxes
//! (`msg::Lane`), publishes load figures, flushes the outbox, parks when idle.
//!
//! Guarantees:
//! - every urgent message (routing queries, answers, commits, lifecycle, active
//!   blocks, forgets) announced before a bulk message is handled before it: a routing
//!   query waits behind at most one index batch, and every event source (binary,
//!   JSON, ZMQ) caps a batch at `index_batch::BATCH_HASHES` hashes;
//! - within a batch, a shard applies at most `ingest_slice_hashes` of its hashes
//!   between two looks at its urgent inbox (`ingest_slice`), so a routing query from
//!   another core waits behind at most one slice of ingest, whatever the batch size;
//!   bulk messages are still handled one at a time, each to its end, in order;
//! - the loop yields after every bulk message to the tasks of its queue (a routing
//!   task whose answer just arrived), and lets the executor poll its rings at least
//!   every [`BULK_SLICE`] of bulk work, and whenever a socket receive has completed
//!   (`glommio::yield_if_needed`), so connections keep being served while an index
//!   backlog drains;
//! - it parks on the doorbell only when both inboxes are empty and asleep
//!   (`sync::lanes`, loom-checked): no lost wake-up, spurious wake-ups are harmless;
//! - at shutdown it returns once in-flight work is done (or after 5 s).

use super::core::Core;
use super::msg::{Lane, Msg};
use crate::sync::lanes::{awake_both, try_sleep_both};
use crate::sync::mailbox::Mailbox;
use futures_lite::AsyncReadExt;
use glommio::net::UnixStream;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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
                    // one worker's batches keep their order (`ingest_slice`).
                    while core.apply_index_slice(&mut cur, slice_hashes) {
                        if !urgent.is_empty() {
                            n += drain_urgent(&core, urgent).await;
                            // Let the routing tasks those messages woke run.
                            futures_lite::future::yield_now().await;
                        }
                        if slice.elapsed() >= BULK_SLICE {
                            core.publish();
                            core.flush();
                            super::conn::yield_to_poll().await;
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
                super::conn::yield_to_poll().await;
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
        if n == 0 && try_sleep_both(urgent, bulk) {
            let _ = bell.read(&mut buf).await;
            awake_both(urgent, bulk);
        } else if n > 0 {
            glommio::yield_if_needed().await;
        } else {
            // A message is announced but not yet in the queue: let other tasks run.
            futures_lite::future::yield_now().await;
        }
    }
}
