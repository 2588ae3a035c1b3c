//! The running service (`kvroute serve`): glommio executors, one per core, each owning
//! one index shard; cores talk only through the lock-free mailboxes in `mailbox`.
//!
//! This layer moves data between the pure modules and owns no routing logic:
//! - `ingest`: binary event connections → index operations fanned out to shards;
//! - `api` / `http`: binary and JSON request APIs → `router` (scatter/gather/decide);
//! - `core`: per-core state and the cross-core message handler; `run_loop`: the loop
//!   that feeds it from the core's urgent and bulk inboxes;
//! - `control`: registry writes; `board`: lock-free per-worker load figures;
//! - `zmq_ingest`: OS threads subscribed to vLLM / SGLang KV events over ZMQ.

pub mod api;
pub mod batch;
pub mod conn;
pub mod control;
pub mod core;
pub mod errors;
pub mod http;
pub mod hyper_io;
pub mod index_batch;
pub mod ingest;
pub mod metrics;
pub mod msg;
pub mod persist;
pub mod recorder;
pub mod router;
pub mod run_loop;
pub mod shared;
pub mod state_dir;
pub mod zmq_ingest;

use self::core::Core;
use crate::settings::Settings;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use shared::Shared;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Raises RLIMIT_MEMLOCK's soft limit to the hard limit (io_uring registers memory).
pub fn raise_memlock() {
    // SAFETY: plain libc calls on a stack-allocated struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
        }
    }
}

/// Executors to run: `--cores` or all online cores, rounded down to a power of two (the
/// shard of a block is the top bits of its hash).
pub fn effective_cores(requested: Option<usize>) -> usize {
    let n = requested
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
        .max(1);
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// A running service: join it, or stop it.
pub struct Running {
    pub shared: Arc<Shared>,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
    snapshotter: Option<std::thread::JoinHandle<()>>,
    engines: Vec<std::thread::JoinHandle<()>>,
    /// The state dir's lock (`state_dir::StateDir`), held until the process exits.
    _state_lock: Option<std::fs::File>,
}

impl Running {
    /// Stops accepting, takes the shutdown snapshot (with `state_dir`), lets in-flight
    /// work finish (bounded), and joins the cores. `Err` when the shutdown snapshot
    /// failed: the state dir then holds an older snapshot (or none), and the caller
    /// must say so (`kvroute serve` exits 1).
    pub fn shutdown(self) -> Result<(), String> {
        self.stop(true)
    }

    /// [`Running::shutdown`]; without `snapshot` (a start that failed) the state dir is
    /// left as it was, since nothing was served that it lacks.
    fn stop(mut self, snapshot: bool) -> Result<(), String> {
        let mut result = Ok(());
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(t) = self.snapshotter.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.shared.settings.state_dir.as_ref().filter(|_| snapshot) {
            // Routing and lifecycle calls are refused from `stopping` on; let the ones
            // already running finish so the snapshot holds every answered request.
            let t0 = std::time::Instant::now();
            while self.shared.inflight.load(Ordering::SeqCst) > 0
                && t0.elapsed() < Duration::from_secs(2)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            match persist::take_recorded(&self.shared, std::path::Path::new(dir)) {
                Ok(t) => eprintln!(
                    "kvroute: shutdown snapshot: {} index entries, {} in-flight requests in {dir}",
                    t.entries, t.requests
                ),
                Err(e) => {
                    result = Err(format!(
                        "shutdown snapshot failed: {e}; {dir} does not hold the state at shutdown"
                    ))
                }
            }
        }
        if let Some(r) = self.shared.recorder.get() {
            r.shutdown();
        }
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for c in 0..self.shared.cores {
            self.shared.wake(c);
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        for h in self.engines {
            let _ = h.join();
        }
        result
    }
}

/// Starts the service and returns once every core listens.
pub fn start(settings: Settings) -> Result<Running, String> {
    settings.validate()?;
    let token = settings.resolve_token()?;
    raise_memlock();
    let cores = effective_cores(settings.cores);
    let shard_bits = cores.trailing_zeros();
    let limits = settings.limits.clone();
    let state = state_dir::load_at_start(&settings, cores, shard_bits)?;
    let restored = state.restored;
    let persist::RestoredState {
        registry,
        mut shards,
        saved,
        requests,
    } = restored.unwrap_or_else(|| persist::RestoredState {
        registry: crate::registry::Registry::new(limits.max_workers),
        shards: Vec::new(),
        saved: Vec::new(),
        requests: Vec::new(),
    });
    let requests = Arc::new(requests);
    shards.resize_with(cores, crate::index::IndexShard::new);
    let (shared, doorbells) =
        Shared::new(settings, cores, registry, token).map_err(|e| format!("doorbells: {e}"))?;
    if let Some(path) = shared.settings.record.clone() {
        let cfg = recorder::RecordConfig {
            path,
            block_size: shared.settings.router.block_size,
            max_bytes: shared.settings.record_max_bytes,
            max_ids: shared.settings.record_max_ids,
        };
        let m = &shared.metrics;
        let r = recorder::Recorder::start(cfg, m.record_lines.clone(), m.record_stopped.clone())?;
        let _ = shared.recorder.set(r);
    }
    for (slot, w) in &saved {
        if let Some(c) = shared.cells(*slot) {
            c.gen.store(1, Ordering::Release);
            c.heartbeat.store(w.heartbeat, Ordering::Release);
            c.next_seq.store(w.next_seq, Ordering::Release);
            // One heartbeat window to reconnect before leaving routing.
            c.last_seen_ms.store(0, Ordering::Release);
        }
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let mut handles = Vec::new();
    let mut first_err = None;
    for ((id, bell), shard) in doorbells.into_iter().enumerate().zip(shards) {
        let sh = shared.clone();
        let ready = ready_tx.clone();
        let requests = requests.clone();
        let spin = sh.settings.spin_before_park_us;
        let mut b = LocalExecutorBuilder::new(Placement::Fixed(id % num_cpus()))
            .name(&format!("kvroute-core-{id}"))
            .io_memory(512 << 10);
        if spin > 0 {
            b = b.spin_before_park(Duration::from_micros(spin));
        }
        let spawned = b.spawn(move || async move {
            let core = Rc::new(Core::new(id, sh.clone(), shard));
            persist::restore_requests(&core, &requests);
            drop(requests);
            match bind_all(&sh) {
                Ok((ev, api_l, http_l)) => {
                    let _ = ready.send(Ok(()));
                    glommio::spawn_local(accept_loop(core.clone(), ev, "events", ingest::serve))
                        .detach();
                    glommio::spawn_local(accept_loop(core.clone(), api_l, "api", api::serve))
                        .detach();
                    glommio::spawn_local(accept_loop(core.clone(), http_l, "http", serve_http))
                        .detach();
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                }
            }
            run_loop::run(core, bell).await;
        });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                first_err = Some(format!(
                    "cannot start executor {id}: {e} (kvroute needs io_uring: Linux >= 5.8 with io_uring enabled, and RLIMIT_MEMLOCK >= 512 KiB)"
                ));
                break;
            }
        }
    }
    drop(ready_tx);
    for _ in 0..handles.len() {
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert("a core did not start".into());
            }
        }
    }
    let mut running = Running {
        shared,
        handles,
        snapshotter: None,
        engines: Vec::new(),
        _state_lock: state.lock,
    };
    if let Some(e) = first_err {
        let _ = running.stop(false);
        return Err(e);
    }
    if let Some(dir) = running.shared.settings.state_dir.clone() {
        let every = Duration::from_millis(running.shared.settings.snapshot_interval_ms);
        running.snapshotter = Some(persist::spawn_periodic(
            running.shared.clone(),
            dir.into(),
            every,
        ));
    }
    running.engines = zmq_ingest::start(&running.shared);
    Ok(running)
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

