//! ZMQ ingest of vLLM / SGLang KV events (`[[engines]]` / `--engine`).
//!
//! One plain OS thread per configured endpoint, beside the glommio executors. Each
//! thread runs a small current-thread tokio runtime for the pure-Rust `zeromq` sockets:
//! a SUB socket on the engine's PUB endpoint and, on demand, a DEALER socket to its
//! ROUTER replay endpoint. All decisions (decoding, hashing, the engine-hash map, gaps
//! and replay) live in the sans-I/O `engines` module; this file only moves frames in and
//! index operations out, through the same mailboxes as every other ingest path
//! (`Msg::Index`, backpressure = retry with short sleeps).
//!
//! Guarantees: the worker is registered through the same registry write as HTTP and the
//! binary protocol; every wait is bounded (connect 1 s per attempt, receive polls of
//! 200 ms, replay 2 s per message and 10 s in all) and the thread exits within about
//! 200 ms of shutdown; a misbehaving engine only affects its own worker.

use super::control;
use super::index_batch::Batch;
use super::metrics::EngineStreamLabels;
use super::msg::{IndexOp, Msg};
use super::shared::Shared;
use crate::engines::adapter::{Adapter, AdapterStats, Change};
use crate::engines::config::EngineEndpoint;
use crate::engines::stream::{parse_multipart, replay_request, Session, Step, END_SEQ};
use crate::types::WorkerSlot;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const POLL: Duration = Duration::from_millis(200);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const REPLAY_MSG_TIMEOUT: Duration = Duration::from_secs(2);
const REPLAY_TOTAL: Duration = Duration::from_secs(10);
/// Changes buffered during a replay before they are handed to the shards.
const FLUSH_EVERY: usize = 256;

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
        let sh = sh.clone();
        let name = format!("kvroute-zmq-{}", cfg.worker_id);
        match std::thread::Builder::new()
            .name(name)
            .spawn(move || run(sh, cfg))
        {
            Ok(h) => out.push(h),
            Err(e) => eprintln!("kvroute: zmq: cannot start a thread: {e}"),
        }
    }
    out
}

fn run(sh: Arc<Shared>, cfg: EngineEndpoint) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log(&cfg, &format!("cannot start a runtime: {e}"));
            return;
        }
    };
    rt.block_on(Stream::new(sh, cfg).run());
}

struct Stream {
    sh: Arc<Shared>,
    cfg: EngineEndpoint,
    slot: WorkerSlot,
    gen: u64,
    session: Session,
    reported: Vec<u64>,
    out: Vec<Change>,
}

impl Stream {
    fn new(sh: Arc<Shared>, cfg: EngineEndpoint) -> Stream {
        let bs = cfg.block_size.unwrap_or(sh.settings.router.block_size);
        let cap = cfg
            .capacity_blocks
            .min(sh.settings.limits.max_blocks_per_worker)
            .min(usize::MAX as u64) as usize;
        let adapter = Adapter::new(bs, cap, cfg.lora.clone());
        let session = Session::new(adapter, cfg.replay_endpoint.is_some(), cfg.dp_rank);
        Stream {
            sh,
            cfg,
            slot: 0,
            gen: u64::MAX,
            session,
            reported: Vec::new(),
            out: Vec::new(),
        }
    }

    fn shutting_down(&self) -> bool {
        self.sh.shutdown.load(Ordering::Relaxed)
    }

