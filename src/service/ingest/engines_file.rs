//! The engines file (`engines_file`): `[[engines]]` entries kvroute follows while it
//! runs, so an engine pod is added, moved or retired without restarting the router.
//!
//! The file holds only `[[engines]]` tables, in the form of `kvroute.toml`'s. It is read
//! at start (an unusable file stops the start, like any setting), then again every
//! [`POLL`] and at once on `SIGHUP` ([`Watcher::reload`]). A content change is applied
//! as a difference keyed by `worker_id`: a new entry gets its subscriber thread (which
//! registers the worker), a removed one has its thread stopped and its worker removed
//! (as `DELETE /v1/workers/{id}` does), a changed one is restarted with its new entry
//! (re-registered: a changed spec is a new epoch). Entries of the static list
//! (`[[engines]]` in the settings, `--engine`) are never touched. With `[cluster]` the
//! file is read once at start and its entries join the static list (a replica ingests
//! an engine only under that engine's lease, and the leases cover the static list).
//!
//! Guarantees: a file that cannot be read, is larger than [`MAX_FILE_BYTES`], does not
//! parse, fails validation or repeats a worker id (of the file or of the static list)
//! changes nothing: one log line names the problem and the running set stays;
//! `kvroute_engines_file_reloads_total{kind="applied"|"rejected"}` counts both. A
//! missing file is such an error (not "no engines"): an empty file removes them all.
//! The watcher thread stops, with every thread it started, within about a second of
//! shutdown.

use crate::engines::config::EngineEndpoint;
use crate::service::runtime::shared::Shared;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the file is read for changes.
pub const POLL: Duration = Duration::from_secs(1);
/// Largest engines file accepted (about 4,000 entries), checked before it is read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    engines: Vec<EngineEndpoint>,
}

/// The file's bytes and its validated entries.
pub struct Loaded {
    bytes: Vec<u8>,
    engines: Vec<EngineEndpoint>,
}

impl Loaded {
    pub fn engines(&self) -> &[EngineEndpoint] {
        &self.engines
    }

    pub fn into_engines(self) -> Vec<EngineEndpoint> {
        self.engines
    }
}

/// Reads and validates `path` against the static entries and the worker limit.
pub fn load(path: &str, fixed: &[EngineEndpoint], max_workers: usize) -> Result<Loaded, String> {
    let bytes = read(path)?;
    let engines = parse(&bytes, fixed, max_workers)?;
    Ok(Loaded { bytes, engines })
}

fn read(path: &str) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("reading {path}: {e}"))?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading {path}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("{path} is larger than {MAX_FILE_BYTES} bytes"));
    }
    Ok(bytes)
}

fn parse(
    bytes: &[u8],
    fixed: &[EngineEndpoint],
    max_workers: usize,
) -> Result<Vec<EngineEndpoint>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let doc: FileDoc = toml::from_str(text).map_err(|e| e.to_string().replace('\n', " "))?;
    if doc.engines.len() + fixed.len() > max_workers {
        return Err(format!(
            "{} engines (with the {} of the settings) exceed max_workers {max_workers}",
            doc.engines.len(),
            fixed.len()
        ));
    }
    let all: Vec<EngineEndpoint> = fixed.iter().chain(&doc.engines).cloned().collect();
    crate::engines::config::validate_all(&all)?;
    Ok(doc.engines)
}

/// One running entry of the file.
struct Running {
    cfg: EngineEndpoint,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The watcher thread: [`Watcher::reload`] on SIGHUP, [`Watcher::stop`] at shutdown.
pub struct Watcher {
    thread: JoinHandle<()>,
    reload: Arc<AtomicBool>,
}

impl Watcher {
    /// Starts the entries of `first` and follows `path` from there.
    pub fn start(sh: &Arc<Shared>, path: String, first: Loaded) -> Result<Watcher, String> {
        let reload = Arc::new(AtomicBool::new(false));
        let (sh, r) = (sh.clone(), reload.clone());
        let thread = std::thread::Builder::new()
            .name("kvroute-engines-file".into())
            .spawn(move || watch(sh, path, first, r))
            .map_err(|e| format!("cannot start the engines file watcher: {e}"))?;
        Ok(Watcher { thread, reload })
    }

    /// Reads the file now (SIGHUP), even if its content looks unchanged.
    pub fn reload(&self) {
        self.reload.store(true, Ordering::Release);
        self.thread.thread().unpark();
    }

