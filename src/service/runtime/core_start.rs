//! Readiness of the executors at start: each core reports once, started or not, and a
//! core that did not start is named with its error.
//!
//! Guarantees: a core whose executor cannot be built (glommio returns an error, or its
//! thread panics) reports at once, through the [`Ready`] guard its start closure drops,
//! instead of leaving the start to wait for a time-out; the start then fails with one
//! line naming the core and glommio's error (or the panic message), and the caller
//! stops the cores that did start. A core that neither starts nor fails within the
//! time-out is named too.

use glommio::{BuilderErrorKind, ExecutorJoinHandle, GlommioError};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// How long the start waits for every core to report.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Moved into a core's start closure: [`Ready::started`] once the core runs; dropped
/// unused (the executor was never built, or the thread unwound), it reports failure.
pub struct Ready {
    id: usize,
    tx: Option<Sender<(usize, bool)>>,
}

impl Ready {
    pub fn started(mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send((self.id, true));
        }
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send((self.id, false));
        }
    }
}

/// The reports of one start.
pub struct Reports {
    tx: Sender<(usize, bool)>,
    rx: Receiver<(usize, bool)>,
}

impl Default for Reports {
    fn default() -> Self {
        let (tx, rx) = channel();
        Reports { tx, rx }
    }
}

impl Reports {
    /// The guard for core `id`.
    pub fn guard(&self, id: usize) -> Ready {
        Ready {
            id,
            tx: Some(self.tx.clone()),
        }
    }

    /// Waits for the reports of the cores in `handles` (core `i` is `handles[i]`).
    /// `Err` names the first core that did not start and why; the failed cores'
    /// threads are joined and taken out of `handles`, the others are left running
    /// for the caller to stop.
    pub fn wait(
        self,
        handles: &mut Vec<ExecutorJoinHandle<()>>,
        timeout: Duration,
    ) -> Result<(), String> {
        let Reports { tx, rx } = self;
        drop(tx);
        let n = handles.len();
        let mut state: Vec<Option<bool>> = vec![None; n];
        let deadline = Instant::now() + timeout;
        while state.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((id, ok)) => {
                    if let Some(s) = state.get_mut(id) {
                        s.get_or_insert(ok);
                    }
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let failed: Vec<usize> = (0..n).filter(|&i| state[i] == Some(false)).collect();
        let silent: Vec<usize> = (0..n).filter(|&i| state[i].is_none()).collect();
        let mut errors = Vec::new();
        // Highest first, so the lower indices stay valid.
        for &id in failed.iter().rev() {
            let e = match handles.remove(id).join() {
                Ok(()) => "its executor stopped at once".to_string(),
                Err(e) => describe(e),
            };
            errors.push((id, e));
        }
        errors.reverse();
        match (errors.first(), silent.first()) {
            (Some((id, e)), _) => {
                let more = errors.len() - 1 + silent.len();
                let more = if more > 0 {
                    format!(" ({more} more core(s) did not start either)")
                } else {
                    String::new()
                };
                Err(format!("core {id} did not start: {e}{more}"))
            }
            (None, Some(id)) => Err(format!(
                "core {id} did not start within {} s",
                timeout.as_secs()
            )),
            (None, None) => Ok(()),
        }
    }
}

/// glommio's error, or the message a core's thread panicked with.
fn describe(e: GlommioError<()>) -> String {
    match e {
        GlommioError::BuilderError(BuilderErrorKind::ThreadPanic(p)) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            format!("its thread panicked: {}", msg.replace('\n', " "))
        }
        e => e.to_string().replace('\n', " "),
    }
}
