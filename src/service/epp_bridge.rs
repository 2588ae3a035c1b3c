//! The endpoint picker wired to the running service (`--epp-addr`,
//! docs/ENDPOINT_PICKER.md): [`Bridge`] is the [`Picker`] the ext_proc server
//! (`crate::epp::server`, on the "kvroute-epp" thread's tokio runtime) calls, and each
//! glommio core runs [`serve_core`], which carries its jobs out with the proxy's own
//! pipeline:
//!
//! - tokenize: `proxy::offload::tokenize` (inline for a short body, the core's
//!   blocking thread for a long one; the chat template bounded by
//!   `limits.chat_template_fuel`), the proxy's very call;
//! - route: `proxy::forward::route_request` builds the routing request (LoRA, cache
//!   salt, load-only when the prompt does not tokenize) and `router::route_proxied`
//!   decides with the usual cost, among the workers the gateway allows;
//! - lifecycle: `proxy::body::life` (`router::lifecycle`), as the proxy reports
//!   first token, progress and finish.
//!
//! The EPP thread and the cores meet through one bounded crossbeam queue per core
//! ([`QUEUE`] jobs; picks go round-robin) and a doorbell (a Unix socket pair, as the
//! cores' own inboxes have): a job is queued, then the bell rung, and the core drains
//! its queue after every ring, so no job waits for a later one. A full queue refuses a
//! pick (429, the router is saturated); a lifecycle signal other than finish is then
//! dropped (counted: `kvroute_epp_errors_total{kind="queue_full"}`), and a finish waits
//! for room (bounded, [`FINISH_WAIT`]), since it releases load.
//!
//! Endpoints: a registered worker with a `url` whose host is an IP literal is the
//! endpoint `ip:port`. A worker whose `url` names a DNS host is not resolved: it is
//! left out of the picker's endpoints (one log line per worker), since the gateway
//! needs the address of the very pod (register workers by pod IP for EPP use).
//!
//! Guarantees: every request picked is finished exactly once while the service runs:
//! by its stream's end (or cut), or by the core when the stream went away before the
//! answer. The EPP's requests carry the proxy's reserved id space (`epp-` + the
//! client's `x-request-id`), so those still open at shutdown are not brought back by
//! a warm restart, like the proxy's.

use crate::engine::request::LifeOp;
use crate::epp::metrics::EppMetrics;
use crate::epp::pick::{EndpointInfo, Life, NoPick, Pick, PickFuture, PickRequest, Picker};
use crate::epp::server::{self, EppServer};
use crate::proxy::front::Front;
use crate::proxy::url::UpstreamUrl;
use crate::service::runtime::core::Core;
use crate::service::runtime::shared::Shared;
use crossbeam::channel::{bounded, Receiver, Sender, TrySendError};
use futures_lite::AsyncReadExt;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Jobs queued per core.
pub const QUEUE: usize = 1024;
/// Longest a finish waits for room in a full queue before it is dropped (counted;
/// `request_ttl_ms` then releases the load).
pub const FINISH_WAIT: Duration = Duration::from_secs(1);

enum Job {
    Pick {
        req: PickRequest,
        reply: oneshot::Sender<Result<Pick, NoPick>>,
    },
    Life {
        id: String,
        op: LifeOp,
    },
}

/// The endpoints of one registry snapshot.
struct Endpoints {
    /// The snapshot they were read from (pointer identity).
    reg: Option<Arc<crate::registry::Registry>>,
    list: Arc<[EndpointInfo]>,
    /// Workers already reported as not usable (DNS host).
    warned: HashSet<String>,
}

/// The picker the ext_proc server calls: the service's side of the EPP.
pub struct Bridge {
    sh: Arc<Shared>,
    queues: Box<[Sender<Job>]>,
    bells: Box<[UnixStream]>,
    next: AtomicUsize,
    /// Requests picked and not yet finished: id → the core that holds it.
    live: Mutex<HashMap<String, usize>>,
    endpoints: Mutex<Endpoints>,
    metrics: Arc<EppMetrics>,
}

/// One core's end of the bridge, for [`serve_core`].
pub struct CoreEnd {
    bridge: Arc<Bridge>,
    rx: Receiver<Job>,
    bell: UnixStream,
}

