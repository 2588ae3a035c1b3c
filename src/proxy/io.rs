//! hyper's I/O traits over a glommio `TcpStream`, client side: the proxy's upstream
//! connections. Unlike `service::net::hyper_io` (the server side, which owns the listener's
//! deadlines and slots) this adds no clock: the proxy bounds upstream waits itself
//! (connect timeout, response-head and inter-chunk timeouts in `forward` / `body`).
//! Reads go through the core's scratch buffer (`service::net::hyper_io::read_via_scratch`)
//! so the adapter needs no `unsafe` and zeroes no buffer per read.

use futures_lite::{AsyncRead, AsyncWrite};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

pub struct ClientIo<T>(pub T);

impl<T: AsyncRead + Unpin> hyper::rt::Read for ClientIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let max = crate::service::net::hyper_io::SCRATCH_BYTES;
        crate::service::net::hyper_io::read_via_scratch(&mut self.0, cx, &mut buf, max)
            .map_ok(|_| ())
    }
}

impl<T: AsyncWrite + Unpin> hyper::rt::Write for ClientIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_close(cx)
    }
}
