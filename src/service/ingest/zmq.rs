//! ZMQ ingest of vLLM / SGLang KV events (`[[engines]]` / `--engine`).
//!
//! One plain OS thread per configured endpoint, beside the glommio executors. Each
//! thread speaks ZMTP itself through the bounded, blocking [`crate::zmtp`] client: a SUB
//! connection to the engine's PUB endpoint and, on demand, a DEALER connection to its
//! ROUTER replay endpoint. All decisions (decoding, hashing, the engine-hash map, gaps
//! and replay, what to report) live in the sans-I/O `engines` module; this file only
//! moves frames in and index operations out, through the same mailboxes as every other
//! ingest path (`Msg::Index`, backpressure = retry with short sleeps).
//!
//! Guarantees: the worker is registered through the same registry write as HTTP and the
//! binary protocol; every wait is bounded (connect 1 s per attempt, handshake 1 s,
//! receive polls of 200 ms, replay 2 s per message and 10 s in all) and the thread
//! exits within about 200 ms of shutdown; a misbehaving engine only affects its own
//! worker: a frame header announcing more than `max_engine_message_bytes` (or a message
//! growing past it) closes that connection before the frame is read, is counted
//! (`frame_too_large` / `message_too_large`) and logged, and the subscriber reconnects
//! with backoff (200 ms doubling to 5 s); what happened on the stream (gaps, failed
//! replays, restarts, malformed payloads, block-size mismatches) is logged with the
//! worker, the reason and the action, at most one line per reason per 10 s with the
//! count of suppressed ones; no buffer is kept at the size of a past large message,
//! and after a message of 1 MiB or more the freed pages go back to the OS at once. An
//! endpoint (its DNS name resolved afresh on each connect) without a subscription for
//! `heartbeat_timeout_ms` takes its worker out of routing until it answers again
//! (`zmq_reach`); a thread the engines file started also stops when its entry goes.

