//! A blocking ZMTP 3.x connection over `std::net::TcpStream`: the NULL handshake, then
//! multipart messages in and out through [`codec::Decoder`](super::codec::Decoder).
//!
//! Guarantees: every call is bounded in time (connect, handshake and each read carry a
//! timeout; [`Conn::recv`] returns `Ok(None)` when its wait ends without a message, so
//! the caller can check for shutdown); memory per connection is one 64 KiB read buffer
//! plus the message being assembled, which the decoder bounds *before* allocating; PINGs
//! are answered; other commands are ignored; client connections use TCP keepalive so a
//! vanished peer is noticed (about 25 s) even when it never sends again.

use super::codec::{self, Command, Decoder, Item, Limits, ZmtpError, GREETING_LEN};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const READ_CHUNK: usize = 64 * 1024;

/// Why a connection failed.
#[derive(Debug)]
pub enum ConnError {
    Io(io::Error),
    Zmtp(ZmtpError),
    /// The handshake or a wait did not complete in time.
    Timeout,
    /// The peer closed the connection.
    Closed,
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Io(e) => write!(f, "{e}"),
            ConnError::Zmtp(e) => write!(f, "{e}"),
            ConnError::Timeout => write!(f, "timed out"),
            ConnError::Closed => write!(f, "connection closed by the peer"),
        }
    }
}

impl std::error::Error for ConnError {}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ConnError::Timeout,
            _ => ConnError::Io(e),
        }
    }
}

impl From<ZmtpError> for ConnError {
    fn from(e: ZmtpError) -> Self {
        ConnError::Zmtp(e)
    }
}

/// `tcp://host:port` → socket addresses.
pub fn resolve(endpoint: &str) -> Result<Vec<SocketAddr>, ConnError> {
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(|| {
        ConnError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "endpoint must be tcp://host:port",
        ))
    })?;
    Ok(rest.to_socket_addrs()?.collect())
}

