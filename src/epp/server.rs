//! The ext_proc gRPC server (`envoy.service.ext_proc.v3.ExternalProcessor/Process`)
//! and the gRPC health service the endpoint picker protocol requires.
//!
//! It runs on its own OS thread, "kvroute-epp", with a current-thread tokio runtime
//! (tonic is tokio's; the glommio cores never run tokio, as with the cluster bridge).
//! Each ext_proc stream is a task driving one `stream::Stream`: it reads a message,
//! runs the machine, sends what it says in order, routes through the [`Picker`] (a
//! future: the service answers it from its cores), and reports lifecycle signals.
//!
//! Bounds: at most `max_streams` streams at once (beyond: RESOURCE_EXHAUSTED at once);
//! a gRPC message is refused past `max_body_bytes` + 64 KiB before it is decoded
//! (tonic's limit); at most [`OUT_QUEUE`] answers wait for a slow gateway (then the
//! stream waits, it does not buffer); HTTP/2 keep-alive pings find dead gateways
//! (a stream they held finishes as cut). An undecodable message fails its stream with
//! INVALID_ARGUMENT; the server goes on serving the others.
//!
//! Health (`grpc.health.v1.Health/Check`): `""`, `liveness`, `readiness` and
//! `envoy.service.ext_proc.v3.ExternalProcessor` answer SERVING while the server runs.
//!
//! Drain ([`EppServer::drain`], at SIGTERM): from then on a new stream is refused with
//! UNAVAILABLE (the gateway applies the pool's `failureMode`, or asks another EPP
//! replica), `readiness` and the ext_proc service answer NOT_SERVING, and the open
//! streams run on to their end; [`EppServer::open_streams`] says how many are left.

use super::metrics::{EppMetrics, KindLabel, WorkerLabel};
use super::pick::{Life, Picker};
use super::stream::{FailCode, Limits, Out, Stream};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Answers queued per stream for the gateway to read.
pub const OUT_QUEUE: usize = 32;

struct Ctx {
    picker: Arc<dyn Picker>,
    metrics: Arc<EppMetrics>,
    limits: Limits,
    streams: Arc<Semaphore>,
    draining: AtomicBool,
}

struct Service(Arc<Ctx>);

type Reply = Result<ProcessingResponse, Status>;

#[tonic::async_trait]
impl ExternalProcessor for Service {
    type ProcessStream = ReceiverStream<Reply>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let ctx = self.0.clone();
        if ctx.draining.load(Ordering::Acquire) {
            ctx.metrics.error("draining");
            return Err(Status::unavailable(
                "kvroute endpoint picker: draining (shutting down)",
            ));
        }
        let Ok(permit) = ctx.streams.clone().try_acquire_owned() else {
            ctx.metrics.streams_refused.inc();
            return Err(Status::resource_exhausted(
                "kvroute endpoint picker: max_streams ext_proc streams are open",
            ));
        };
        let (tx, rx) = mpsc::channel(OUT_QUEUE);
        tokio::spawn(drive(ctx, request.into_inner(), tx, permit));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Counts an open stream while alive.
struct Open(Arc<Ctx>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.metrics.streams.dec();
    }
}

async fn drive(
    ctx: Arc<Ctx>,
    mut inbound: Streaming<ProcessingRequest>,
    tx: mpsc::Sender<Reply>,
    _permit: OwnedSemaphorePermit,
) {
    ctx.metrics.streams.inc();
    let _open = Open(ctx.clone());
    let mut st = Stream::new(ctx.limits, rand::random());
    let mut started: Option<Instant> = None;
    loop {
        let next = tokio::select! {
            m = inbound.message() => m,
            _ = tx.closed() => Ok(None),
        };
        let outs = match next {
            Ok(Some(msg)) => {
                started.get_or_insert_with(Instant::now);
                st.on_message(msg)
            }
            Ok(None) => break,
            Err(e) => {
                // An undecodable message (or a reset): say why, if anyone listens.
                let kind = if e.code() == tonic::Code::Internal {
                    "undecodable"
                } else {
                    "reset"
                };
                ctx.metrics.error(kind);
                let msg = format!("kvroute endpoint picker: {}", e.message());
                let _ = tx.try_send(Err(Status::invalid_argument(msg)));
                break;
            }
        };
        if !run(&ctx, &mut st, outs, &tx, started).await {
            break;
        }
    }
    let outs = st.on_close();
    run(&ctx, &mut st, outs, &tx, started).await;
}

