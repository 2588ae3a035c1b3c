//! Noticing at once that a proxy client went away while its request waits on the
//! worker: for the response head, for the prefill leg, between retries, or between two
//! chunks of a streamed answer.
//!
//! hyper does not read a connection while its handler runs (`half_close`), so a client
//! that closes is otherwise seen only at the next write to it, which for a
//! non-streamed answer comes after the whole generation. For each request that waits
//! longer than [`ARM_AFTER`], a [`ClientWatch`] makes a duplicate of the client
//! socket's descriptor and waits on it with a peek (one io_uring `recv(MSG_PEEK)` per
//! request, which completes only when the client sends or closes: nothing is consumed,
//! nothing polled on a timer). A request answered sooner costs no system call at all
//! (the duplicate, the peek, its cancellation and the close were ~4 % of the router's
//! CPU at 64 connections); a client gone earlier is noticed at [`ARM_AFTER`].
//! End of stream or a
//! reset means the client is gone, as uvicorn (vLLM's server) takes it; the caller
//! then drops the upstream request, which closes the connection to the worker so the
//! engine aborts the generation too. If the client has already sent more bytes (a
//! pipelined request), the peek cannot wait for the close behind them: a hang-up is
//! then looked for every [`PIPELINED_CHECK`].
//!
//! Guarantees: the watch never reads or writes the client's bytes; a client gone is
//! noticed at most [`ARM_AFTER`] after the request began waiting, or at once after
//! that; the duplicate exists only while a request waits past [`ARM_AFTER`] (one
//! descriptor more per such request in flight, as many as its upstream connections,
//! none for an idle keep-alive connection) and is closed when the request ends; a
//! failed duplicate (no descriptor left) means no watch: the request runs as before,
//! never refused.

use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

/// How often a client with unread bytes waiting is checked for a hang-up.
pub const PIPELINED_CHECK: Duration = Duration::from_millis(100);

/// How long a request waits before its client is watched (a timer of the core's
/// executor until then: no system call). Generation aborted this much later at
/// worst, against a peek, a cancellation and two descriptor calls on every request.
pub const ARM_AFTER: Duration = Duration::from_millis(20);

/// Resolves once the client has gone away (and at every poll after that).
pub struct Gone(Option<Pin<Box<dyn Future<Output = ()>>>>);

impl Future for Gone {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(f) = &mut self.0 else {
            return Poll::Ready(());
        };
        if f.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.0 = None;
        Poll::Ready(())
    }
}

/// The watch of one client connection.
pub struct ClientWatch {
    fd: RawFd,
}

impl ClientWatch {
    /// A watch of the connection on `fd` (borrowed: it must outlive every [`Gone`] of
    /// this watch being polled, as the hyper connection owning both guarantees).
    pub fn new(fd: RawFd) -> Rc<ClientWatch> {
        Rc::new(ClientWatch { fd })
    }

    /// A duplicate of the client's socket, owned by the caller.
    fn duplicate(&self) -> Option<glommio::net::TcpStream> {
        // SAFETY: fcntl on the descriptor we were given (alive: see `new`); -1 on failure.
        let fd = unsafe { libc::fcntl(self.fd, libc::F_DUPFD_CLOEXEC, 0) };
        // SAFETY: `fd` is a fresh duplicate of a TCP socket, owned from here on.
        (fd >= 0).then(|| unsafe { glommio::net::TcpStream::from_raw_fd(fd) })
    }

    /// A future that resolves when the client has closed its connection (or reset
    /// it); pending forever when there is nothing to watch. It looks at the client
    /// only from [`ARM_AFTER`] after its first poll on.
    pub fn gone(self: &Rc<Self>) -> Gone {
        let watch = self.clone();
        Gone(Some(Box::pin(async move {
            glommio::timer::sleep(ARM_AFTER).await;
            let Some(s) = watch.duplicate() else {
                return std::future::pending().await;
            };
            let mut b = [0u8; 1];
            match s.peek(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            loop {
                glommio::timer::sleep(PIPELINED_CHECK).await;
                if hung_up(s.as_raw_fd()) {
                    return;
                }
            }
        })))
    }
}

/// Whether the peer of socket `fd` closed or reset it (bytes may still be unread).
fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Runs `f` unless the client goes away first (`None`; `f` is dropped then, which
/// aborts whatever it was waiting on).
pub async fn unless_gone<T>(gone: &mut Gone, f: impl Future<Output = T>) -> Option<T> {
    use futures_lite::FutureExt;
    async { Some(f.await) }
        .or(async {
            gone.await;
            None
        })
        .await
}