    /// Joins the watcher once shutdown is flagged (it stops its engine threads).
    pub fn stop(self) {
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

fn watch(sh: Arc<Shared>, path: String, first: Loaded, reload: Arc<AtomicBool>) {
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let mut last = first.bytes;
    apply(&sh, &path, &mut running, first.engines);
    let fixed = &sh.settings.engines;
    let max_workers = sh.settings.limits.max_workers;
    // The content last rejected, so a broken file is reported once, not every second.
    let mut rejected: Option<Vec<u8>> = None;
    loop {
        std::thread::park_timeout(POLL);
        if sh.shutdown.load(Ordering::Acquire) {
            break;
        }
        let forced = reload.swap(false, Ordering::AcqRel);
        let loaded = read(&path).and_then(|b| {
            if b == last && !forced {
                return Ok(None);
            }
            parse(&b, fixed, max_workers).map(|e| Some((b, e)))
        });
        match loaded {
            Ok(None) => {}
            Ok(Some((bytes, engines))) => {
                rejected = None;
                if bytes == last {
                    eprintln!(
                        "kvroute: engines file {path}: unchanged ({} engines)",
                        running.len()
                    );
                } else {
                    apply(&sh, &path, &mut running, engines);
                }
                last = bytes;
                reloaded(&sh, "applied");
            }
            Err(e) => {
                // Reported once per content (an unreadable file: once per message).
                let seen = e.clone().into_bytes();
                if forced || rejected.as_ref() != Some(&seen) {
                    eprintln!(
                        "kvroute: engines file {path}: {e}; keeping the {} engines running",
                        running.len()
                    );
                    reloaded(&sh, "rejected");
                }
                rejected = Some(seen);
            }
        }
    }
    for (_, r) in std::mem::take(&mut running) {
        r.stop();
    }
}

fn reloaded(sh: &Shared, kind: &'static str) {
    sh.metrics
        .engines_file_reloads
        .get_or_create(&crate::service::metrics::KindLabel { kind })
        .inc();
}

/// Brings `running` to `wanted`; one log line of what changed.
fn apply(
    sh: &Arc<Shared>,
    path: &str,
    running: &mut BTreeMap<String, Running>,
    wanted: Vec<EngineEndpoint>,
) {
    let mut wanted: BTreeMap<String, EngineEndpoint> = wanted
        .into_iter()
        .map(|e| (e.worker_id.clone(), e))
        .collect();
    let (mut added, mut removed, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    let ids: Vec<String> = running.keys().cloned().collect();
    for id in ids {
        let keep = wanted.get(&id).is_some_and(|w| running[&id].cfg == *w);
        if keep {
            wanted.remove(&id);
            continue;
        }
        if let Some(r) = running.remove(&id) {
            r.stop();
        }
        if wanted.contains_key(&id) {
            changed.push(id);
        } else {
            // Already gone (removed over HTTP) is fine.
            let _ = crate::service::routing::control::deregister_blocking(sh, &id);
            removed.push(id);
        }
    }
    for (id, cfg) in wanted {
        if !changed.contains(&id) {
            added.push(id.clone());
        }
        let stop = Arc::new(AtomicBool::new(false));
        match crate::service::ingest::zmq::spawn(sh, cfg.clone(), stop.clone()) {
            Ok(t) => {
                running.insert(
                    id,
                    Running {
                        cfg,
                        stop,
                        thread: Some(t),
                    },
                );
            }
            Err(e) => eprintln!("kvroute: engines file {path}: engine {id:?}: {e}"),
        }
    }
    if added.is_empty() && removed.is_empty() && changed.is_empty() {
        return;
    }
    eprintln!(
        "kvroute: engines file {path}: added {added:?}, removed {removed:?}, changed {changed:?}; {} engines from the file",
        running.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(id: &str) -> EngineEndpoint {
        EngineEndpoint::parse_compact(&format!("worker_id={id},endpoint=tcp://h:1")).unwrap()
    }

    #[test]
    fn the_file_is_checked_whole_against_the_static_list() {
        let ok = b"[[engines]]\nworker_id = \"a\"\nendpoint = \"tcp://vllm-0.vllm:5557\"\n";
        assert_eq!(parse(ok, &[], 10).unwrap()[0].worker_id, "a");
        assert!(parse(b"", &[], 10).unwrap().is_empty(), "empty: no engines");
        assert!(parse(ok, &[e("a")], 10).unwrap_err().contains("twice"));
        assert!(parse(ok, &[e("b")], 1).unwrap_err().contains("max_workers"));
        assert!(parse(b"[[engines]]\nworker_id = \"a\"\n", &[], 10).is_err());
        assert!(parse(b"cores = 2\n", &[], 10).is_err(), "only [[engines]]");
        assert!(parse(&[0xff, 0xfe], &[], 10).is_err());
        let bad = b"[[engines]]\nworker_id = \"a\"\nendpoint = \"tcp://*:5557\"\n";
        assert!(parse(bad, &[], 10).is_err(), "bind form");
    }
}
