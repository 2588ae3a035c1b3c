//! The three listening sockets, bound once by the starting thread and shared by the
//! cores.
//!
//! glommio's `TcpListener::bind` sets `SO_REUSEPORT` so that every executor can bind
//! the same address; the kernel then also lets any other process of the same user bind
//! it, and splits connections between the two routers (split brain). Here each
//! address is bound exactly once, without `SO_REUSEPORT`, and every core gets a
//! duplicate of that one descriptor. Guarantees:
//! - a port held by another process (a second `kvroute serve`, or anything else) stops
//!   the start with an error naming the setting and the address; nothing can join a
//!   port while we hold it;
//! - port 0 resolves to one OS-chosen port shared by every core (reported back through
//!   [`Bound::addrs`]);
//! - the shared socket is non-blocking before any core sees it: glommio's accept fast
//!   path toggles `O_NONBLOCK` around a non-blocking `accept`, and with a descriptor
//!   shared across threads a blocking restore by one core could otherwise leave
//!   another core's `accept` blocking its executor.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::io::{FromRawFd, IntoRawFd};

/// Backlog of each listening socket (glommio's own value).
const BACKLOG: i32 = 1024;

/// The bound sockets of one process, in the order events, api, http.
pub struct Bound {
    listeners: [TcpListener; 3],
}

impl Bound {
    /// Binds `events_addr`, `api_addr` and `http_addr` (without `SO_REUSEPORT`).
    pub fn bind(events: &str, api: &str, http: &str) -> Result<Bound, String> {
        Ok(Bound {
            listeners: [
                bind_one("events_addr", events)?,
                bind_one("api_addr", api)?,
                bind_one("http_addr", http)?,
            ],
        })
    }

    /// The addresses actually bound (port 0 resolved), events, api, http.
    pub fn addrs(&self) -> Result<[SocketAddr; 3], String> {
        let a = |l: &TcpListener| l.local_addr().map_err(|e| format!("local_addr: {e}"));
        Ok([
            a(&self.listeners[0])?,
            a(&self.listeners[1])?,
            a(&self.listeners[2])?,
        ])
    }

    /// One duplicate of each socket for one core (dup'd descriptors share the listen
    /// queue; the kernel hands each connection to one of the cores accepting on it).
    pub fn for_core(&self) -> Result<CoreListeners, String> {
        let dup = |l: &TcpListener| l.try_clone().map_err(|e| format!("dup listener: {e}"));
        Ok(CoreListeners {
            listeners: [
                dup(&self.listeners[0])?,
                dup(&self.listeners[1])?,
                dup(&self.listeners[2])?,
            ],
        })
    }
}

impl Bound {
    /// Stops listening on every address, for every core at once (the cores' duplicates
    /// share these sockets): new connections are refused from here on, and the ports
    /// are free for a restarted router even before this process is gone. Closing the
    /// descriptors would not do that: a core's pending io_uring `accept` holds its own
    /// reference to the socket, and the kernel drops that reference only when the ring
    /// is torn down, asynchronously after the process exits; until then the old socket
    /// kept listening and a restart failed with "address in use" (seen under load).
    pub fn stop_listening(&self) {
        for l in &self.listeners {
            let _ = socket2::SockRef::from(l).shutdown(std::net::Shutdown::Both);
        }
    }
}

/// One core's duplicates, `Send` until they are turned into glommio listeners on that
/// core's executor.
pub struct CoreListeners {
    listeners: [TcpListener; 3],
}

impl CoreListeners {
    /// glommio listeners (events, api, http); must run on the core's executor.
    pub fn into_glommio(
        self,
    ) -> (
        glommio::net::TcpListener,
        glommio::net::TcpListener,
        glommio::net::TcpListener,
    ) {
        let [e, a, h] = self.listeners;
        // SAFETY: each descriptor comes from `into_raw_fd` of a listening socket we own,
        // so ownership moves to the glommio listener exactly once.
        unsafe {
            (
                glommio::net::TcpListener::from_raw_fd(e.into_raw_fd()),
                glommio::net::TcpListener::from_raw_fd(a.into_raw_fd()),
                glommio::net::TcpListener::from_raw_fd(h.into_raw_fd()),
            )
        }
    }
}

