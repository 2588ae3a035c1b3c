//! loom models of the cross-core protocols built on `sync::mailbox::Mailbox`.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release
//! --no-default-features --test loom_mailbox` (or `.ci/extra`).
//!
//! Each core's doorbell (a Unix socket in the service; writing a byte to a full socket
//! is a no-op because a wake-up is already pending) is modelled as a loom mutex-guarded
//! count of pending rings with a condvar: a parked consumer is blocked, not spinning, so
//! it adds no branches to an execution (a spinning park made the hand-off and gather
//! models exceed loom's branch budget). A consumer parked when every sender has finished
//! and no ring is pending can never wake: the model fails with "lost wake-up" (messages
//! left queued) or "message lost" (nothing queued: a message was never delivered). Cores
//! send from an outbox like `Core::post`/`Core::flush`: a full mailbox keeps the message
//! at the front and the core retries on its next turn. The models (preemption bound 3,
//! a few seconds each in release):
//! - `mailbox_*`: two producers, one consumer (drain, `try_sleep`, park, `awake`); every
//!   message received exactly once, in per-producer order, no lost wake-up;
//! - `quiet`: quiet messages (`push_quiet`, no doorbell) before and after a plain one;
//!   the plain ones wake the consumer, the quiet one before them arrives with them.
//!   Caught fault: `QuietClearsFlag` (lost wake-up);
//! - `shard_handoff`: an ingest core flushes one worker's ordered batch (3 ops for shard
//!   0, 1 for shard 1) into two shard mailboxes of capacity 1, so the hand-off also goes
//!   through backpressure; each shard applies its part in order. Caught faults:
//!   `SkipRecheck` (lost wake-up) and an outbox that skips a blocked message and sends
//!   the rest (order lost);
//! - `gather`: a routing query scattered to two shard cores, whose replies come back
//!   through the requester's mailbox of capacity 1 (the second reply may find it full and
//!   be retried); the requester sees every reply exactly once. Caught faults:
//!   `SkipRecheck` (lost wake-up) and an outbox that drops a reply on a full mailbox
//!   (message lost);
//! - `generation_swap`: a writer bumps a worker's generation then enqueues Forget while an
//!   ingest connection enqueues a Stored tagged with the generation it read; the shard
//!   drops messages of a stale generation, so nothing of an old generation is applied
//!   after the Forget;
//! - `shutdown`: flag + doorbell; the consumer exits only after draining, nothing sent
//!   before the flag is lost.
//!
//! Each model has an `*_is_caught` twin that injects a bug (`kvroute::sync::faults`, or
//! a test-local variant where the logic lives in the service) and expects loom to fail.
//! Note: loom treats `SeqCst` accesses as `AcqRel` and the loom mailbox queue is a
//! linearizable mutex-protected queue, so these models check the protocol's logic (flag
//! raised, then queue re-checked; push, then flag swapped), not the hardware-level
//! store-buffering argument for `SeqCst` documented in `sync::mailbox`.
#![cfg(loom)]

use kvroute::sync::faults::{self, Fault};
use kvroute::sync::mailbox::Mailbox;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use std::collections::VecDeque;

/// A core's inbox: the mailbox plus its doorbell.
struct Inbox<T> {
    mb: Mailbox<T>,
    bell: Mutex<Bell>,
    rung: Condvar,
    /// Threads that will send to this inbox.
    senders: usize,
}

/// The doorbell socket: rings not yet consumed, and how many senders have finished.
#[derive(Default)]
struct Bell {
    pending: usize,
    finished: usize,
}

impl<T> Inbox<T> {
    fn new(capacity: usize, senders: usize) -> Self {
        Inbox {
            mb: Mailbox::new(capacity),
            bell: Mutex::new(Bell::default()),
            rung: Condvar::new(),
            senders,
        }
    }

    fn ring(&self) {
        self.bell.lock().unwrap().pending += 1;
        self.rung.notify_all();
    }