/// TCP keepalive (idle 10 s, then 3 probes 5 s apart) on a client connection: a PUB
/// that is silent because its host vanished (no FIN, no RST) is then noticed within
/// about 25 s and the subscriber reconnects, instead of waiting forever. Best effort.
#[cfg(target_os = "linux")]
fn keepalive(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, v: libc::c_int| {
        // SAFETY: `fd` is a live socket owned by `s` for the duration of the call, and
        // the option value is a valid c_int of the size passed.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
}

#[cfg(not(target_os = "linux"))]
fn keepalive(_: &TcpStream) {}

/// One established ZMTP connection.
pub struct Conn {
    stream: TcpStream,
    decoder: Decoder,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// The peer's READY properties.
    pub peer: Command,
}

impl Conn {
    /// Connects to `endpoint` and completes the handshake as `socket_type`, within
    /// `timeout` for the TCP connect and again for the handshake.
    pub fn connect(
        endpoint: &str,
        socket_type: &str,
        identity: Option<&[u8]>,
        limits: Limits,
        timeout: Duration,
    ) -> Result<Conn, ConnError> {
        let mut last = ConnError::Timeout;
        for addr in resolve(endpoint)? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    keepalive(&s);
                    return Conn::handshake(s, socket_type, identity, false, limits, timeout);
                }
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }

    /// Completes the handshake on an accepted or connected stream.
    pub fn handshake(
        mut stream: TcpStream,
        socket_type: &str,
        identity: Option<&[u8]>,
        as_server: bool,
        limits: Limits,
        timeout: Duration,
    ) -> Result<Conn, ConnError> {
        let _ = stream.set_nodelay(true);
        stream.set_write_timeout(Some(timeout))?;
        stream.set_read_timeout(Some(timeout))?;
        let deadline = Instant::now() + timeout;
        stream.write_all(&codec::greeting(as_server))?;
        let mut g = [0u8; GREETING_LEN];
        let mut have = 0;
        while have < GREETING_LEN {
            if Instant::now() >= deadline {
                return Err(ConnError::Timeout);
            }
            match stream.read(&mut g[have..]) {
                Ok(0) => return Err(ConnError::Closed),
                Ok(n) => have += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
            // A peer that is not ZMTP 3 at all is refused as soon as its signature shows.
            if have >= 11 {
                if g[0] != 0xFF || g[9] & 1 != 1 || g[10] < 3 {
                    return Err(ZmtpError::BadGreeting("not a ZMTP 3.x peer").into());
                }
            } else if have >= 1 && g[0] != 0xFF {
                return Err(ZmtpError::BadGreeting("bad signature").into());
            }
        }
        codec::parse_greeting(&g)?;
        stream.write_all(&codec::ready(socket_type, identity))?;
        let mut conn = Conn {
            stream,
            decoder: Decoder::new(limits),
            buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
            pos: 0,
            end: 0,
            peer: Command::Pong,
        };
        match conn.next_item(deadline)? {
            Some(Item::Command(c @ Command::Ready(_))) => {
                let t = c.property("Socket-Type").unwrap_or(b"");
                if !codec::compatible(socket_type, t) {
                    return Err(
                        ZmtpError::SocketType(String::from_utf8_lossy(t).into_owned()).into(),
                    );
                }
                conn.peer = c;
                Ok(conn)
            }
            Some(Item::Command(Command::Error(r))) => Err(ZmtpError::PeerError(r).into()),
            Some(_) => Err(ZmtpError::Protocol("expected READY").into()),
            None => Err(ConnError::Timeout),
        }
    }

    /// Sends one multipart message.
    pub fn send<F: AsRef<[u8]>>(&mut self, frames: &[F]) -> Result<(), ConnError> {
        let mut out = Vec::new();
        codec::encode_message(&mut out, frames);
        self.send_raw(&out)
    }

    /// Sends pre-encoded frames (e.g. [`codec::subscribe`]).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ConnError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Sets how long one `read` may block (the granularity of [`Conn::recv`]).
    pub fn set_poll(&mut self, poll: Duration) -> Result<(), ConnError> {
        self.stream.set_read_timeout(Some(poll))?;
        Ok(())
    }

    /// The next message, waiting until `deadline` at most; `Ok(None)` when the wait
    /// ended without one. Commands are handled here (PING answered, others ignored).
    pub fn recv(&mut self, deadline: Instant) -> Result<Option<Vec<Vec<u8>>>, ConnError> {
        loop {
            match self.next_item(deadline)? {
                None => return Ok(None),
                Some(Item::Message(m)) => return Ok(Some(m)),
                Some(Item::Command(Command::Ping(ctx))) => {
                    self.send_raw(&codec::pong(&ctx))?;
                }
                Some(Item::Command(Command::Error(r))) => {
                    return Err(ZmtpError::PeerError(r).into())
                }
                Some(Item::Command(_)) => {}
            }
        }
    }

    /// Hands back a message's frames for their buffers to be reused
    /// ([`codec::Decoder::recycle`]).
    pub fn recycle(&mut self, frames: Vec<Vec<u8>>) {
        self.decoder.recycle(frames);
    }

    /// Frees the buffers kept for reuse.
    pub fn drop_spares(&mut self) {
        self.decoder.drop_spares();
    }

    /// Raw access to the next item (messages and commands), for the publisher side.
    pub fn recv_item(&mut self, deadline: Instant) -> Result<Option<Item>, ConnError> {
        self.next_item(deadline)
    }

    fn next_item(&mut self, deadline: Instant) -> Result<Option<Item>, ConnError> {
        loop {
            if self.pos < self.end {
                let (n, item) = self.decoder.decode(&self.buf[self.pos..self.end])?;
                self.pos += n;
                if item.is_some() {
                    return Ok(item);
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            match self.stream.read(&mut self.buf) {
                Ok(0) => return Err(ConnError::Closed),
                Ok(n) => {
                    self.pos = 0;
                    self.end = n;
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {}
                    io::ErrorKind::Interrupted => {}
                    _ => return Err(ConnError::Io(e)),
                },
            }
        }
    }

    /// The underlying stream (e.g. to shut it down).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}
