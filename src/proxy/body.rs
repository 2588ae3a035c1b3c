//! The proxy's response bodies: a small buffered one (errors, `/v1/models`) or the
//! upstream's body streamed through frame by frame, never buffered whole.
//!
//! The streamed body owns the request's upstream connection and lifecycle:
//! - each data frame is fed to the [`Tracker`]: the first output runs `first_token`,
//!   each count change `progress`, with TTFT / inter-token metrics;
//! - the upstream's end runs `finish` and returns the connection to the pool;
//! - an upstream error or a gap longer than `request_timeout_ms` ends an SSE stream
//!   with an error event in the API's shape (`agents::AnswerTracker`) (a JSON answer is cut: the client sees a broken
//!   response rather than a wrong one), runs `finish` and drops the connection;
//! - dropped before the end (the client went away and a write to it failed), or the
//!   client seen gone while the upstream is quiet (`watch`): `finish` runs and the
//!   dropped connection aborts the upstream request.
//!
//! Lifecycle calls go through `service::routing::router::lifecycle` like the HTTP and binary
//! APIs, in order: each is polled once where it is made, and a call for a request
//! living on this core completes in that poll; one that must ask another core goes
//! on as a local task, its messages already sent in order.
//!
//! The idle timeout is one timer per request, not one per chunk: frames only record
//! their time, and a timer that fires early (frames came meanwhile) is re-armed for
//! what is left of `idle` after the last frame.

use super::agents::AnswerTracker;
use super::front::Front;
use super::pool::{self, Conn};
use super::state::{Admitted, RequestLabels};
use super::track::Seen;
use super::watch::Gone;
use crate::engine::request::LifeOp;
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum ProxyBody {
    Full(Option<Bytes>),
    Stream(Box<Streamed>),
}

impl ProxyBody {
    pub fn full(b: Bytes) -> ProxyBody {
        ProxyBody::Full(Some(b))
    }
}

/// Runs lifecycle call `op` for request `id`: polled once right here, where a call
/// for a request living on this core (the proxy's own: it was routed here) completes;
/// only one still waiting for another core is left to a local task (see the module
/// doc for ordering). Running it in place saves a task per streamed chunk.
pub fn life(core: &Front, op: LifeOp, id: &str) {
    let (core, id) = (core.clone(), id.to_string());
    let mut call = Box::pin(async move {
        let _ = core.handle.lifecycle(op, &id).await;
    });
    // A waker is registered again by the task's own poll if this one is pending.
    let mut cx = Context::from_waker(std::task::Waker::noop());
    if call.as_mut().poll(&mut cx).is_pending() {
        glommio::spawn_local(call).detach();
    }
}

pub struct Streamed {
    pub core: Front,
    pub upstream: Incoming,
    pub conn: Option<Conn>,
    /// kvroute's id of the routed request.
    pub id: String,
    pub tracker: AnswerTracker,
    pub sse: bool,
    pub started: Instant,
    pub last_output: Option<Instant>,
    pub idle: Duration,
    /// When the last frame came (the idle timeout counts from it).
    pub last_frame: Instant,
    pub timer: Option<glommio::timer::Timer>,
    pub labels: RequestLabels,
    pub tail: Option<Bytes>,
    pub done: bool,
    pub pool_max_idle: usize,
    pub admitted: Option<Admitted>,
    /// Resolves when the client goes away (`watch`).
    pub gone: Option<Gone>,
    /// The request's spans (`spans`), ended with the body.
    pub trace: super::spans::ReqTrace,
}

impl Streamed {
    fn on_seen(&mut self, seen: Seen) {
        let m = &self.core.state.metrics;
        let now = Instant::now();
        if seen.first_output {
            m.ttft.observe(self.started.elapsed().as_secs_f64());
            self.trace.first_token();
            life(&self.core, LifeOp::FirstToken, &self.id);
        }
        if seen.progressed {
            if let Some(prev) = self.last_output.filter(|_| !seen.first_output) {
                m.itl.observe((now - prev).as_secs_f64());
            }
            self.last_output = Some(now);
            life(
                &self.core,
                LifeOp::Progress(self.tracker.tokens()),
                &self.id,
            );
        }
    }

    /// Ends the request once: `finish`, metrics, and the connection back to the pool
    /// (only after a clean end).
    fn complete(&mut self, outcome: &'static str) {
        if self.done {
            return;
        }
        self.done = true;
        let m = &self.core.state.metrics;
        m.e2e.observe(self.started.elapsed().as_secs_f64());
        let mut labels = self.labels.clone();
        labels.outcome = outcome;
        m.requests.get_or_create(&labels).inc();
        life(&self.core, LifeOp::Finish, &self.id);
        self.trace.finish(self.tracker.tokens(), outcome);
        if let (Some(id), "ok") = (self.tracker.response_id(), outcome) {
            let now = self.core.handle.now_ms();
            (self.core.state.responses).remember(id, &self.labels.worker, now);
        }
        match (outcome, self.conn.take()) {
            ("ok", Some(c)) => pool::put(c, self.pool_max_idle),
            // Dropping the connection cancels its task and closes the socket.
            (_, c) => drop(c),
        }
        self.timer = None;
        self.admitted = None;
        self.gone = None;
    }

    fn fail(
        &mut self,
        kind: &'static str,
        msg: &str,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let m = &self.core.state.metrics;
        m.upstream_errors
            .get_or_create(&super::state::KindLabel { kind })
            .inc();
        self.complete("upstream_error");
        if self.sse {
            Poll::Ready(Some(Ok(Frame::data(self.tracker.error_event(kind, msg)))))
        } else {
            Poll::Ready(Some(Err(msg.to_string().into())))
        }
    }
}

impl Drop for Streamed {
    fn drop(&mut self) {
        self.complete("client_disconnect");
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let s = match &mut *self {
            ProxyBody::Full(b) => return Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Stream(s) => s,
        };
        if let Some(t) = s.tail.take() {
            return Poll::Ready(Some(Ok(Frame::data(t))));
        }
        if s.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut s.upstream).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                s.last_frame = Instant::now();
                if let Some(d) = frame.data_ref() {
                    let seen = s.tracker.feed(d);
                    s.on_seen(seen);
                }
                // A body of known length may be dropped by hyper right after its last
                // byte, without another poll: end the request here.
                if s.upstream.is_end_stream() {
                    let seen = s.tracker.finish();
                    s.on_seen(seen);
                    s.complete("ok");
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let msg = format!("upstream stream failed: {e}");
                s.fail("mid_stream", &msg)
            }
            Poll::Ready(None) => {
                let seen = s.tracker.finish();
                s.on_seen(seen);
                s.complete("ok");
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(g) = &mut s.gone {
                    if Pin::new(g).poll(cx).is_ready() {
                        s.complete("client_disconnect");
                        return Poll::Ready(Some(Err("the client went away".into())));
                    }
                }
                let idle = s.idle;
                loop {
                    let left = idle.saturating_sub(s.last_frame.elapsed());
                    if left.is_zero() {
                        let msg = format!("upstream sent nothing for {} ms", idle.as_millis());
                        return s.fail("timeout", &msg);
                    }
                    let t = s
                        .timer
                        .get_or_insert_with(|| glommio::timer::Timer::new(left));
                    if Pin::new(t).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // Fired: frames may have come since it was armed; look again.
                    s.timer = None;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Stream(s) => s.done && s.tail.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Stream(s) => s.upstream.size_hint(),
        }
    }
}