/// Carries out `outs` (and what the pick adds); `false`: the stream is over.
async fn run(
    ctx: &Ctx,
    st: &mut Stream,
    outs: Vec<Out>,
    tx: &mpsc::Sender<Reply>,
    started: Option<Instant>,
) -> bool {
    let mut q: VecDeque<Out> = outs.into();
    let mut open = true;
    while let Some(o) = q.pop_front() {
        match o {
            Out::Send(r) => {
                if open && tx.send(Ok(r)).await.is_err() {
                    open = false;
                }
            }
            // Nobody reads the answer: not routed (`on_close` ends the stream).
            Out::Route(_) if !open => {}
            Out::Route(route) => {
                let resolved = route.resolve(&ctx.picker.endpoints());
                ctx.metrics.subset_unknown.inc_by(resolved.unknown as u64);
                let result = match resolved.request {
                    Ok(req) => {
                        let t = Instant::now();
                        let r = ctx.picker.pick(req).await;
                        ctx.metrics.route_seconds.observe(t.elapsed().as_secs_f64());
                        r
                    }
                    Err(e) => Err(e),
                };
                if let Ok(p) = &result {
                    let worker = p.worker.clone();
                    ctx.metrics
                        .picks
                        .get_or_create(&WorkerLabel { worker })
                        .inc();
                    if let Some(t) = started {
                        ctx.metrics.pick_seconds.observe(t.elapsed().as_secs_f64());
                    }
                }
                q.extend(st.on_pick(result));
            }
            Out::Life(id, life) => {
                if let Life::Finish(o) = &life {
                    let kind = o.label();
                    ctx.metrics
                        .finished
                        .get_or_create(&KindLabel { kind })
                        .inc();
                }
                ctx.picker.life(&id, life);
            }
            Out::Refused(kind) => ctx.metrics.error(kind),
            Out::Fail(f) => {
                let status = match f.code {
                    FailCode::InvalidArgument => Status::invalid_argument(f.message),
                    FailCode::FailedPrecondition => Status::failed_precondition(f.message),
                };
                if open {
                    let _ = tx.send(Err(status)).await;
                }
                open = false;
            }
        }
    }
    // A stream the gateway stopped reading is over: `on_close` finishes its request.
    open
}

/// The running server; stopping it (or dropping it) ends every stream.
pub struct EppServer {
    addr: SocketAddr,
    ctx: Arc<Ctx>,
    max_streams: usize,
    /// Wakes the server task to report NOT_SERVING (drain).
    drain: Arc<tokio::sync::Notify>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EppServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Refuses new streams from now on (UNAVAILABLE) and reports NOT_SERVING; the
    /// open streams run on.
    pub fn drain(&self) {
        self.ctx.draining.store(true, Ordering::Release);
        self.drain.notify_one();
    }

    /// ext_proc streams open now.
    pub fn open_streams(&self) -> usize {
        self.max_streams - self.ctx.streams.available_permits()
    }

    /// Stops accepting, ends the streams, and joins the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EppServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Serves ext_proc on `listener` (bound by the caller, so a taken port is reported
/// at start-up) from the "kvroute-epp" thread.
pub fn start(
    settings: &super::config::EppSettings,
    listener: std::net::TcpListener,
    picker: Arc<dyn Picker>,
    metrics: Arc<EppMetrics>,
) -> Result<EppServer, String> {
    settings.validate()?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("epp listener: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("epp listener: {e}"))?;
    let ctx = Arc::new(Ctx {
        picker,
        metrics,
        limits: settings.limits(),
        streams: Arc::new(Semaphore::new(settings.max_streams)),
        draining: AtomicBool::new(false),
    });
    let drain = Arc::new(tokio::sync::Notify::new());
    let (server_ctx, server_drain) = (ctx.clone(), drain.clone());
    let max_message = settings.max_body_bytes + (64 << 10);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let thread = std::thread::Builder::new()
        .name("kvroute-epp".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("epp runtime: {e}")));
                    return;
                }
            };
            let stops = Stops {
                stop: stop_rx,
                drain: server_drain,
            };
            rt.block_on(serve(server_ctx, listener, max_message, stops, ready_tx));
        })
        .map_err(|e| format!("epp thread: {e}"))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(EppServer {
            addr,
            ctx,
            max_streams: settings.max_streams,
            drain,
            stop: Some(stop_tx),
            thread: Some(thread),
        }),
        Ok(Err(e)) => Err(e),
        Err(_) => Err("epp thread ended at start-up".into()),
    }
}

/// What ends (`stop`) or drains the server.
struct Stops {
    stop: oneshot::Receiver<()>,
    drain: Arc<tokio::sync::Notify>,
}

async fn serve(
    ctx: Arc<Ctx>,
    listener: std::net::TcpListener,
    max_message: usize,
    stops: Stops,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let Stops { stop, drain } = stops;
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(format!("epp listener: {e}")));
            return;
        }
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<ExternalProcessorServer<Service>>()
        .await;
    for name in ["", "liveness", "readiness"] {
        health
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let ext_proc = ExternalProcessorServer::new(Service(ctx))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    // tonic sets TCP_NODELAY only on the connections it accepts itself: without it
    // the pick and the body handed back after it, two writes, wait out the gateway's
    // delayed ACK (40 ms).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let _ = ready.send(Ok(()));
    let (graceful_tx, graceful_rx) = oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(health_service)
        .add_service(ext_proc)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = graceful_rx.await;
        });
    tokio::pin!(server);
    // Drain: NOT_SERVING, then serve on until stopped.
    let not_serving = async {
        drain.notified().await;
        health
            .set_not_serving::<ExternalProcessorServer<Service>>()
            .await;
        health
            .set_service_status("readiness", tonic_health::ServingStatus::NotServing)
            .await;
        std::future::pending::<()>().await
    };
    tokio::pin!(not_serving);
    tokio::select! {
        _ = &mut not_serving => {}
        served = &mut server => {
            if let Err(e) = served {
                eprintln!("kvroute: endpoint picker server stopped: {e}");
            }
        }
        _ = stop => {
            // Streams can last as long as a generation: give them a moment, then the
            // runtime ends with them.
            let _ = graceful_tx.send(());
            let _ = tokio::time::timeout(STOP_GRACE, &mut server).await;
        }
    }
}

/// How long a stop waits for open streams.
const STOP_GRACE: Duration = Duration::from_millis(500);
