//! The running service (`kvroute serve`): glommio executors, one per core, each owning
//! one index shard; cores talk only through the lock-free mailboxes of
//! `runtime::msg`. This file is the top: [`start`] wires the layers below into a
//! [`Running`] service (and wires the OpenAI proxy, `crate::proxy`, onto the cores).
//!
//! The service moves data between the pure modules and owns no routing logic. Its
//! layers, lowest first; a layer imports only from itself and the layers below
//! (checked over the `use` graph by `tests/layers.rs`, whose `rules.rs` holds the
//! same list):
//! 1. the pure library (everything of `src/` outside `service/` and the proxy's
//!    driver);
//! 2. `metrics`: the Prometheus registry and the service's families; imports no
//!    feature;
//! 3. `net`: listeners, framed and HTTP connections, slots, deadlines, HTTP doors;
//! 4. `runtime`: executors, per-core state `Core`, process-wide `Shared`, mailboxes
//!    and messages, the run loop, start checks, blocking threads, the recorder, and
//!    the link the cores publish to replicas through;
//! 5. `routing`: route, lifecycle, the registry writes (`control`), error mapping;
//! 6. `cluster`: the NATS side of router replicas and the thread applying what peers
//!    send;
//! 7. `state`: snapshots, the state dir;
//! 8. `ingest`: binary event connections, ZMQ subscribers, the engines file;
//! 9. `api`: the binary and JSON APIs, `/metrics`, the status window and page;
//! 10. the proxy's driver (`crate::proxy`: server, forward, body, health, pool...),
//!     which names of the service only `net`, `metrics` and the routing handle;
//! 11. this file, with the accept loop (`accept`) and the endpoint picker's bridge
//!     (`epp_bridge`: the pipeline's second front end, on the proxy's door).
//!
//! No import goes up: a lower layer that must reach a higher one does it through
//! state it owns and the higher one fills (the cluster link, the status counters) or
//! a trait it defines (`net::hyper_io::ConnHost`).

pub mod accept;
pub mod api;
pub mod cluster;
pub mod epp_bridge;
pub mod ingest;
pub mod metrics;
pub mod net;
pub mod routing;
pub mod runtime;
pub mod state;

use self::runtime::core::Core;
use crate::settings::Settings;
use accept::accept_loop;
pub use api::scrape::scrape;
use glommio::{LocalExecutorBuilder, Placement};
pub use runtime::preflight::raise_memlock;
use runtime::shared::Shared;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

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
    /// The state dir's lock (`state::state_dir::StateDir`), held until the process exits.
    _state_lock: Option<std::fs::File>,
    /// The listening sockets (every core accepts on duplicates), stopped first thing at
    /// shutdown (`net::listeners::Bound::stop_listening`).
    listeners: net::listeners::Bound,
    /// The proxy's listening socket (`proxy_addr`), stopped with the others.
    proxy_listener: Option<net::listeners::Extra>,
    /// The proxy's state shared by the cores (admission count, keys, metrics).
    proxy: Arc<crate::proxy::state::ProxyShared>,
    /// `engines_file`: the thread following it (and the engine threads it started).
    engines_file: Option<ingest::engines_file::Watcher>,
    /// `--epp-addr`: the endpoint picker (`epp_bridge`).
    epp: Option<epp_bridge::Epp>,
}

impl Running {
    /// Stops accepting, takes the shutdown snapshot (with `state_dir`), lets in-flight
    /// work finish (bounded), and joins the cores. `Err` when the shutdown snapshot
    /// failed: the state dir then holds an older snapshot (or none), and the caller
    /// must say so (`kvroute serve` exits 1).
    pub fn shutdown(self) -> Result<(), String> {
        self.stop(true)
    }

