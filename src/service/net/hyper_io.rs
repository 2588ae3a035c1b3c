//! Adapter from glommio's futures-io streams to hyper's I/O traits, and the place
//! where an HTTP connection's deadlines ([`crate::service::net::http_clock`]) and slot
//! ([`crate::service::net::conn_slot`]) are enforced.
//!
//! hyper 1 defines its own `Read`/`Write`; glommio streams implement the futures-io
//! ones. Reads go through a per-thread scratch buffer (`ReadBufCursor::put_slice`,
//! [`read_via_scratch`]), which keeps the adapter free of `unsafe`; HTTP is the control/debug path, the binary protocols
//! carry the volume.
//!
//! Every read and write passes here, so this is where the connection's clock is kept:
//! a read or write that waits past its deadline gets a glommio timer that wakes the
//! task, and then fails with `TimedOut`; a connection displaced from its slot fails its
//! next read with `ConnectionAborted` (a read waiting for a request body too: the
//! handler then sees its body end in an error and answers it). hyper then closes the
//! connection through its own error path: nothing is dropped from outside with a
//! handler half done.

use crate::service::net::conn_slot::Slot;
use crate::service::net::http_clock::{Clock, Phase, Timeouts};
use crate::service::net::slots::Activity;
use futures_lite::{AsyncRead, AsyncWrite};
use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// What a connection needs of the service it belongs to: its clock, its deadlines,
/// and where protocol errors are counted (the runtime's shared state provides them).
pub trait ConnHost: Send + Sync {
    /// Milliseconds since the service started.
    fn now_ms(&self) -> u64;
    /// The header, idle and body deadlines.
    fn timeouts(&self) -> Timeouts;
    /// Counts a protocol error of kind `what`.
    fn protocol_error(&self, what: &'static str);
}

/// The state an HTTP connection shares between its I/O adapter and its service.
pub struct HttpConn {
    clock: Cell<Clock>,
    opened_ms: u64,
    timeouts: Timeouts,
    pub slot: Rc<Slot>,
    host: Arc<dyn ConnHost>,
    /// How long after its last response a keep-alive connection still counts as in
    /// use (not displaceable); 0 = displaceable as soon as it is idle.
    min_idle_ms: Cell<u64>,
}

impl HttpConn {
    pub fn new(host: Arc<dyn ConnHost>, slot: Rc<Slot>) -> Rc<HttpConn> {
        let timeouts = host.timeouts();
        let now = host.now_ms();
        Rc::new(HttpConn {
            clock: Cell::new(Clock::new(now)),
            opened_ms: now,
            timeouts,
            slot,
            host,
            min_idle_ms: Cell::new(0),
        })
    }

    /// Keeps the connection from being displaced until it has been idle `ms` (a
    /// keep-alive client between two requests is still using it).
    pub fn set_min_idle_ms(&self, ms: u64) {
        self.min_idle_ms.set(ms);
    }

    fn now_ms(&self) -> u64 {
        self.host.now_ms()
    }

    fn update(&self, f: impl FnOnce(&mut Clock, u64)) {
        let mut c = self.clock.get();
        f(&mut c, self.now_ms());
        self.clock.set(c);
        self.slot.set(if c.before_first_request() {
            Activity::PreAuth {
                since_ms: self.opened_ms,
            }
        } else {
            match (c.idle_since(), c.waiting_for_body(&self.timeouts)) {
                (Some(since_ms), _) => Activity::Idle {
                    since_ms,
                    min_idle_ms: self.min_idle_ms.get(),
                },
                (None, Some(due_ms)) => Activity::Body { due_ms },
                (None, None) => Activity::Busy,
            }
        });
    }

    /// hyper handed a request to the service.
    pub fn request_started(&self) {
        self.update(|c, now| c.on_request(now));
    }

    /// The handler produced its response (its request body, if any, was read).
    pub fn responding(&self) {
        self.update(|c, _| c.on_responding());
    }

    /// The response body was taken in full (or dropped).
    pub fn response_done(&self) {
        self.update(|c, now| c.on_response_done(now));
    }

    fn timed_out(&self, what: &'static str) -> io::Error {
        self.host.protocol_error(what);
        io::Error::new(io::ErrorKind::TimedOut, what)
    }
}

/// Largest read through [`read_via_scratch`].
pub const SCRATCH_BYTES: usize = 16 << 10;

thread_local! {
    /// One read buffer per core thread, zeroed once: a stack array would be zeroed on
    /// every read (16 KiB for an upstream chunk of ~200 bytes; ~20 % of a proxied
    /// request's instructions went to that memset).
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; SCRATCH_BYTES].into_boxed_slice());
}

/// Reads at most `max` (≤ [`SCRATCH_BYTES`]) bytes of `io` into hyper's cursor through
/// this thread's scratch buffer; `Ready(Ok(n))`: `n` bytes were put into `buf`.
pub fn read_via_scratch<T: AsyncRead + Unpin>(
    io: &mut T,
    cx: &mut Context<'_>,
    buf: &mut hyper::rt::ReadBufCursor<'_>,
    max: usize,
) -> Poll<io::Result<usize>> {
    let want = buf.remaining().min(max).min(SCRATCH_BYTES);
    let mut read = |tmp: &mut [u8], buf: &mut hyper::rt::ReadBufCursor<'_>| match Pin::new(&mut *io)
        .poll_read(cx, &mut tmp[..want])
    {
        Poll::Ready(Ok(n)) => {
            buf.put_slice(&tmp[..n]);
            Poll::Ready(Ok(n))
        }
        other => other,
    };
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut tmp) => read(&mut tmp, buf),
        // Not reached (a read does not start another); stay correct if it is.
        Err(_) => read(&mut vec![0u8; want], buf),
    })
}