    /// `Shared::try_send`: enqueue, ring iff `push` says the consumer may be parked.
    fn send(&self, msg: T) {
        match self.mb.push(msg) {
            Ok(true) => self.ring(),
            Ok(false) => {}
            Err(_) => panic!("mailbox full in a model sized not to fill"),
        }
    }

    /// A sender is done sending.
    fn sender_done(&self) {
        self.bell.lock().unwrap().finished += 1;
        self.rung.notify_all();
    }

    /// Blocks on the doorbell (a blocked loom thread costs no branches, unlike a spin
    /// loop); consumes every pending ring. Once every sender is done and no ring is
    /// pending, nothing can wake the consumer any more: parking then is a lost wake-up
    /// (reported here rather than as a loom deadlock, whose unwinding aborts the test
    /// process).
    fn park(&self) {
        let mut bell = self.bell.lock().unwrap();
        loop {
            if bell.pending > 0 {
                bell.pending = 0;
                return;
            }
            if bell.finished == self.senders {
                drop(bell);
                let queued = self.mb.len();
                if queued == 0 {
                    panic!("message lost: parked waiting for a message no sender will send");
                }
                panic!(
                    "lost wake-up: parked with {queued} message(s) queued and no doorbell pending"
                );
            }
            bell = self.rung.wait(bell).unwrap();
        }
    }

    /// The run loop's receive path: pop, or announce sleep, park and wake.
    fn next(&self) -> T {
        loop {
            if let Some(m) = self.mb.pop() {
                return m;
            }
            if self.mb.try_sleep() {
                self.park();
                self.mb.awake();
            } else {
                // Announced but not yet pushed: retry (the service yields its task).
                thread::yield_now();
            }
        }
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    // The retry paths (announced but not yet pushed; peer mailbox full) spin with
    // yield: a few more branches per execution.
    b.max_branches = b.max_branches.max(5_000);
    b.check(f);
}

fn with_fault(f: Fault, body: impl FnOnce()) {
    faults::inject(f);
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            faults::inject(Fault::None);
        }
    }
    let _reset = Reset;
    body();
}

// ---- mailbox ---------------------------------------------------------------------

/// Message `i` of producer `p`.
type Tagged = (usize, u32);

/// A producer thread: `sends`, then done.
fn producer<T: Send + 'static>(
    inbox: &Arc<Inbox<T>>,
    sends: impl FnOnce(&Inbox<T>) + Send + 'static,
) -> thread::JoinHandle<()> {
    let inbox = inbox.clone();
    thread::spawn(move || {
        sends(&inbox);
        inbox.sender_done();
    })
}

/// Checks that `(p, i)` is producer `p`'s next message and counts it.
fn in_order((p, i): Tagged, next: &mut [u32; 2]) {
    assert_eq!(i, next[p], "producer {p}: message out of order or repeated");
    next[p] += 1;
}

fn mailbox_model() {
    model(|| {
        let inbox = Arc::new(Inbox::new(4, 2));
        let a = producer(&inbox, |i| {
            i.send((0, 0));
            i.send((0, 1));
        });
        let b = producer(&inbox, |i| i.send((1, 0)));
        let mut next = [0u32; 2];
        for _ in 0..3 {
            in_order(inbox.next(), &mut next);
        }
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(next, [2, 1]);
        assert!(inbox.mb.pop().is_none(), "a message was delivered twice");
    });
}