    /// Re-reads the engines file now (SIGHUP); `Err` says why it is not followed.
    pub fn reload_engines(&self) -> Result<(), &'static str> {
        match &self.engines_file {
            Some(w) => {
                w.reload();
                Ok(())
            }
            None if self.shared.settings.engines_file.is_some() => Err(
                "with [cluster] the engines file is read only at start: restart the replicas to apply it",
            ),
            None => Err("no engines_file is configured"),
        }
    }

    /// Proxied requests in flight.
    pub fn proxy_inflight(&self) -> usize {
        self.proxy.inflight()
    }

    /// The proxy's drain, before [`Running::shutdown`] (`[proxy] drain_ms`): new proxy
    /// connections are refused and proxied requests in flight run on until none is
    /// left, `drain_ms` has passed, or `interrupted` says to stop (a second signal).
    /// Everything else keeps serving meanwhile, so those requests' lifecycle still
    /// applies and the shutdown snapshot sees them end. Returns how many were still
    /// running, with the endpoint picker's open streams (it drains alongside).
    pub fn drain(&self, mut interrupted: impl FnMut() -> bool) -> usize {
        let p = &self.proxy;
        let max = Duration::from_millis(self.shared.settings.proxy.drain_ms);
        let left = || p.inflight() + epp_bridge::open_streams(&self.epp);
        if max.is_zero() {
            return left();
        }
        epp_bridge::drain(&self.epp);
        if let Some(l) = &self.proxy_listener {
            // Listener first: whoever sees `draining` (`/readyz`) can rely on it being shut.
            l.stop_listening();
            self.shared.draining.store(true, Ordering::SeqCst);
        }
        let t0 = std::time::Instant::now();
        while left() > 0 && t0.elapsed() < max && !interrupted() {
            std::thread::sleep(Duration::from_millis(10));
        }
        left()
    }

    /// [`Running::shutdown`]; without `snapshot` (a start that failed) the state dir is
    /// left as it was, since nothing was served that it lacks.
    fn stop(mut self, snapshot: bool) -> Result<(), String> {
        let mut result = Ok(());
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.listeners.stop_listening();
        if let Some(l) = &self.proxy_listener {
            l.stop_listening();
        }
        // Its streams' requests are finished while the cores still run.
        if let Some(e) = self.epp.take() {
            e.stop();
        }
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
            let left = self.shared.inflight.load(Ordering::SeqCst);
            if left > 0 {
                eprintln!("kvroute: shutdown: {left} calls still running after 2 s; snapshot taken without them");
            }
            match state::persist::take_recorded(&self.shared, std::path::Path::new(dir)) {
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
        if let Some(w) = self.engines_file.take() {
            w.stop();
        }
        // The spans of the last requests, exported within the export timeout.
        if let Some(t) = self.proxy.tracing.get() {
            let wait = Duration::from_millis(self.shared.settings.trace.export_timeout_ms);
            if let Err(e) = t.shutdown(wait) {
                eprintln!("kvroute: trace export at shutdown: {e}");
            }
        }
        result
    }
}