/// A hyper connection's I/O: the stream plus its deadlines.
pub struct HyperIo<T> {
    io: T,
    conn: Rc<HttpConn>,
    read_timer: Armed,
    write_timer: Armed,
}

impl<T> HyperIo<T> {
    pub fn new(io: T, conn: Rc<HttpConn>) -> HyperIo<T> {
        HyperIo {
            io,
            conn,
            read_timer: None,
            write_timer: None,
        }
    }
}

/// A deadline's timer: the glommio timer and the deadline (ms) it was set for.
type Armed = Option<(glommio::timer::Timer, u64)>;

/// Arms `timer` for `deadline_ms` (registering the task's waker); true if it has
/// already passed. A timer already set for a deadline no later than this one and
/// still ahead is kept as it is: a keep-alive connection's deadline moves on with
/// every request, and resetting the timer each time costs a clock read and two
/// updates of the executor's timer map. When such a timer fires before the deadline
/// the task is polled, finds the deadline still ahead, and arms again from there.
fn arm(timer: &mut Armed, cx: &mut Context<'_>, now_ms: u64, deadline_ms: u64) -> bool {
    if now_ms >= deadline_ms {
        return true;
    }
    if let Some((t, at)) = timer.as_mut() {
        if *at > now_ms && *at <= deadline_ms && Pin::new(t).poll(cx).is_pending() {
            return false;
        }
    }
    let dur = Duration::from_millis(deadline_ms - now_ms);
    let (t, at) = timer.get_or_insert_with(|| (glommio::timer::Timer::new(dur), deadline_ms));
    t.reset(dur);
    *at = deadline_ms;
    Pin::new(t).poll(cx).is_ready()
}

impl<T: AsyncRead + Unpin> hyper::rt::Read for HyperIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let conn = this.conn.clone();
        if conn.slot.is_closing() {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        let clock = conn.clock.get();
        let (deadline, why) = clock.read_expiry(&conn.timeouts);
        let label = why.label();
        if conn.now_ms() >= deadline {
            return Poll::Ready(Err(conn.timed_out(label)));
        }
        match read_via_scratch(&mut this.io, cx, &mut buf, 8192) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    conn.update(|c, now| c.on_read(now, n));
                } else if clock.read_waiting {
                    conn.update(|c, _| c.read_waiting = false);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                // Waiting for more of a request body: the slot becomes displaceable
                // (`slots`). Only then; other waits keep their activity. This holds
                // because both servers run hyper with `half_close(true)`: it reads
                // nothing mid-request but the body. A server watching for the client's
                // EOF mid-request must tell the clock when the body ended, or such
                // reads are taken for a trickled body (tests/slow_bodies.rs,
                // `waiting_for_the_worker_is_not_reading_a_body`).
                if matches!(clock.phase, Phase::Busy { .. }) && !clock.read_waiting {
                    conn.update(|c, _| c.on_read_waiting());
                }
                conn.slot.register(cx.waker());
                if arm(&mut this.read_timer, cx, conn.now_ms(), deadline) {
                    return Poll::Ready(Err(conn.timed_out(label)));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> hyper::rt::Write for HyperIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let conn = this.conn.clone();
        if let Some(d) = conn.clock.get().write_deadline(&conn.timeouts) {
            if conn.now_ms() >= d {
                return Poll::Ready(Err(conn.timed_out("http_write_timeout")));
            }
        }
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    conn.update(|c, now| c.on_write(now));
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                conn.update(|c, now| c.on_write_blocked(now));
                let d = conn
                    .clock
                    .get()
                    .write_deadline(&conn.timeouts)
                    .unwrap_or(u64::MAX);
                if arm(&mut this.write_timer, cx, conn.now_ms(), d) {
                    return Poll::Ready(Err(conn.timed_out("http_write_timeout")));
                }
                Poll::Pending
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_close(cx)
    }
}

/// A response body that tells the connection's clock when hyper has taken all of it
/// (or dropped it), which ends the request's busy phase.
pub struct TrackedBody<B> {
    inner: B,
    conn: Option<Rc<HttpConn>>,
}

impl<B> TrackedBody<B> {
    /// The handler's response, `inner`: from here on the request body is no longer
    /// being read ([`HttpConn::responding`]).
    pub fn new(inner: B, conn: Rc<HttpConn>) -> TrackedBody<B> {
        conn.responding();
        TrackedBody {
            inner,
            conn: Some(conn),
        }
    }

    fn done(&mut self) {
        if let Some(c) = self.conn.take() {
            c.response_done();
        }
    }
}

impl<B> Drop for TrackedBody<B> {
    fn drop(&mut self) {
        self.done();
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.done();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