    /// Registers the worker (retrying while the registry refuses, e.g. when full).
    async fn register(&mut self) -> bool {
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
                    tokio::time::sleep(Duration::from_secs(1)).await;
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

    async fn run(mut self) {
        if !self.register().await {
            return;
        }
        'connect: while !self.shutting_down() {
            let Some(mut sub) = self.connect_sub().await else {
                return;
            };
            log(&self.cfg, "subscribed");
            while !self.shutting_down() {
                let msg = match tokio::time::timeout(POLL, sub.recv()).await {
                    Err(_) => continue,
                    Ok(Err(e)) => {
                        // The socket reconnects by itself; pause so errors cannot spin.
                        self.bump("recv_error", 1);
                        tokio::time::sleep(POLL).await;
                        if matches!(e, zeromq::ZmqError::NoMessage) {
                            continue 'connect;
                        }
                        continue;
                    }
                    Ok(Ok(m)) => m,
                };
                if !self.check_identity() && !self.register().await {
                    return;
                }
                let frames = msg.into_vec();
                let Ok((seq, payload)) = parse_multipart(&frames) else {
                    self.bump("bad_frame", 1);
                    continue;
                };
                let step = self.session.live(seq, payload, &mut self.out);
                if let Step::Replay { from } = step {
                    let complete = self.replay(from).await;
                    if !complete {
                        log(&self.cfg, &format!("replay from {from} failed"));
                    }
                    self.session
                        .replay_done(complete, seq, payload, &mut self.out);
                }
                if !self.deliver() {
                    return;
                }
                self.report();
            }
        }
    }

    async fn connect_sub(&mut self) -> Option<SubSocket> {
        let mut logged = false;
        while !self.shutting_down() {
            let mut opts = SocketOptions::default();
            opts.connect_timeout(CONNECT_TIMEOUT);
            let mut sub = SubSocket::with_options(opts);
            let r =
                tokio::time::timeout(CONNECT_TIMEOUT * 2, sub.connect(&self.cfg.endpoint)).await;
            match r {
                Ok(Ok(())) => match sub.subscribe(&self.cfg.topic).await {
                    Ok(()) => return Some(sub),
                    Err(e) => log(&self.cfg, &format!("subscribe: {e}")),
                },
                Ok(Err(e)) if !logged => {
                    log(&self.cfg, &format!("cannot connect yet: {e}; retrying"));
                    logged = true;
                }
                _ => {}
            }
            tokio::time::sleep(POLL).await;
        }
        None
    }

    /// Asks the replay endpoint for everything from `from` on and feeds it to the
    /// session. True when the end marker arrived and the session accepted the replay.
    async fn replay(&mut self, from: u64) -> bool {
        let Some(ep) = self.cfg.replay_endpoint.clone() else {
            return false;
        };
        let mut opts = SocketOptions::default();
        opts.connect_timeout(CONNECT_TIMEOUT);
        let mut d = DealerSocket::with_options(opts);
        if !matches!(
            tokio::time::timeout(CONNECT_TIMEOUT * 2, d.connect(&ep)).await,
            Ok(Ok(()))
        ) {
            return false;
        }
        let req = vec![Bytes::new(), Bytes::copy_from_slice(&replay_request(from))];
        let Ok(req) = ZmqMessage::try_from(req) else {
            return false;
        };
        if d.send(req).await.is_err() {
            return false;
        }
        let deadline = Instant::now() + REPLAY_TOTAL;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.shutting_down() {
                return false;
            }
            let m = match tokio::time::timeout(left.min(REPLAY_MSG_TIMEOUT), d.recv()).await {
                Ok(Ok(m)) => m,
                _ => return false,
            };
            let frames = m.into_vec();
            let Ok((seq, payload)) = parse_multipart(&frames) else {
                self.bump("bad_frame", 1);
                return false;
            };
            if seq == END_SEQ {
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
        let sh = &self.sh;
        // Cut like binary events, so a burst never becomes one long shard batch.
        let mut batch = Batch::default();
        let mut full = Vec::new();
        for c in self.out.drain(..) {
            sh.metrics.event(batch.add_change(c, &mut full), 1);
        }
        full.push(batch.take());
        for ops in full.into_iter().filter(|ops| !ops.is_empty()) {
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

fn figures(s: &Session) -> [(&'static str, u64); 18] {
    let c = &s.counters;
    let AdapterStats {
        stored_blocks,
        removed_blocks,
        unknown_parent,
        unknown_removed,
        missing_tokens,
        evicted,
        bad_block_size,
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
    ]
}