/// Starts the service and returns once every core listens.
pub fn start(mut settings: Settings) -> Result<Running, String> {
    settings.validate()?;
    // Before anything else: what the executors need from the kernel and the limits
    // (a refusal is one line naming the fix, not a panic inside glommio).
    runtime::preflight::check()?;
    runtime::huge_pages::disable();
    // Before anything is bound: a missing or broken tokenizer directory stops the start.
    let tokenizers = Arc::new(settings.load_tokenizers()?);
    for m in tokenizers.models() {
        let how = if tokenizers.is_lean(m) {
            "lean walk of its pipeline"
        } else if settings.tokenize_lean {
            "HF pipeline (a step the lean walk does not cover)"
        } else {
            "HF pipeline (tokenize_lean = false)"
        };
        eprintln!("kvroute: tokenizer for model {m:?}: {how}");
    }
    if !crate::proxy::config::is_off(&settings.proxy_addr)
        && settings.request_ttl_ms < settings.proxy.request_timeout_ms
    {
        eprintln!(
            "kvroute: warning: request_ttl_ms ({}) is below proxy request_timeout_ms ({}): \
             a non-streamed proxied request waiting that long for its answer expires first",
            settings.request_ttl_ms, settings.proxy.request_timeout_ms
        );
    }
    // An unusable engines file stops the start, like any setting. With `[cluster]` its
    // entries join the static list (the engine leases cover that list only).
    let mut first_engines = match &settings.engines_file {
        Some(path) => Some(ingest::engines_file::load(
            path,
            &settings.engines,
            settings.limits.max_workers,
        )?),
        None => None,
    };
    if settings.cluster.url.is_some() {
        if let (Some(first), Some(path)) = (first_engines.take(), &settings.engines_file) {
            let n = first.engines().len();
            settings.engines.extend(first.into_engines());
            eprintln!(
                "kvroute: engines file {path}: {n} engines, read once at start ([cluster]: restart the replicas to apply a change)"
            );
        }
    }
    let token = settings.resolve_token()?;
    let worker_tokens = match &settings.worker_tokens_file {
        Some(path) => crate::credentials::load_worker_tokens(path, token.as_deref())?,
        None => Default::default(),
    };
    let creds = crate::credentials::Credentials::new(token, worker_tokens);
    // Bound here, once per address, before anything slow: a port held by another
    // process stops the start at once (see `listeners`).
    let bound = net::listeners::Bound::bind(
        &settings.events_addr,
        &settings.api_addr,
        &settings.http_addr,
    )?;
    let [ev_addr, api_addr, http_addr] = bound.addrs()?;
    settings.events_addr = ev_addr.to_string();
    settings.api_addr = api_addr.to_string();
    settings.http_addr = http_addr.to_string();
    // The OpenAI proxy's listener (`crate::proxy`), unless `proxy_addr` is off.
    let proxy_keys = settings.proxy.resolve_keys()?;
    let upstream_key = settings.proxy.resolve_upstream_key()?;
    let tenants = settings.admission.resolve_tenants()?;
    let proxy_l = if crate::proxy::config::is_off(&settings.proxy_addr) {
        None
    } else {
        let l = net::listeners::Extra::bind("proxy_addr", &settings.proxy_addr)?;
        settings.proxy_addr = l.addr()?.to_string();
        Some(l)
    };
    let epp_l = epp_bridge::bind(&mut settings)?;
    let cores = effective_cores(settings.cores);
    let (shard_bits, replicated) = Shared::layout(&settings, cores);
    let limits = settings.limits.clone();
    let state = state::state_dir::load_at_start(&settings, cores, shard_bits, replicated)?;
    let restored = state.restored;
    let restored_state = restored.is_some();
    let state::persist::RestoredState {
        mut registry,
        mut shards,
        saved,
        requests,
    } = restored.unwrap_or_else(|| state::persist::RestoredState {
        registry: crate::registry::Registry::new(limits.max_workers),
        shards: Vec::new(),
        saved: Vec::new(),
        requests: Vec::new(),
    });
    shards.resize_with(cores, crate::index::IndexShard::new);
    // A restored worker that was on the event protocol stays owned by it; others may be
    // claimed by the first registration (e.g. their `[[engines]]` entry at start).
    for (slot, w) in &saved {
        let origin = if w.heartbeat {
            crate::registry::Origin::Events
        } else {
            crate::registry::Origin::Restored
        };
        registry.set_origin(*slot, origin);
    }
    let (shared, doorbells) =
        Shared::new(settings, cores, registry, creds).map_err(|e| format!("doorbells: {e}"))?;
    for (c, s) in shards.iter_mut().enumerate() {
        s.attach_budget(shared.budget_of(c).clone());
    }
    let limit = shared.settings.limits.max_index_entries;
    shared
        .metrics
        .index_budget_limit
        .set(i64::try_from(limit).unwrap_or(i64::MAX));
    // The proxy's state, its metric families registered into the service's registry.
    let proxy = Arc::new(crate::proxy::state::ProxyShared::new(&shared.metrics));
    let _ = proxy.keys.set(proxy_keys);
    proxy.set_upstream_key(upstream_key.as_deref());
    let ps = &shared.settings.proxy;
    proxy
        .responses
        .configure(ps.responses_max_entries, ps.responses_ttl_ms);
    let policies = crate::proxy::policies::Policies::new(
        &shared.settings.admission,
        &shared.settings.router,
        tenants,
        &shared.metrics,
    );
    let _ = proxy.policies.set(policies);
    let tracing = crate::trace::Tracing::start(&shared.settings.trace)?;
    shared.metrics.with_registry(|r| tracing.register(r));
    let _ = proxy.tracing.set(tracing);
    let _ = shared.tokenizers.set(tokenizers);
    if let Some(path) = shared.settings.record.clone() {
        let cfg = runtime::recorder::RecordConfig {
            path,
            block_size: shared.settings.router.block_size,
            max_bytes: shared.settings.record_max_bytes,
            max_ids: shared.settings.record_max_ids,
        };
        let m = &shared.metrics;
        let r = runtime::recorder::Recorder::start(
            cfg,
            m.record_lines.clone(),
            m.record_stopped.clone(),
        )?;
        let _ = shared.recorder.set(r);
    }
    for (slot, w) in &saved {
        if let Some(c) = shared.cells(*slot) {
            c.gen.store(1, Ordering::Release);
            c.heartbeat.store(w.heartbeat, Ordering::Release);
            c.approximate.store(w.approximate, Ordering::Release);
            c.next_seq.store(w.next_seq, Ordering::Release);
            // One heartbeat window to reconnect before leaving routing.
            c.last_seen_ms.store(0, Ordering::Release);
        }
    }
    // `--epp-addr`: one queue per core; the server starts once the cores run.
    let (epp_bridge, mut epp_ends) = epp_bridge::prepare(&shared)?;
    let (requests, orphans) = state::persist::drop_orphans(&shared, requests);
    let requests = Arc::new(requests);
    let allowed = runtime::pinning::allowed_cpus();
    let cpus = runtime::pinning::plan(cores, shared.settings.pin_cores, &allowed);
    eprintln!("kvroute: {}", runtime::pinning::describe(&cpus, &allowed));
    let mut placements = runtime::pinning::placements(&cpus)?.into_iter();
    // Before the cores accept anything, so every accepted event is published.
    let cluster_threads = cluster::bridge::start(&shared, restored_state, orphans)?;
    let reports = runtime::core_start::Reports::default();
    let mut handles = Vec::new();
    let mut first_err = None;
    for ((id, bell), shard) in doorbells.into_iter().enumerate().zip(shards) {
        let sh = shared.clone();
        let proxy = proxy.clone();
        let ready = reports.guard(id);
        let requests = requests.clone();
        let spin = sh.settings.spin_before_park_us;
        let slice_us = sh.settings.core_slice_us;
        let mine = match bound.for_core() {
            Ok(l) => l,
            Err(e) => {
                first_err = Some(format!("core {id} did not start: {e}"));
                break;
            }
        };
        let proxy_mine = match proxy_l.as_ref().map(|l| l.for_core()).transpose() {
            Ok(l) => l,
            Err(e) => {
                first_err = Some(format!("core {id} did not start: {e}"));
                break;
            }
        };
        // `pin_cores = false`: the kernel may run a core wherever a CPU is free.
        let placement = placements.next().unwrap_or(Placement::Unbound);
        let epp_end = epp_ends.next().flatten();
        // The core's blocking thread (long prompts' tokenization, the status page's
        // snapshot) is left to the scheduler: pinned next to its core (glommio's
        // default for a fixed placement) it would only take turns with it.
        let b = LocalExecutorBuilder::new(placement)
            .name(&format!("kvroute-core-{id}"))
            .io_memory(512 << 10)
            .blocking_thread_pool_placement(glommio::PoolPlacement::Unbound(1));
        let b = runtime::idle_spin::configure(b, spin);
        let spawned = b.spawn(move || async move {
            if slice_us > 0 {
                if let Err(e) = runtime::sched_slice::set_current(slice_us) {
                    eprintln!("kvroute: core {id}: core_slice_us = {slice_us} not applied ({e}); it keeps the kernel's slice");
                }
            }
            let core = Rc::new(Core::new(id, sh.clone(), shard));
            state::persist::restore_requests(&core, &requests);
            drop(requests);
            let (ev, api_l, http_l) = mine.into_glommio();
            ready.started();
            glommio::spawn_local(accept_loop(
                core.clone(),
                ev,
                "events",
                ingest::events::serve,
            ))
            .detach();
            glommio::spawn_local(accept_loop(core.clone(), api_l, "api", api::binary::serve))
                .detach();
            glommio::spawn_local(accept_loop(core.clone(), http_l, "http", serve_http)).detach();
            // The pipeline's door on this core: its front ends (the proxy, the endpoint
            // picker) reach routing through this core's handle only.
            let front = crate::proxy::front::Front {
                handle: routing::handle::Handle::new(core.clone()),
                state: proxy,
            };
            if let Some(l) = proxy_mine {
                let l = l.into_glommio();
                let front = front.clone();
                let serve = move |_core, stream, slot| {
                    crate::proxy::server::serve(front.clone(), stream, slot)
                };
                glommio::spawn_local(accept_loop(core.clone(), l, "proxy", serve)).detach();
            }
            if id == 0 {
                glommio::spawn_local(api::status::sample_loop(core.clone())).detach();
            }
            glommio::spawn_local(self::runtime::core::expiry_loop(core.clone())).detach();
            glommio::spawn_local(runtime::schedule_lag::probe_loop(core.clone())).detach();
            if let Some(end) = epp_end {
                glommio::spawn_local(epp_bridge::serve_core(core.clone(), front, end)).detach();
            }
            runtime::run_loop::run(core, bell).await;
        });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                first_err = Some(format!("core {id} did not start: {e}"));
                break;
            }
        }
    }
    // The cores that were spawned report (a failed one with its error) even when a
    // later one could not be spawned, so every started core is stopped below.
    if let Err(e) = reports.wait(&mut handles, runtime::core_start::TIMEOUT) {
        first_err.get_or_insert(e);
    }
    let mut running = Running {
        shared,
        handles,
        snapshotter: None,
        engines: cluster_threads,
        _state_lock: state.lock,
        listeners: bound,
        proxy_listener: proxy_l,
        proxy,
        engines_file: None,
        epp: None,
    };
    if first_err.is_none() {
        match epp_bridge::start(epp_bridge, epp_l) {
            Ok(e) => running.epp = e,
            Err(e) => first_err = Some(e),
        }
    }
    if let Some(e) = first_err {
        let _ = running.stop(false);
        return Err(e);
    }
    if let Some(dir) = running.shared.settings.state_dir.clone() {
        let every = Duration::from_millis(running.shared.settings.snapshot_interval_ms);
        running.snapshotter = Some(state::persist::spawn_periodic(
            running.shared.clone(),
            dir.into(),
            every,
        ));
    }
    running.engines.extend(ingest::zmq::start(&running.shared));
    if let (Some(path), Some(first)) = (running.shared.settings.engines_file.clone(), first_engines)
    {
        match ingest::engines_file::Watcher::start(&running.shared, path, first) {
            Ok(w) => running.engines_file = Some(w),
            Err(e) => {
                let _ = running.stop(false);
                return Err(e);
            }
        }
    }
    Ok(running)
}