fn bind_all(sh: &Shared) -> Result<(TcpListener, TcpListener, TcpListener), String> {
    let s = &sh.settings;
    let bind = |a: &str| TcpListener::bind(a).map_err(|e| format!("cannot listen on {a}: {e}"));
    Ok((
        bind(&s.events_addr)?,
        bind(&s.api_addr)?,
        bind(&s.http_addr)?,
    ))
}

/// Accepts connections until shutdown, enforcing the per-core connection limit.
async fn accept_loop<F, Fut>(core: Rc<Core>, l: TcpListener, name: &'static str, serve: F)
where
    F: Fn(Rc<Core>, glommio::net::TcpStream) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let open = Rc::new(AtomicUsize::new(0));
    let labels = metrics::ListenerLabel { listener: name };
    loop {
        let stream = match l.accept().await {
            Ok(s) => s,
            Err(_) => {
                glommio::timer::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        if core.shared.stopping.load(Ordering::Relaxed) {
            break;
        }
        core.shared
            .metrics
            .connections_total
            .get_or_create(&labels)
            .inc();
        if open.load(Ordering::Relaxed) >= core.shared.settings.limits.max_connections {
            core.shared.metrics.protocol_error("connection_limit");
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        open.fetch_add(1, Ordering::Relaxed);
        core.shared.metrics.connections.get_or_create(&labels).inc();
        let (c, o, sh) = (core.clone(), open.clone(), core.shared.clone());
        let fut = serve(c, stream);
        glommio::spawn_local(async move {
            fut.await;
            o.fetch_sub(1, Ordering::Relaxed);
            sh.metrics
                .connections
                .get_or_create(&metrics::ListenerLabel { listener: name })
                .dec();
        })
        .detach();
    }
}

async fn serve_http(core: Rc<Core>, stream: glommio::net::TcpStream) {
    let svc = hyper::service::service_fn(move |req| http::handle(core.clone(), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(hyper_io::HyperIo(stream), svc)
        .await;
}

/// `/metrics` text, with scrape-time gauges filled from the board.
pub fn scrape(core: &Core) -> String {
    let sh = &core.shared;
    sh.metrics.render(|m| {
        let reg = sh.registry.load();
        let cfg = &sh.settings.router;
        let now = sh.now_us();
        let (mut blocks, mut active) = (0u64, 0u64);
        m.worker_active_requests.clear();
        m.worker_prefill_tokens.clear();
        m.worker_decode_blocks.clear();
        m.worker_cached_blocks.clear();
        m.worker_live.clear();
        for e in reg.iter() {
            let p = sh.board.read(e.slot);
            let load = p.agg.load(cfg.prefill_load_model, now);
            let l = metrics::WorkerLabel {
                worker: e.spec.id.clone(),
            };
            blocks += p.cached_blocks;
            active += load.active_requests as u64;
            m.worker_active_requests
                .get_or_create(&l)
                .set(load.active_requests as i64);
            m.worker_prefill_tokens
                .get_or_create(&l)
                .set(load.prefill_tokens as i64);
            let decode = if cfg.assume_kv_reuse {
                p.blocks_unique as f64
            } else {
                load.blocks_total
            };
            m.worker_decode_blocks.get_or_create(&l).set(decode as i64);
            m.worker_cached_blocks
                .get_or_create(&l)
                .set(p.cached_blocks as i64);
            m.worker_live
                .get_or_create(&l)
                .set(sh.is_live(e.slot, now / 1000) as i64);
        }
        m.index_blocks.set(blocks as i64);
        m.active_requests.set(active as i64);
        m.workers.set(reg.len() as i64);
    })
}
