//! The span processor of kvroute's tracer: a finished span is handed to a bounded
//! queue (`try_send`: a core never waits) and exported in batches by the OTLP
//! exporter on its own thread, which runs its own single-threaded tokio runtime (the
//! service's cores are glommio executors; tonic and hyper need tokio).
//!
//! Guarantees: at most `queue_spans` spans wait; a span that finds the queue full is
//! dropped and counted, as is every span of an export that failed or took longer than
//! the export timeout; a batch is sent when it holds [`BATCH_SPANS`] spans or its
//! oldest span waited [`BATCH_DELAY`]; shutdown exports what is queued, within its
//! timeout.

use super::config::{OtlpProtocol, TraceSettings};
use crossbeam::channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus_client::metrics::counter::Counter;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Spans per export request.
pub const BATCH_SPANS: usize = 512;
/// Longest a finished span waits for its batch.
pub const BATCH_DELAY: Duration = Duration::from_millis(500);

/// What the exporter did: Prometheus counters (`kvroute_trace_spans_exported_total`,
/// `kvroute_trace_spans_dropped_total`, `kvroute_trace_exports_failed_total` once
/// registered with [`ExportStats::register`]).
#[derive(Debug, Default)]
pub struct ExportStats {
    pub exported: Counter,
    /// Dropped at the queue (full) or in an export that failed or timed out.
    pub dropped: Counter,
    pub failed_exports: Counter,
}

impl ExportStats {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "trace_spans_exported",
            "Spans the OTLP exporter delivered",
            self.exported.clone(),
        );
        r.register(
            "trace_spans_dropped",
            "Spans dropped: the export queue was full, or their export failed or timed out",
            self.dropped.clone(),
        );
        r.register(
            "trace_exports_failed",
            "OTLP export requests that failed or timed out",
            self.failed_exports.clone(),
        );
    }
}

enum Msg {
    Span(Box<SpanData>),
    Resource(Resource),
    Flush(Sender<()>),
    Shutdown(Sender<()>),
}

/// The processor the tracer provider calls on every span end.
#[derive(Debug)]
pub struct QueueProcessor {
    tx: Sender<MsgBox>,
    stats: Arc<ExportStats>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// `Msg` behind a Debug-able name (crossbeam's Sender needs T: Debug for the derive).
pub struct MsgBox(Msg);

impl std::fmt::Debug for MsgBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl QueueProcessor {
    /// Starts the exporter thread for `s` (which has an endpoint). Errors: the
    /// exporter could not be built (a malformed endpoint), or the thread not started.
    pub fn start(s: &TraceSettings, stats: Arc<ExportStats>) -> Result<QueueProcessor, String> {
        let url = s.export_url().ok_or("trace: no otlp_endpoint")?;
        let timeout = Duration::from_millis(s.export_timeout_ms);
        let protocol = s.otlp_protocol;
        let (tx, rx) = bounded::<MsgBox>(s.queue_spans);
        let (ready_tx, ready_rx) = bounded::<Result<(), String>>(1);
        let st = stats.clone();
        let thread = std::thread::Builder::new()
            .name("kvroute-otlp".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("trace: exporter runtime: {e}")));
                        return;
                    }
                };
                let built = {
                    let _enter = rt.enter();
                    build_exporter(protocol, &url, timeout)
                };
                match built {
                    Ok(exporter) => {
                        let _ = ready_tx.send(Ok(()));
                        run(rt, exporter, rx, st, timeout);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| format!("trace: exporter thread: {e}"))?;
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => return Err("trace: the exporter did not start".into()),
        }
        Ok(QueueProcessor {
            tx,
            stats,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn control(&self, make: impl FnOnce(Sender<()>) -> Msg, timeout: Duration) -> OTelSdkResult {
        let (ack_tx, ack_rx) = bounded(1);
        self.tx
            .send_timeout(MsgBox(make(ack_tx)), timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))?;
        ack_rx
            .recv_timeout(timeout)
            .map_err(|_| OTelSdkError::Timeout(timeout))
    }
}

fn build_exporter(
    protocol: OtlpProtocol,
    url: &str,
    timeout: Duration,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let b = opentelemetry_otlp::SpanExporter::builder();
    let r = match protocol {
        OtlpProtocol::Grpc => b
            .with_tonic()
            .with_endpoint(url)
            .with_timeout(timeout)
            .build(),
        OtlpProtocol::Http => b
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(timeout)
            .with_headers(Default::default())
            .build(),
    };
    r.map_err(|e| format!("trace: OTLP exporter for {url}: {e}"))
}

fn run(
    rt: tokio::runtime::Runtime,
    mut exporter: opentelemetry_otlp::SpanExporter,
    rx: Receiver<MsgBox>,
    stats: Arc<ExportStats>,
    timeout: Duration,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH_SPANS);
    let mut due: Option<Instant> = None;
    let export = |batch: &mut Vec<SpanData>, exporter: &opentelemetry_otlp::SpanExporter| {
        if batch.is_empty() {
            return;
        }
        let spans = std::mem::replace(batch, Vec::with_capacity(BATCH_SPANS));
        let n = spans.len() as u64;
        let ok = rt.block_on(async {
            matches!(
                tokio::time::timeout(timeout, exporter.export(spans)).await,
                Ok(Ok(()))
            )
        });
        if ok {
            stats.exported.inc_by(n);
        } else {
            stats.failed_exports.inc();
            stats.dropped.inc_by(n);
        }
    };
    loop {
        let wait = due.map_or(Duration::from_secs(3600), |d| {
            d.saturating_duration_since(Instant::now())
        });
        match rx.recv_timeout(wait) {
            Ok(MsgBox(Msg::Span(s))) => {
                batch.push(*s);
                due.get_or_insert_with(|| Instant::now() + BATCH_DELAY);
                if batch.len() >= BATCH_SPANS {
                    export(&mut batch, &exporter);
                    due = None;
                }
            }
            Ok(MsgBox(Msg::Resource(r))) => exporter.set_resource(&r),
            Ok(MsgBox(Msg::Flush(ack))) => {
                export(&mut batch, &exporter);
                due = None;
                let _ = ack.send(());
            }
            Ok(MsgBox(Msg::Shutdown(ack))) => {
                export(&mut batch, &exporter);
                let _ = exporter.shutdown_with_timeout(timeout);
                let _ = ack.send(());
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                export(&mut batch, &exporter);
                due = None;
            }
            Err(RecvTimeoutError::Disconnected) => {
                export(&mut batch, &exporter);
                return;
            }
        }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        match self.tx.try_send(MsgBox(Msg::Span(Box::new(span)))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.inc();
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.control(Msg::Flush, Duration::from_secs(30))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let r = self.control(Msg::Shutdown, timeout);
        if r.is_ok() {
            if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
                let _ = t.join();
            }
        }
        r
    }

    fn set_resource(&mut self, resource: &Resource) {
        let _ = self.tx.send_timeout(
            MsgBox(Msg::Resource(resource.clone())),
            Duration::from_secs(1),
        );
    }
}
