//! A client connection the proxy listener has no slot for (`max_connections` on this
//! core, every slot busy or in use: `service::net::slots`) gets a 429 with `retry-after`
//! and `connection: close` instead of a dropped socket, which a client can only report
//! as a connection error.
//!
//! Guarantees: bounded work per refused connection (its request head is read up to
//! [`MAX_READ`] bytes, each read and write waits at most [`WAIT`], the socket is then
//! half-closed and drained so the close does not reset the answer away), and bounded
//! concurrency: at most 4 × `max_connections` refusals in progress per core (the
//! accept loop's cap; so a listener holds at most 6 × `max_connections` sockets per
//! core); beyond them the socket is dropped as before
//! (`kvroute_protocol_errors_total{kind="connection_limit_dropped"}`).

use super::errors::refused_connection_response;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use std::cell::Cell;
use std::net::Shutdown;
use std::time::Duration;

/// Bytes read from a refused connection (head, then drain), at most.
pub const MAX_READ: usize = 64 << 10;
/// Longest wait for one read or write of a refused connection.
pub const WAIT: Duration = Duration::from_millis(1000);
/// Longest wait for the client's close after the answer (the drain): short, so a
/// refusal storm does not hold its sockets.
pub const DRAIN: Duration = Duration::from_millis(100);

thread_local! {
    static REFUSING: Cell<usize> = const { Cell::new(0) };
}

struct InProgress;

impl Drop for InProgress {
    fn drop(&mut self) {
        REFUSING.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Answers `stream` with a 429 in the background; true if it will be answered (false:
/// `max` refusals in progress, the socket was dropped).
pub fn answer(stream: TcpStream, max: usize) -> bool {
    let busy = REFUSING.with(|c| {
        if c.get() >= max {
            return true;
        }
        c.set(c.get() + 1);
        false
    });
    if busy {
        return false;
    }
    let guard = InProgress;
    glommio::spawn_local(async move {
        let _guard = guard;
        let _ = respond(stream).await;
    })
    .detach();
    true
}

async fn respond(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(WAIT))?;
    stream.set_write_timeout(Some(WAIT))?;
    let mut buf = vec![0u8; 4 << 10];
    let mut head: Vec<u8> = Vec::new();
    let mut read = 0usize;
    // The request head (so the answer follows the client's request, not races it).
    while read < MAX_READ {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        read += n;
        let keep = head.len().saturating_sub(3);
        head.drain(..keep);
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    stream.write_all(&refused_connection_response(1)).await?;
    stream.flush().await?;
    stream.shutdown(Shutdown::Write).await?;
    stream.set_read_timeout(Some(DRAIN))?;
    // Drain what the client still sends until it closes, so our close is no reset.
    while read < MAX_READ {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        read += n;
    }
    Ok(())
}