use crate::engines::adapter::{Adapter, AdapterStats, Change};
use crate::engines::config::EngineEndpoint;
use crate::engines::notes::LogLimiter;
use crate::engines::stream::{parse_multipart, replay_request, Session, Step, END_SEQ};
use crate::service::ingest::zmq_reach::Reach;
use crate::service::metrics::EngineStreamLabels;
use crate::service::routing::control;
use crate::service::runtime::index_batch::Batch;
use crate::service::runtime::msg::{IndexOp, Msg};
use crate::service::runtime::shared::Shared;
use crate::types::WorkerSlot;
use crate::zmtp::{codec, Conn, ConnError, Limits, ZmtpError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(200);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const REPLAY_MSG_TIMEOUT: Duration = Duration::from_secs(2);
const REPLAY_TOTAL: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// One log line per reason per this window (per worker).
const LOG_WINDOW: Duration = Duration::from_secs(10);
/// Changes buffered during a replay before they are handed to the shards.
const FLUSH_EVERY: usize = 256;
/// Frames in one engine message: `[topic, seq, payload]`, replays `[delim, seq, payload]`.
const MAX_FRAMES: usize = 8;
/// The change buffer keeps at most this capacity between messages.
const KEEP_CHANGES: usize = 4096;
/// After a message at least this large, freed memory is handed back to the OS when the
/// stream goes quiet ([`QUIET_POLLS`]). Not at once: a stream of long prompts would
/// then fault in and zero fresh pages for every message.
const COLLECT_AFTER: usize = 1 << 20;
/// A stream is quiet after this many `POLL`s in a row without a message (2 s): the
/// decoder's kept buffers are freed and owed memory handed back.
const QUIET_POLLS: u32 = 10;

/// Returns the freed pages of this thread's mimalloc heap to the OS. mimalloc purges
/// lazily, on later allocations, and this thread then sits in `recv` allocating
/// nothing: without this a past large message would stay resident.
fn release_memory() {
    // SAFETY: mi_collect takes no pointers and may be called from any thread at any
    // time; with another global allocator it only tidies mimalloc's own (empty) heap.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

fn log(cfg: &EngineEndpoint, msg: &str) {
    eprintln!(
        "kvroute: zmq: worker {:?} ({}): {msg}",
        cfg.worker_id, cfg.endpoint
    );
}

/// Starts one thread per configured engine endpoint.
pub fn start(sh: &Arc<Shared>) -> Vec<std::thread::JoinHandle<()>> {
    let mut out = Vec::new();
    for cfg in sh.settings.engines.iter().cloned() {
        match spawn(sh, cfg, Arc::new(AtomicBool::new(false))) {
            Ok(h) => out.push(h),
            Err(e) => eprintln!("kvroute: zmq: cannot start a thread: {e}"),
        }
    }
    out
}

/// Starts the thread of one engine; it stops at shutdown, or once `stop` is set
/// (`engines_file`), within about 200 ms (a replay in progress: within 2 s).
pub fn spawn(
    sh: &Arc<Shared>,
    cfg: EngineEndpoint,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let sh = sh.clone();
    std::thread::Builder::new()
        .name(format!("kvroute-zmq-{}", cfg.worker_id))
        .spawn(move || Stream::new(sh, cfg, stop).run())
}

struct Stream {
    sh: Arc<Shared>,
    cfg: EngineEndpoint,
    limits: Limits,
    slot: WorkerSlot,
    gen: u64,
    session: Session,
    reported: Vec<u64>,
    out: Vec<Change>,
    limiter: LogLimiter,
    reach: Reach,
    /// Set when the engines file no longer lists this engine.
    stop: Arc<AtomicBool>,
}

impl Stream {
    fn new(sh: Arc<Shared>, cfg: EngineEndpoint, stop: Arc<AtomicBool>) -> Stream {
        let router_bs = sh.settings.router.block_size;
        let bs = cfg.block_size.unwrap_or(router_bs);
        if bs != router_bs {
            log(
                &cfg,
                &format!(
                    "configured block_size {bs} differs from the router's {router_bs}: \
                     events without their own block size will be refused"
                ),
            );
        }
        let cap = cfg
            .capacity_blocks
            .min(sh.settings.limits.max_blocks_per_worker)
            .min(usize::MAX as u64) as usize;
        let adapter = Adapter::new(bs, cap, cfg.lora.clone())
            .with_router_block_size(router_bs)
            .with_unknown_medium_tier(sh.settings.engine_unknown_medium_tier)
            .with_lookahead(sh.settings.router.lookahead_tokens as usize);
        let session = Session::new(adapter, cfg.replay_endpoint.is_some(), cfg.dp_rank);
        let limits = Limits {
            max_message_bytes: sh.settings.limits.max_engine_message_bytes,
            max_frames: MAX_FRAMES,
        };
        let reach = Reach::new(Duration::from_millis(sh.settings.heartbeat_timeout_ms));
        Stream {
            sh,
            cfg,
            limits,
            slot: 0,
            gen: u64::MAX,
            session,
            reported: Vec::new(),
            out: Vec::new(),
            limiter: LogLimiter::new(LOG_WINDOW),
            reach,
            stop,
        }
    }

    fn shutting_down(&self) -> bool {
        self.sh.shutdown.load(Ordering::Relaxed) || self.stop.load(Ordering::Relaxed)
    }

    /// Sleeps `d` in slices, returning false at shutdown.
    fn pause(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        while !self.shutting_down() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        false
    }

    /// Logs through the per-worker rate limiter.
    fn log_limited(&mut self, reason: &'static str, msg: &str) {
        if let Some(suppressed) = self.limiter.allow(reason, Instant::now()) {
            if suppressed > 0 {
                log(
                    &self.cfg,
                    &format!("{msg} ({suppressed} more like this suppressed)"),
                );
            } else {
                log(&self.cfg, msg);
            }
        }
    }

    /// Logs what the session noted.
    fn drain_notes(&mut self) {
        while let Some(n) = self.session.notes.pop() {
            self.log_limited(n.reason(), &n.describe());
        }
        if self.session.notes.dropped > 0 {
            let d = std::mem::take(&mut self.session.notes.dropped);
            self.bump("note_dropped", d);
        }
    }

    /// Registers the worker (retrying while the registry refuses, e.g. when full).
    fn register(&mut self) -> bool {
        let mut logged = false;
        while !self.shutting_down() {
            match control::register_blocking(&self.sh, self.cfg.spec(), false) {
                Ok((up, gen)) => {
                    self.slot = up.slot();
                    self.gen = gen;
                    self.session.reset();
                    return true;
                }
                Err(e) => {
                    if !logged {
                        log(&self.cfg, &format!("cannot register: {e}; retrying"));
                        logged = true;
                    }
                    if !self.pause(Duration::from_secs(1)) {
                        return false;
                    }
                }
            }
        }
        false
    }

    /// Follows a re-registration or removal of the worker done elsewhere (HTTP).
    fn check_identity(&mut self) -> bool {
        let current = self
            .sh
            .cells(self.slot)
            .map(|c| c.gen.load(Ordering::Acquire));
        if current == Some(self.gen) {
            return true;
        }
        match self.sh.registry.load().slot(&self.cfg.worker_id) {
            Some(slot) if slot == self.slot => {
                // New epoch: the shards forgot the worker; start the map afresh too.
                self.gen = current.unwrap_or(self.gen);
                self.session.reset();
                true
            }
            _ => false,
        }
    }

    /// Counts and logs a connection failure; the caller reconnects after a backoff.
    fn conn_failed(&mut self, what: &str, e: &ConnError) {
        let (kind, reason) = match e {
            ConnError::Zmtp(ZmtpError::FrameTooLarge { .. }) => {
                ("frame_too_large", "frame_too_large")
            }
            ConnError::Zmtp(ZmtpError::MessageTooLarge { .. })
            | ConnError::Zmtp(ZmtpError::TooManyFrames { .. }) => {
                ("message_too_large", "message_too_large")
            }
            ConnError::Zmtp(_) => ("protocol_error", "protocol_error"),
            _ => ("recv_error", "recv_error"),
        };
        self.bump(kind, 1);
        self.log_limited(
            reason,
            &format!("{what}: {e}; closed the connection, reconnecting with backoff"),
        );
    }

    fn run(mut self) {
        if !self.register() {
            return;
        }
        let mut backoff = BACKOFF_MIN;
        while !self.shutting_down() {
            let Some(mut sub) = self.connect_sub(&mut backoff) else {
                return;
            };
            let peer = sub.stream().peer_addr().map(|a| a.to_string());
            log(
                &self.cfg,
                &format!("subscribed ({})", peer.unwrap_or_default()),
            );
            if let Some(m) = self.reach.connected(&self.sh, self.slot) {
                log(&self.cfg, &m);
            }
            self.session.reconnected();
            let mut delivered = false;
            let mut owed = false;
            let mut quiet = 0u32;
            let err = loop {
                if self.shutting_down() {
                    return;
                }
                let frames = match sub.recv(Instant::now() + POLL) {
                    Ok(None) => {
                        quiet += 1;
                        if quiet == QUIET_POLLS {
                            sub.drop_spares();
                            if std::mem::take(&mut owed) {
                                release_memory();
                            }
                        }
                        continue;
                    }
                    Ok(Some(f)) => {
                        quiet = 0;
                        f
                    }
                    Err(e) => break e,
                };
                if !delivered {
                    delivered = true;
                    backoff = BACKOFF_MIN;
                }
                if !self.check_identity() && !self.register() {
                    return;
                }
                let size: usize = frames.iter().map(Vec::len).sum();
                if !self.handle_live(&frames) {
                    return;
                }
                owed |= size >= COLLECT_AFTER;
                sub.recycle(frames);
            };
            drop(sub);
            release_memory();
            self.conn_failed("subscription", &err);
            self.unreachable();
            if !self.pause(backoff) {
                return;
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// One live message. False at shutdown.
    fn handle_live(&mut self, frames: &[Vec<u8>]) -> bool {
        let Ok((seq, payload)) = parse_multipart(frames) else {
            self.bump("bad_frame", 1);
            self.log_limited(
                "bad_frame",
                "message without [.., seq (8 bytes), payload] frames skipped",
            );
            return true;
        };
        let before = (
            self.session.adapter.stats.block_size_mismatch,
            self.session.adapter.stats.stored_blocks,
        );
        let step = self.session.live(seq, payload, &mut self.out);
        if let Step::Replay { from } = step {
            let complete = self.replay(from);
            self.session
                .replay_done(complete, seq, payload, &mut self.out);
        }
        self.drain_notes();
        self.mark_block_size(before);
        if let Some(c) = self.sh.cells(self.slot) {
            let v = self.session.dp_mismatch.map_or(0, |r| r.saturating_add(1));
            c.engine_dp_rank_mismatch.store(v, Ordering::Relaxed);
        }
        if !self.deliver() {
            return false;
        }
        self.report();
        true
    }

    /// Shows a block-size mismatch in `GET /v1/workers` while the engine's stored
    /// events are being refused; cleared once a stored event is accepted.
    fn mark_block_size(&self, (mismatch, stored): (u64, u64)) {
        let st = &self.session.adapter.stats;
        let v = if st.block_size_mismatch > mismatch {
            self.session.adapter.last_mismatch
        } else if st.stored_blocks > stored {
            0
        } else {
            return;
        };
        if let Some(c) = self.sh.cells(self.slot) {
            c.engine_block_size_mismatch.store(v, Ordering::Relaxed);
        }
    }

    fn connect_sub(&mut self, backoff: &mut Duration) -> Option<Conn> {
        let mut logged = false;
        while !self.shutting_down() {
            match Conn::connect(
                &self.cfg.endpoint,
                "SUB",
                None,
                self.limits,
                CONNECT_TIMEOUT,
            ) {
                Ok(mut c) => {
                    let sub = codec::subscribe(self.cfg.topic.as_bytes());
                    match c.send_raw(&sub).and_then(|()| c.set_poll(POLL)) {
                        Ok(()) => return Some(c),
                        Err(e) => self.conn_failed("subscribe", &e),
                    }
                }
                Err(ConnError::Io(e)) if !logged => {
                    log(&self.cfg, &format!("cannot connect yet: {e}; retrying"));
                    logged = true;
                }
                Err(e @ ConnError::Zmtp(_)) => self.conn_failed("handshake", &e),
                Err(_) => {}
            }
            self.unreachable();
            if !self.pause(*backoff) {
                return None;
            }
            *backoff = (*backoff * 2).min(BACKOFF_MAX);
        }
        None
    }

    /// No subscription up: past the time-out the worker is down (`zmq_reach`).
    fn unreachable(&mut self) {
        if let Some(m) = self.reach.failed(&self.sh, self.slot) {
            log(&self.cfg, &m);
        }
    }

    /// Asks the replay endpoint for everything from `from` on and feeds it to the
    /// session. True when the end marker arrived and the session accepted the replay.
    fn replay(&mut self, from: u64) -> bool {
        let Some(ep) = self.cfg.replay_endpoint.clone() else {
            self.session.set_replay_error("no replay endpoint");
            return false;
        };
        let mut d = match Conn::connect(&ep, "DEALER", None, self.limits, CONNECT_TIMEOUT) {
            Ok(d) => d,
            Err(e) => {
                self.session
                    .set_replay_error("cannot connect to the replay endpoint");
                if matches!(e, ConnError::Zmtp(_)) {
                    self.conn_failed("replay handshake", &e);
                }
                return false;
            }
        };
        let req = [&[][..], &replay_request(from)[..]];
        if d.send(&req).and_then(|()| d.set_poll(POLL)).is_err() {
            self.session
                .set_replay_error("cannot send the replay request");
            return false;
        }
        let deadline = Instant::now() + REPLAY_TOTAL;
        loop {
            let now = Instant::now();
            if now >= deadline || self.shutting_down() {
                self.session
                    .set_replay_error("the replay took longer than 10 s");
                return false;
            }
            let m = match d.recv(deadline.min(now + REPLAY_MSG_TIMEOUT)) {
                Ok(Some(m)) => m,
                Ok(None) => {
                    self.session
                        .set_replay_error("no replayed message within 2 s");
                    return false;
                }
                Err(e) => {
                    self.session.set_replay_error("replay connection failed");
                    self.conn_failed("replay", &e);
                    return false;
                }
            };
            let Ok((seq, payload)) = parse_multipart(&m) else {
                self.bump("bad_frame", 1);
                self.session.set_replay_error("malformed replayed message");
                return false;
            };
            if seq == END_SEQ {
                if !payload.is_empty() {
                    self.session.set_replay_error("end marker with a payload");
                }
                return payload.is_empty();
            }
            if !self.session.replayed(seq, payload, &mut self.out) {
                return false;
            }
            if self.out.len() >= FLUSH_EVERY && !self.deliver() {
                return false;
            }
        }
    }

    /// Hands the pending changes to every shard, in order. False at shutdown.
    fn deliver(&mut self) -> bool {
        if self.out.is_empty() {
            return true;
        }
        // `--cluster`: the replica holding this engine's lease ingests it; a standby
        // stays subscribed (in sequence) and discards, ready to take over.
        if !crate::service::runtime::cluster_hooks::engine_may_ingest(&self.sh, &self.cfg.worker_id)
        {
            self.out.clear();
            return true;
        }
        let sh = &self.sh;
        // Cut like binary events, so a burst never becomes one long shard batch.
        let mut batch = Batch::default();
        let mut full = Vec::new();
        for c in self.out.drain(..) {
            sh.metrics.event(batch.add_change(c, &mut full), 1);
        }
        // A large message must not leave this buffer at its peak size.
        if self.out.capacity() > KEEP_CHANGES {
            self.out = Vec::new();
        }
        full.push(batch.take());
        for ops in full.into_iter().filter(|ops| !ops.is_empty()) {
            crate::service::runtime::cluster_hooks::publish_ops(sh, self.slot, &ops);
            let ops: Arc<[IndexOp]> = ops.into();
            for to in 0..sh.cores {
                let m = Msg::Index {
                    slot: self.slot,
                    gen: self.gen,
                    ops: ops.clone(),
                };
                if !control::send_blocking(sh, to, m) {
                    return false;
                }
            }
        }
        if let Some(c) = sh.cells(self.slot) {
            c.last_seen_ms.store(sh.now_ms(), Ordering::Release);
        }
        true
    }

    fn bump(&self, kind: &'static str, n: u64) {
        self.sh
            .metrics
            .engine_stream
            .get_or_create(&EngineStreamLabels {
                worker: self.cfg.worker_id.clone(),
                kind,
            })
            .inc_by(n);
    }

    /// Publishes the session's counter increments to `/metrics`.
    fn report(&mut self) {
        let figures = figures(&self.session);
        self.reported.resize(figures.len(), 0);
        for (i, (kind, v)) in figures.iter().enumerate() {
            let d = v.saturating_sub(self.reported[i]);
            if d > 0 {
                self.bump(kind, d);
                self.reported[i] = *v;
            }
        }
    }
}

fn figures(s: &Session) -> [(&'static str, u64); 22] {
    let c = &s.counters;
    let AdapterStats {
        stored_blocks,
        removed_blocks,
        unknown_parent,
        unknown_removed,
        missing_tokens,
        evicted,
        bad_block_size,
        block_size_mismatch,
        unknown_medium,
        lookahead_mismatch,
        bad_group,
    } = s.adapter.stats;
    [
        ("batch", c.batches),
        ("event", c.events),
        ("skipped_event", c.skipped_events),
        ("bad_payload", c.bad_payloads),
        ("duplicate", c.duplicates),
        ("gap", c.gaps),
        ("replay", c.replays),
        ("replayed_batch", c.replayed_batches),
        ("replay_failure", c.replay_failures),
        ("clear", c.clears),
        ("restart", c.restarts),
        ("dp_rank_mismatch", c.dp_rank_mismatch),
        ("stored_block", stored_blocks),
        ("removed_block", removed_blocks),
        ("unknown_parent", unknown_parent),
        ("unknown_removed", unknown_removed),
        ("missing_tokens", missing_tokens + bad_block_size),
        ("evicted", evicted),
        ("block_size_mismatch", block_size_mismatch),
        ("unknown_medium", unknown_medium),
        ("lookahead_mismatch", lookahead_mismatch),
        ("bad_group", bad_group),
    ]
}