/// The EPP of a running service: the server and its bridge.
pub struct Epp {
    server: Option<EppServer>,
    bridge: Arc<Bridge>,
}

/// Binds `epp.addr` when the EPP is on (before anything slow, like the other
/// listeners: a taken port stops the start); the bound address replaces the setting.
pub fn bind(
    settings: &mut crate::settings::Settings,
) -> Result<Option<std::net::TcpListener>, String> {
    if !settings.epp.enabled() {
        return Ok(None);
    }
    let l = std::net::TcpListener::bind(&settings.epp.addr)
        .map_err(|e| format!("cannot listen on {} (epp addr): {e}", settings.epp.addr))?;
    let a = l.local_addr().map_err(|e| format!("epp addr: {e}"))?;
    settings.epp.addr = a.to_string();
    Ok(Some(l))
}

/// The bridge and, per core, its [`CoreEnd`] (EPP on), else `None`s.
pub fn prepare(sh: &Arc<Shared>) -> Result<(Option<Arc<Bridge>>, Ends), String> {
    if !sh.settings.epp.enabled() {
        return Ok((None, Vec::new().into_iter()));
    }
    let (mut queues, mut rxs, mut bells, mut reads) = (vec![], vec![], vec![], vec![]);
    for _ in 0..sh.cores {
        let (tx, rx) = bounded(QUEUE);
        let (w, r) = UnixStream::pair().map_err(|e| format!("epp doorbell: {e}"))?;
        w.set_nonblocking(true)
            .and_then(|_| r.set_nonblocking(true))
            .map_err(|e| format!("epp doorbell: {e}"))?;
        queues.push(tx);
        rxs.push(rx);
        bells.push(w);
        reads.push(r);
    }
    let metrics = Arc::new(EppMetrics::default());
    sh.metrics.with_registry(|r| metrics.register(r));
    let bridge = Arc::new(Bridge {
        sh: sh.clone(),
        queues: queues.into(),
        bells: bells.into(),
        next: AtomicUsize::new(0),
        live: Mutex::new(HashMap::new()),
        endpoints: Mutex::new(Endpoints {
            reg: None,
            list: Arc::from(Vec::new()),
            warned: HashSet::new(),
        }),
        metrics,
    });
    let ends: Vec<Option<CoreEnd>> = rxs
        .into_iter()
        .zip(reads)
        .map(|(rx, bell)| {
            Some(CoreEnd {
                bridge: bridge.clone(),
                rx,
                bell,
            })
        })
        .collect();
    Ok((Some(bridge), ends.into_iter()))
}

/// Each core's end of the bridge, in core order.
pub type Ends = std::vec::IntoIter<Option<CoreEnd>>;

/// Starts the ext_proc server over `bridge` on `listener` (once the cores run).
pub fn start(
    bridge: Option<Arc<Bridge>>,
    listener: Option<std::net::TcpListener>,
) -> Result<Option<Epp>, String> {
    let (Some(bridge), Some(listener)) = (bridge, listener) else {
        return Ok(None);
    };
    let settings = &bridge.sh.settings.epp;
    let local = listener.local_addr().map(|a| a.ip().is_loopback());
    if !local.unwrap_or(true) {
        eprintln!(
            "kvroute: endpoint picker on {}: it authenticates no caller; make it reachable by the gateway only (docs/ENDPOINT_PICKER.md, Who may call it)",
            settings.addr
        );
    }
    let picker: Arc<dyn Picker> = bridge.clone();
    let server = server::start(settings, listener, picker, bridge.metrics.clone())?;
    Ok(Some(Epp {
        server: Some(server),
        bridge,
    }))
}

/// [`Epp::drain`], when there is one.
pub fn drain(epp: &Option<Epp>) {
    if let Some(e) = epp {
        e.drain();
    }
}

/// [`Epp::open_streams`]; 0 without an EPP.
pub fn open_streams(epp: &Option<Epp>) -> usize {
    epp.as_ref().map_or(0, |e| e.open_streams())
}

impl Epp {
    /// Refuses new streams; the open ones run on (SIGTERM's drain).
    pub fn drain(&self) {
        if let Some(s) = &self.server {
            s.drain();
        }
    }

    /// ext_proc streams still open.
    pub fn open_streams(&self) -> usize {
        self.server.as_ref().map_or(0, |s| s.open_streams())
    }