/// One HTTP connection: hyper over [`net::hyper_io::HyperIo`], which enforces the header,
/// keep-alive idle and body deadlines and the slot's displacement. `half_close` keeps
/// hyper from reading while a handler runs (it would only look for an early EOF), so a
/// read waiting during a request is a body read, timed as such.
async fn serve_http(
    core: Rc<Core>,
    stream: glommio::net::TcpStream,
    slot: Rc<net::conn_slot::Slot>,
) {
    let conn = net::hyper_io::HttpConn::new(core.shared.clone(), slot);
    let io = net::hyper_io::HyperIo::new(stream, conn.clone());
    let svc = hyper::service::service_fn(move |req| {
        let (core, conn) = (core.clone(), conn.clone());
        async move {
            conn.request_started();
            let resp = api::http::handle(core, req).await?;
            Ok::<_, std::convert::Infallible>(
                resp.map(|b| net::hyper_io::TrackedBody::new(b, conn)),
            )
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .half_close(true)
        // Bounds the head (and pipelined bytes) a connection can make hyper buffer.
        .max_buf_size(HTTP_MAX_BUF)
        .serve_connection(io, svc)
        .await;
}

/// hyper's read buffer limit per HTTP connection (its default is ~400 KiB).
const HTTP_MAX_BUF: usize = 64 << 10;
