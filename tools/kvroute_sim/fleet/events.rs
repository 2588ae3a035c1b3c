//! KV events of one simulated worker, published from a thread of its own: vLLM's ZMQ
//! format (a PUB socket sending `[topic, seq (8 bytes big-endian), msgpack
//! KVEventBatch]`, positional encoding like `tests/py/vllm_publisher.py`) or kvroute's
//! binary event protocol (`kvroute::client::EventPublisher`, with heartbeats).
//!
//! Guarantees: the HTTP path never blocks on publishing (a bounded queue; a batch that
//! does not fit is dropped and counted, which the router sees as a sequence gap); the
//! thread stops when the sender is dropped.

use kvroute::sim::live::LiveWorker;
use kvroute::sim::CacheEvent;
use kvroute::types::{Tier, WorkerSpec};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Batches queued per worker before new ones are dropped.
const QUEUE: usize = 4096;

/// One admission's cache changes and the prompt they came from.
pub struct Job {
    pub events: Vec<CacheEvent>,
    pub hashes: Vec<u64>,
    pub tokens: Vec<u32>,
}

/// Where a worker's events go.
#[derive(Clone, Debug)]
pub enum Sink {
    /// Bind a ZMQ PUB socket on this address (`127.0.0.1:0` picks a port).
    Zmq { bind: String },
    /// Connect to the router's binary event port.
    Binary {
        router: String,
        token: String,
        spec: WorkerSpec,
    },
    /// Publish nothing.
    None,
}

/// The sending side, kept by the HTTP handlers.
pub struct Events {
    tx: Option<SyncSender<Job>>,
    pub dropped: AtomicU64,
    thread: Option<std::thread::JoinHandle<()>>,
    /// `tcp://host:port` of the ZMQ PUB socket, if any.
    pub zmq_endpoint: Option<String>,
}

impl Events {
    /// Starts the publishing thread. The ZMQ socket is bound (and the binary connection
    /// made) before this returns, so errors are reported here.
    pub fn start(sink: Sink, worker: Arc<Mutex<LiveWorker>>) -> Result<Events, String> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
        let bs = lock(&worker).block_size();
        let (thread, zmq_endpoint) = match sink {
            Sink::None => {
                return Ok(Events {
                    tx: None,
                    dropped: AtomicU64::new(0),
                    thread: None,
                    zmq_endpoint: None,
                })
            }
            Sink::Zmq { bind } => {
                let p = kvroute::zmtp::publisher::Publisher::bind(&bind)
                    .map_err(|e| format!("ZMQ PUB on {bind}: {e}"))?;
                let ep = p.endpoint();
                let t = std::thread::spawn(move || zmq_loop(p, rx, bs));
                (t, Some(ep))
            }
            Sink::Binary {
                router,
                token,
                spec,
            } => {
                let id = spec.id.clone();
                let p = kvroute::client::EventPublisher::connect(router.as_str(), spec, &token)
                    .map_err(|e| format!("worker {id}: binary events to {router}: {e}"))?;
                let t = std::thread::spawn(move || binary_loop(p, rx, worker));
                (t, None)
            }
        };
        Ok(Events {
            tx: Some(tx),
            dropped: AtomicU64::new(0),
            thread: Some(thread),
            zmq_endpoint,
        })
    }

    /// Queues a job (never blocks).
    pub fn send(&self, job: Job) {
        if job.events.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx {
            if let Err(TrySendError::Full(_)) = tx.try_send(job) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Stops the thread after it sent what is queued.
    pub fn stop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Encodes one `KVEventBatch` (positional msgspec encoding) of `job`'s events.
pub fn encode_batch(job: &Job, block_size: usize, out: &mut Vec<u8>) {
    use rmp::encode as e;
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let _ = e::write_array_len(out, 2);
    let _ = e::write_f64(out, ts);
    let _ = e::write_array_len(out, job.events.len() as u32);
    for ev in &job.events {
        match ev {
            CacheEvent::Stored { parent, hashes } => {
                let start = parent
                    .and_then(|p| job.hashes.iter().position(|h| *h == p))
                    .map_or(0, |i| i + 1);
                let lo = (start * block_size).min(job.tokens.len());
                let hi = ((start + hashes.len()) * block_size).min(job.tokens.len());
                let _ = e::write_array_len(out, 7);
                let _ = e::write_str(out, "BlockStored");
                let _ = e::write_array_len(out, hashes.len() as u32);
                for h in hashes {
                    let _ = e::write_uint(out, *h);
                }
                match parent {
                    Some(p) => {
                        let _ = e::write_uint(out, *p);
                    }
                    None => {
                        let _ = e::write_nil(out);
                    }
                }
                let _ = e::write_array_len(out, (hi - lo) as u32);
                for t in &job.tokens[lo..hi] {
                    let _ = e::write_uint(out, *t as u64);
                }
                let _ = e::write_uint(out, block_size as u64);
                let _ = e::write_nil(out);
                let _ = e::write_str(out, "GPU");
            }
            CacheEvent::Removed { hashes } => {
                let _ = e::write_array_len(out, 3);
                let _ = e::write_str(out, "BlockRemoved");
                let _ = e::write_array_len(out, hashes.len() as u32);
                for h in hashes {
                    let _ = e::write_uint(out, *h);
                }
                let _ = e::write_str(out, "GPU");
            }
        }
    }
}

fn zmq_loop(p: kvroute::zmtp::publisher::Publisher, rx: Receiver<Job>, bs: usize) {
    let mut seq: u64 = 0;
    let mut buf = Vec::new();
    while let Ok(job) = rx.recv() {
        buf.clear();
        encode_batch(&job, bs, &mut buf);
        let frames: [&[u8]; 3] = [b"", &seq.to_be_bytes(), &buf];
        p.send(&frames);
        seq += 1;
    }
}

fn binary_loop(
    mut p: kvroute::client::EventPublisher,
    rx: Receiver<Job>,
    worker: Arc<Mutex<LiveWorker>>,
) {
    let mut last_beat = Instant::now() - Duration::from_secs(10);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(job) => {
                for ev in &job.events {
                    match ev {
                        CacheEvent::Stored { parent, hashes } => {
                            p.stored(Tier::Device, *parent, hashes)
                        }
                        CacheEvent::Removed { hashes } => p.removed(Tier::Device, hashes),
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if last_beat.elapsed() >= Duration::from_secs(1) {
            let (active, used, cap) = {
                let w = lock(&worker);
                (
                    w.stats().active as u32,
                    w.cache().len() as u64,
                    w.cache().capacity() as u64,
                )
            };
            p.heartbeat(active, used, cap);
            last_beat = Instant::now();
            let _ = p.poll(Duration::from_millis(1));
            if p.resync_requested {
                // The router lost track: re-announce every cached block (whole-cache
                // snapshot; parents are not needed by the binary protocol's resync).
                let blocks: Vec<u64> = lock(&worker).cache().blocks().collect();
                p.resync_begin();
                p.stored(Tier::Device, None, &blocks);
                p.resync_end();
            }
        }
        if p.flush().is_err() {
            eprintln!("kvroute-sim fleet: binary event connection lost");
            // Keep draining so the HTTP side never blocks.
            while rx.recv().is_ok() {}
            break;
        }
    }
}