#[test]
fn mailbox_no_lost_wakeup() {
    mailbox_model();
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn mailbox_skip_recheck_is_caught() {
    with_fault(Fault::SkipRecheck, mailbox_model);
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn mailbox_flag_before_push_is_caught() {
    with_fault(Fault::FlagBeforePush, mailbox_model);
}

/// Quiet messages (`Mailbox::push_quiet`) among plain ones: producer 0 sends quiet,
/// plain, quiet; producer 1 one plain. The consumer waits for the plain ones only; the
/// first quiet one comes with them, the last may be left queued, never lost.
fn quiet_model() {
    model(|| {
        let inbox = Arc::new(Inbox::new(4, 2));
        let a = producer(&inbox, |i| {
            i.mb.push_quiet((0, 0)).unwrap();
            i.send((0, 1));
            i.mb.push_quiet((0, 2)).unwrap();
        });
        let b = producer(&inbox, |i| i.send((1, 0)));
        let mut next = [0u32; 2];
        while next[0] < 2 || next[1] < 1 {
            in_order(inbox.next(), &mut next);
        }
        a.join().unwrap();
        b.join().unwrap();
        while let Some(m) = inbox.mb.pop() {
            in_order(m, &mut next);
        }
        assert_eq!(next, [3, 1]);
    });
}

#[test]
fn quiet_messages_delay_no_plain_message() {
    quiet_model();
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn quiet_clears_flag_is_caught() {
    with_fault(Fault::QuietClearsFlag, quiet_model);
}

// ---- outbox (`Core::post` / `Core::flush`) ----------------------------------------

/// How an outbox treats a message whose destination mailbox is full.
#[derive(Clone, Copy, PartialEq)]
enum OnFull {
    /// The service (`Core::flush`): the message stays at the front and flushing stops
    /// until the next run-loop turn (head-of-line blocking keeps per-destination order).
    KeepAtFront,
    /// Injected bug: re-queue it behind the others and go on sending the rest.
    SkipBlocked,
    /// Injected bug: fire and forget (`let _ = try_send(..)`).
    Drop,
}

/// A core's outbox: messages posted by its handlers, in order, to be sent to peers.
struct Outbox<T> {
    q: VecDeque<(usize, T)>,
    on_full: OnFull,
}

impl<T> Outbox<T> {
    fn new(on_full: OnFull) -> Self {
        Outbox {
            q: VecDeque::new(),
            on_full,
        }
    }

    fn post(&mut self, to: usize, msg: T) {
        self.q.push_back((to, msg));
    }

    /// Sends what the mailboxes accept (ringing doorbells as `Shared::try_send` does);
    /// true once the outbox is empty.
    fn flush(&mut self, peers: &[&Inbox<T>]) -> bool {
        for _ in 0..self.q.len() {
            let Some((to, msg)) = self.q.pop_front() else {
                break;
            };
            match peers[to].mb.push(msg) {
                Ok(true) => peers[to].ring(),
                Ok(false) => {}
                Err(msg) => match self.on_full {
                    OnFull::KeepAtFront => {
                        self.q.push_front((to, msg));
                        return false;
                    }
                    OnFull::SkipBlocked => self.q.push_back((to, msg)),
                    OnFull::Drop => {}
                },
            }
        }
        self.q.is_empty()
    }

    /// The run loop retrying a blocked flush (the service sleeps 20 µs in between).
    fn flush_all(&mut self, peers: &[&Inbox<T>]) {
        while !self.flush(peers) {
            thread::yield_now();
        }
    }
}

// ---- shard hand-off --------------------------------------------------------------

/// One worker's ordered batch of index operations, as ingest fans it out: (owning
/// shard, op). Shard 0 must apply 1, 2, 3 in that order; shard 1 gets op 1.
const BATCH: [(usize, u32); 4] = [(0, 1), (0, 2), (1, 1), (0, 3)];

/// The ingest core posts the batch to its outbox and flushes it into two shard
/// mailboxes of capacity 1, so shard 0's mailbox is full whenever its core lags: the
/// hand-off goes through backpressure (blocked flush, retry) as well as the sleep/wake
/// protocol.
fn handoff_model(on_full: OnFull) {
    model(move || {
        let shards = [Arc::new(Inbox::new(1, 1)), Arc::new(Inbox::new(1, 1))];
        let consumers: Vec<_> = shards
            .iter()
            .enumerate()
            .map(|(id, s)| {
                let s = s.clone();
                thread::spawn(move || {
                    let want: Vec<u32> = BATCH
                        .iter()
                        .filter(|(to, _)| *to == id)
                        .map(|&(_, op)| op)
                        .collect();
                    let applied: Vec<u32> = want.iter().map(|_| s.next()).collect();
                    assert_eq!(applied, want, "per-worker order lost on shard {id}");
                })
            })
            .collect();
        let mut out = Outbox::new(on_full);
        for (shard, op) in BATCH {
            out.post(shard, op);
        }
        out.flush_all(&[&shards[0], &shards[1]]);
        for s in &shards {
            s.sender_done();
        }
        for c in consumers {
            c.join().unwrap();
        }
    });
}

#[test]
fn shard_handoff_keeps_order() {
    handoff_model(OnFull::KeepAtFront);
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn shard_handoff_skip_recheck_is_caught() {
    with_fault(Fault::SkipRecheck, || handoff_model(OnFull::KeepAtFront));
}

#[test]
#[should_panic(expected = "per-worker order lost")]
fn shard_handoff_skip_blocked_is_caught() {
    handoff_model(OnFull::SkipBlocked);
}

// ---- scatter/gather --------------------------------------------------------------

enum Msg {
    Query { qid: u64, part: usize },
    Reply { qid: u64, part: usize, answer: u64 },
}

/// The requester's completion state: one slot per shard part and a countdown.
struct Gather {
    qid: u64,
    remaining: usize,
    slots: Vec<Option<u64>>,
}

impl Gather {
    fn deliver(&mut self, qid: u64, part: usize, answer: u64) {
        assert_eq!(qid, self.qid, "reply for another query");
        assert!(self.slots[part].is_none(), "part {part} delivered twice");
        self.slots[part] = Some(answer);
        self.remaining -= 1;
    }
}

/// A routing query scattered to two shard cores; each answers through its outbox into
/// the requester's mailbox, of capacity 1, so the second reply meets a full mailbox
/// whenever the requester lags and must be retried.
fn gather_model(on_full: OnFull) {
    model(move || {
        // Inbox index 0 = requester, 1 and 2 = shards (outbox destinations).
        let requester = Arc::new(Inbox::new(1, 2));
        let shards = [Arc::new(Inbox::new(1, 1)), Arc::new(Inbox::new(1, 1))];
        let workers: Vec<_> = shards
            .iter()
            .enumerate()
            .map(|(id, inbox)| {
                let (inbox, requester) = (inbox.clone(), requester.clone());
                thread::spawn(move || {
                    let mut out = Outbox::new(on_full);
                    match inbox.next() {
                        Msg::Query { qid, part } => out.post(
                            0,
                            Msg::Reply {
                                qid,
                                part,
                                answer: 100 + id as u64,
                            },
                        ),
                        Msg::Reply { .. } => panic!("shard got a reply"),
                    }
                    out.flush_all(&[&requester]);
                    requester.sender_done();
                })
            })
            .collect();
        // Scatter.
        let mut g = Gather {
            qid: 7,
            remaining: 2,
            slots: vec![None; 2],
        };
        for (part, s) in shards.iter().enumerate() {
            s.send(Msg::Query { qid: 7, part });
            s.sender_done();
        }
        // Gather.
        while g.remaining > 0 {
            match requester.next() {
                Msg::Reply { qid, part, answer } => g.deliver(qid, part, answer),
                Msg::Query { .. } => panic!("requester got a query"),
            }
        }
        assert_eq!(g.slots, [Some(100), Some(101)]);
        for w in workers {
            w.join().unwrap();
        }
        assert!(
            requester.mb.pop().is_none(),
            "a reply arrived after completion"
        );
    });
}

#[test]
fn gather_sees_every_reply_once() {
    gather_model(OnFull::KeepAtFront);
}

#[test]
#[should_panic(expected = "lost wake-up")]
fn gather_skip_recheck_is_caught() {
    with_fault(Fault::SkipRecheck, || gather_model(OnFull::KeepAtFront));
}

#[test]
#[should_panic(expected = "message lost")]
fn gather_dropped_reply_is_caught() {
    gather_model(OnFull::Drop);
}

// ---- worker generation swap ------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Stored(u64),
    Forget,
}

/// `check_gen = false` is the injected bug: the shard applies whatever it receives.
fn generation_model(check_gen: bool) {
    model(move || {
        let gen = Arc::new(AtomicU64::new(0));
        let shard = Arc::new(Inbox::new(4, 2));
        // An ingest connection: reads the binding's generation, tags its message with it.
        let read = gen.clone();
        let ingest = producer(&shard, move |s| {
            s.send((read.load(Ordering::Acquire), Op::Stored(42)));
        });
        // Control plane: the worker restarted. Bump, then tell the shard to forget.
        let bump = gen.clone();
        let control = producer(&shard, move |s| {
            s.send((bump.fetch_add(1, Ordering::AcqRel) + 1, Op::Forget));
        });
        // The shard (`Core::apply_index`): drop messages of a stale generation.
        let mut blocks = Vec::new();
        let mut forgot_at: Option<u64> = None;
        for _ in 0..2 {
            let (g, op) = shard.next();
            if check_gen && gen.load(Ordering::Acquire) != g {
                continue;
            }
            if let Some(f) = forgot_at {
                assert!(
                    g >= f,
                    "{op:?} of generation {g} applied after Forget of {f}"
                );
            }
            match op {
                Op::Stored(h) => blocks.push((g, h)),
                Op::Forget => {
                    blocks.clear();
                    forgot_at = Some(g);
                }
            }
        }
        ingest.join().unwrap();
        control.join().unwrap();
        assert_eq!(forgot_at, Some(1), "the Forget must always apply");
        assert!(
            blocks.iter().all(|&(g, _)| g == 1),
            "old blocks survived: {blocks:?}"
        );
    });
}

#[test]
fn generation_swap_drops_stale_messages() {
    generation_model(true);
}

#[test]
#[should_panic(expected = "applied after Forget")]
fn generation_swap_without_check_is_caught() {
    generation_model(false);
}

// ---- shutdown --------------------------------------------------------------------

/// `recheck = false` is the injected bug: the consumer exits as soon as it sees the flag.
fn shutdown_model(recheck: bool) {
    model(move || {
        let inbox = Arc::new(Inbox::new(4, 1));
        let stop = Arc::new(AtomicBool::new(false));
        let raise = stop.clone();
        let sender = producer(&inbox, move |i| {
            i.send(1u32);
            i.send(2);
            // `Running::shutdown`: raise the flag, then wake every core.
            raise.store(true, Ordering::SeqCst);
            i.ring();
        });
        // `run_loop`, minus in-flight tracking (the service loads the flag with Acquire).
        let mut got = Vec::new();
        loop {
            let mut n = 0;
            while let Some(m) = inbox.mb.pop() {
                got.push(m);
                n += 1;
            }
            if stop.load(Ordering::Relaxed) {
                if !recheck || inbox.mb.is_empty() {
                    break;
                }
                continue;
            }
            if n == 0 {
                if inbox.mb.try_sleep() {
                    inbox.park();
                    inbox.mb.awake();
                } else {
                    thread::yield_now();
                }
            }
        }
        sender.join().unwrap();
        assert_eq!(got, [1, 2], "a message sent before shutdown was lost");
    });
}

#[test]
fn shutdown_drains_before_exit() {
    shutdown_model(true);
}

#[test]
#[should_panic(expected = "lost")]
fn shutdown_without_recheck_is_caught() {
    shutdown_model(false);
}
