//! `kvroute serve --record FILE`: writes the requests the service routed as a
//! Mooncake-format trace (`crate::record` encodes; this module moves the records).
//!
//! Off the hot path: the core that ends a request offers its record to a bounded
//! channel (`try_send`, never blocking; a full channel drops the record and counts it
//! in `kvroute_record_dropped_total`), and one writer thread encodes and writes. The
//! file is flushed whenever the channel is drained, so a reader sees every line within
//! moments, and at shutdown. When a limit (`record_max_bytes`, `record_max_ids`) is
//! reached the recording stops for good, with one log line and
//! `kvroute_record_stopped` = 1; later records are dropped without being counted as
//! full-channel drops. A write error stops the recording the same way.

use crate::record::{Encoder, Ended};
use crossbeam::channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Records waiting for the writer thread at most.
pub const CHANNEL_RECORDS: usize = 16_384;

enum Item {
    Ended(Ended),
    /// Flush and exit (shutdown).
    Stop,
}

/// The handle the cores hold.
pub struct Recorder {
    tx: Sender<Item>,
    stopped: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What the recorder needs from the settings.
#[derive(Clone, Debug)]
pub struct RecordConfig {
    pub path: String,
    pub block_size: u32,
    pub max_bytes: u64,
    pub max_ids: usize,
}

impl Recorder {
    /// Creates (truncates) the file and starts the writer thread.
    /// `lines` and `stopped_gauge` are the service's metrics (clones share them).
    pub fn start(
        cfg: RecordConfig,
        lines: Counter,
        stopped_gauge: Gauge,
    ) -> Result<Recorder, String> {
        let file =
            std::fs::File::create(&cfg.path).map_err(|e| format!("--record {}: {e}", cfg.path))?;
        let (tx, rx) = bounded(CHANNEL_RECORDS);
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        let thread = std::thread::Builder::new()
            .name("kvroute-record".into())
            .spawn(move || write_loop(cfg, file, rx, flag, lines, stopped_gauge))
            .map_err(|e| format!("--record: cannot start the writer thread: {e}"))?;
        Ok(Recorder {
            tx,
            stopped,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Offers one ended request; never blocks. False when it was dropped because the
    /// channel is full (not when the recording has stopped).
    pub fn offer(&self, e: Ended) -> bool {
        if self.stopped.load(Ordering::Relaxed) {
            return true;
        }
        !matches!(self.tx.try_send(Item::Ended(e)), Err(TrySendError::Full(_)))
    }

    /// Writes what is queued, flushes and joins the writer (bounded wait).
    pub fn shutdown(&self) {
        let _ = self.tx.send_timeout(Item::Stop, Duration::from_secs(2));
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

fn write_loop(
    cfg: RecordConfig,
    file: std::fs::File,
    rx: Receiver<Item>,
    stopped: Arc<AtomicBool>,
    lines: Counter,
    stopped_gauge: Gauge,
) {
    let mut enc = Encoder::new(cfg.block_size, cfg.max_bytes, cfg.max_ids);
    let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
    let mut line = String::new();
    let mut dirty = false;
    let halt = |why: String, stopped: &AtomicBool| {
        if !stopped.swap(true, Ordering::Relaxed) {
            eprintln!("kvroute: recording to {} stopped: {why}", cfg.path);
            stopped_gauge.set(1);
        }
    };
    loop {
        let item = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(i) => Some(i),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Item::Stop),
        };
        match item {
            Some(Item::Ended(e)) => {
                if stopped.load(Ordering::Relaxed) {
                    continue;
                }
                line.clear();
                match enc.line(&e, &mut line) {
                    Ok(()) => match out.write_all(line.as_bytes()) {
                        Ok(()) => {
                            dirty = true;
                            lines.inc();
                        }
                        Err(err) => halt(format!("write error: {err}"), &stopped),
                    },
                    Err(s) => halt(
                        format!("{} reached after {} bytes", s.name(), enc.written()),
                        &stopped,
                    ),
                }
            }
            Some(Item::Stop) => {
                let _ = out.flush();
                return;
            }
            None => {}
        }
        if dirty && rx.is_empty() {
            if let Err(err) = out.flush() {
                halt(format!("write error: {err}"), &stopped);
            }
            dirty = false;
        }
    }
}