/// One more listening socket bound the same way (the proxy's, `proxy_addr`), shared
/// by the cores.
pub struct Extra(TcpListener);

impl Extra {
    pub fn bind(name: &str, addr: &str) -> Result<Extra, String> {
        bind_one(name, addr).map(Extra)
    }

    pub fn addr(&self) -> Result<SocketAddr, String> {
        self.0.local_addr().map_err(|e| format!("local_addr: {e}"))
    }

    /// See [`Bound::stop_listening`].
    pub fn stop_listening(&self) {
        let _ = socket2::SockRef::from(&self.0).shutdown(std::net::Shutdown::Both);
    }

    /// A duplicate for one core (see [`Bound::for_core`]).
    pub fn for_core(&self) -> Result<ExtraCore, String> {
        self.0
            .try_clone()
            .map(ExtraCore)
            .map_err(|e| format!("dup listener: {e}"))
    }
}

/// One core's duplicate of an [`Extra`] listener.
pub struct ExtraCore(TcpListener);

impl ExtraCore {
    /// The glommio listener; must run on the core's executor.
    pub fn into_glommio(self) -> glommio::net::TcpListener {
        // SAFETY: as in `CoreListeners::into_glommio`: a listening socket we own, moved
        // to glommio exactly once.
        unsafe { glommio::net::TcpListener::from_raw_fd(self.0.into_raw_fd()) }
    }
}

fn bind_one(name: &str, addr: &str) -> Result<TcpListener, String> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sa: SocketAddr = addr.parse().map_err(|e| format!("{name} {addr:?}: {e}"))?;
    let fail = |e: std::io::Error| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            " (another process, perhaps another kvroute, holds this port)"
        } else {
            ""
        };
        format!("cannot listen on {addr} ({name}): {e}{hint}")
    };
    let sk =
        Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    // SO_REUSEADDR only lets a restarted router bind over TIME_WAIT connections; on
    // Linux it never lets two listeners share a port (SO_REUSEPORT would).
    sk.set_reuse_address(true).map_err(fail)?;
    sk.bind(&sa.into()).map_err(fail)?;
    sk.listen(BACKLOG).map_err(fail)?;
    sk.set_nonblocking(true).map_err(fail)?;
    Ok(sk.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_is_refused_and_port_zero_resolves_once() {
        let b = Bound::bind("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0").unwrap();
        let [e, a, h] = b.addrs().unwrap();
        assert!(e.port() != 0 && a.port() != 0 && h.port() != 0);
        let err = Bound::bind(&e.to_string(), "127.0.0.1:0", "127.0.0.1:0")
            .err()
            .unwrap();
        assert!(
            err.contains(&e.to_string()) && err.contains("events_addr"),
            "{err}"
        );
        // glommio-style SO_REUSEPORT sockets cannot join either.
        let sk = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        sk.set_reuse_port(true).unwrap();
        assert!(sk.bind(&a.into()).is_err());
        let _dups = b.for_core().unwrap();
    }

    #[test]
    fn stop_listening_frees_the_ports_while_duplicates_are_open() {
        let b = Bound::bind("127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0").unwrap();
        let addrs = b.addrs().unwrap();
        // A core's duplicate (or an io_uring reference) outlives the stop.
        let dups = b.for_core().unwrap();
        b.stop_listening();
        for a in addrs {
            assert!(
                std::net::TcpStream::connect(a).is_err(),
                "{a} still accepts"
            );
        }
        // A restarted router binds the same addresses at once.
        let again = Bound::bind(
            &addrs[0].to_string(),
            &addrs[1].to_string(),
            &addrs[2].to_string(),
        );
        assert!(again.is_ok(), "{:?}", again.err());
        drop(dups);
    }
}