    /// Stops the server (its thread joined): the streams still open end with it. Their
    /// requests go with the service, as the proxy's do (their ids are the proxy's
    /// kind, which a warm restart does not bring back).
    pub fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
        self.bridge.live().clear();
    }
}

impl Bridge {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` for core `to` and rings its bell; `wait`: retry a full queue for
    /// up to [`FINISH_WAIT`]. `false`: not queued (counted).
    fn send(&self, to: usize, job: Job, wait: bool) -> bool {
        let t0 = Instant::now();
        let mut job = job;
        loop {
            match self.queues[to].try_send(job) {
                Ok(()) => {
                    // A full socket buffer holds bytes already: the core wakes anyway.
                    let _ = (&self.bells[to]).write(&[1]);
                    return true;
                }
                Err(TrySendError::Full(j)) if wait && t0.elapsed() < FINISH_WAIT => {
                    job = j;
                    std::thread::sleep(Duration::from_micros(50));
                }
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.metrics.error("queue_full");
                    return false;
                }
            }
        }
    }

    /// The endpoints of the current registry snapshot (rebuilt when it changed).
    fn current(&self) -> Arc<[EndpointInfo]> {
        let reg = self.sh.registry.load_full();
        let mut e = self.endpoints.lock().unwrap_or_else(|p| p.into_inner());
        if e.reg.as_ref().is_some_and(|r| Arc::ptr_eq(r, &reg)) {
            return e.list.clone();
        }
        let mut list = Vec::new();
        for w in reg.iter() {
            let Some(url) = &w.spec.url else { continue };
            match endpoint_of(url) {
                Some(ep) => list.push(EndpointInfo {
                    worker: w.spec.id.clone(),
                    endpoint: ep,
                }),
                None => {
                    if e.warned.insert(w.spec.id.clone()) {
                        eprintln!(
                            "kvroute: endpoint picker: worker {:?} left out: its url {url:?} does not name an IP address (the gateway needs the pod's address)",
                            w.spec.id
                        );
                    }
                }
            }
        }
        e.list = list.into();
        e.reg = Some(reg);
        e.list.clone()
    }
}

/// `ip:port` of a worker url whose host is an IP literal; `None` otherwise.
pub fn endpoint_of(url: &str) -> Option<String> {
    let u = UpstreamUrl::parse(url).ok()?;
    let host = u.host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = host.parse().ok()?;
    Some(SocketAddr::new(ip, u.port).to_string())
}

impl Picker for Bridge {
    fn pick(&self, mut req: PickRequest) -> PickFuture {
        if req.allow.is_none() {
            let all = self.current().iter().map(|e| e.worker.clone()).collect();
            req.allow = Some(all);
        }
        let (tx, rx) = oneshot::channel();
        let to = self.next.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        if !self.send(to, Job::Pick { req, reply: tx }, false) {
            let busy = NoPick::Busy("the router's queue is full".into());
            return Box::pin(async move { Err(busy) });
        }
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(NoPick::Internal("the router is stopping".into())))
        })
    }

    fn life(&self, request_id: &str, life: Life) {
        let op = match life {
            // The load was taken at the pick, as the proxy's is.
            Life::Admitted { .. } => return,
            Life::FirstToken => LifeOp::FirstToken,
            Life::Progress(n) => LifeOp::Progress(n),
            Life::Finish(_) => LifeOp::Finish,
        };
        let finish = op == LifeOp::Finish;
        let core = if finish {
            self.live().remove(request_id)
        } else {
            self.live().get(request_id).copied()
        };
        // Unknown: finished already (the stop's sweep).
        let Some(core) = core else { return };
        let id = request_id.to_string();
        self.send(core, Job::Life { id, op }, finish);
    }

    fn endpoints(&self) -> Arc<[EndpointInfo]> {
        self.current()
    }
}

thread_local! {
    static COUNTER: Cell<u64> = const { Cell::new(0) };
}

/// Core `core`'s side of the bridge: runs the jobs queued for it until shutdown.
pub async fn serve_core(core: Rc<Core>, front: Front, end: CoreEnd) {
    // SAFETY: the fd comes from a live std UnixStream we own and give up here.
    let mut bell = unsafe { glommio::net::UnixStream::from_raw_fd(end.bell.into_raw_fd()) };
    let mut buf = [0u8; 64];
    loop {
        while let Ok(job) = end.rx.try_recv() {
            match job {
                Job::Life { id, op } => crate::proxy::body::life(&front, op, &id),
                Job::Pick { req, reply } => {
                    let (core, front, bridge) = (core.clone(), front.clone(), end.bridge.clone());
                    glommio::spawn_local(async move {
                        let r = pick_here(&core, &front, req).await;
                        if let Ok(p) = &r {
                            bridge.live().insert(p.request_id.clone(), core.id);
                        }
                        // The stream went away meanwhile: nobody will finish it.
                        if let Err(Ok(p)) = reply.send(r) {
                            if bridge.live().remove(&p.request_id).is_some() {
                                crate::proxy::body::life(&front, LifeOp::Finish, &p.request_id);
                            }
                        }
                    })
                    .detach();
                }
            }
        }
        if core.shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        match bell.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Tokenizes and routes one request on this core, as the proxy does.
async fn pick_here(core: &Rc<Core>, front: &Front, req: PickRequest) -> Result<Pick, NoPick> {
    let sh = &core.shared;
    let allow = req.allow.unwrap_or_default();
    if allow.is_empty() {
        return Err(NoPick::NoEndpoint(
            "no worker with an IP address url is registered".into(),
        ));
    }
    let counter = COUNTER.with(|c| {
        c.set(c.get().wrapping_add(1));
        c.get()
    });
    let client = format!("epp-{}", req.client_id);
    let rid = crate::proxy::request::router_id(&client, &front.state.nonce, core.id, counter, 0);
    let rr = match (req.endpoint, req.request) {
        (Some(ep), Some(creq)) => {
            let (creq, tokens) =
                crate::proxy::offload::tokenize(front, ep, creq, req.body_len).await;
            let tokens = tokens.map_err(|e| NoPick::BadRequest(e.0))?;
            crate::proxy::route_request::route_request(
                sh.tokenizers.get().map(|t| &**t),
                &creq,
                tokens,
                req.body_len,
                &rid,
                allow,
            )
        }
        // Not a completion (no model named): by load, among the allowed workers when
        // they serve one model, its size estimated from its bytes.
        _ => crate::engine::RouteRequest {
            request_id: rid.clone(),
            model: Some(one_model(sh, &allow)?),
            block_hashes: Some(Vec::new()),
            input_tokens: Some((req.body_len / 4) as u32),
            allow: Some(allow),
            ..Default::default()
        },
    };
    let d = match crate::service::routing::router::route_proxied(core, &rr).await {
        Ok(d) => d,
        Err(e) => {
            use crate::codec::ErrorCode as C;
            let m = e.to_string();
            return Err(match crate::service::routing::errors::code(&e) {
                C::AllBusy | C::Overloaded => NoPick::Busy(m),
                C::NoEligibleWorker | C::UnknownWorker => NoPick::NoEndpoint(m),
                C::BadRequest => NoPick::BadRequest(m),
                _ => NoPick::Internal(m),
            });
        }
    };
    let reg = sh.registry.load();
    let url_of = |w: &str| {
        reg.slot(w)
            .and_then(|s| reg.get(s))
            .and_then(|e| e.spec.url.as_deref())
            .and_then(endpoint_of)
    };
    let Some(endpoint) = url_of(&d.decode_worker) else {
        crate::proxy::body::life(front, LifeOp::Finish, &rid);
        return Err(NoPick::NoEndpoint(format!(
            "worker {:?} has no IP address url",
            d.decode_worker
        )));
    };
    Ok(Pick {
        request_id: rid,
        prefill: d.prefill_worker.as_deref().and_then(url_of),
        worker: d.decode_worker,
        endpoint,
    })
}

/// The model every worker of `allow` serves; a 503 when they serve several.
fn one_model(sh: &Shared, allow: &[String]) -> Result<String, NoPick> {
    let reg = sh.registry.load();
    let mut models = allow
        .iter()
        .filter_map(|w| reg.slot(w).and_then(|s| reg.get(s)))
        .map(|e| e.spec.model.as_str());
    let first = models.next().unwrap_or("");
    if models.any(|m| m != first) {
        return Err(NoPick::NoEndpoint(
            "a request naming no model, to workers serving several models".into(),
        ));
    }
    Ok(first.to_string())
}
