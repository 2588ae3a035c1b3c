//! Per-core keep-alive connections to the workers (hyper's HTTP/1.1 client over
//! glommio `TcpStream`s, [`super::io::ClientIo`]).
//!
//! A connection is owned by exactly one request at a time and goes back to its
//! core's pool only after its response body ended cleanly; each worker keeps at most
//! `pool_max_idle` idle connections per core. A connection's hyper task is held by the
//! [`Conn`]: dropping the `Conn` (a client that went away, a broken stream) cancels the
//! task and closes the socket, which is how the proxy aborts an upstream request.
//! Host names are resolved with the system resolver at connect time (blocking the
//! core for the lookup: give IP addresses or names the resolver answers from
//! `/etc/hosts` on a latency-sensitive router).

use super::retry::Failure;
use super::url::UpstreamUrl;
use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

pub type ReqBody = Full<Bytes>;

pub struct Conn {
    pub sender: SendRequest<ReqBody>,
    key: String,
    _task: glommio::Task<()>,
}

thread_local! {
    static POOL: RefCell<HashMap<String, Vec<Conn>>> = RefCell::new(HashMap::new());
}

fn resolve(u: &UpstreamUrl) -> Result<SocketAddr, Failure> {
    if let Ok(ip) = u.host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, u.port));
    }
    (u.host.as_str(), u.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or(Failure::Connect)
}

/// A pooled connection to `u` if one is idle and usable, else a new one.
pub async fn get(u: &UpstreamUrl, connect_timeout: Duration) -> Result<(Conn, bool), Failure> {
    while let Some(mut c) = take(&u.authority) {
        // A connection put back right after its body ended may still be finishing that
        // exchange; `ready` waits for it (or fails if the worker closed it).
        if c.sender.ready().await.is_ok() {
            return Ok((c, true));
        }
    }
    connect(u, connect_timeout).await.map(|c| (c, false))
}

fn take(key: &str) -> Option<Conn> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.get_mut(key)?;
        while let Some(c) = idle.pop() {
            if !c.sender.is_closed() {
                return Some(c);
            }
        }
        None
    })
}

pub async fn connect(u: &UpstreamUrl, timeout: Duration) -> Result<Conn, Failure> {
    let addr = resolve(u)?;
    let stream = match glommio::net::TcpStream::connect_timeout(addr, timeout).await {
        Ok(s) => s,
        Err(glommio::GlommioError::TimedOut(_)) => return Err(Failure::ConnectTimeout),
        Err(e) => {
            let io: std::io::Error = e.into();
            return Err(if io.kind() == std::io::ErrorKind::TimedOut {
                Failure::ConnectTimeout
            } else {
                Failure::Connect
            });
        }
    };
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(256 << 10)
        .handshake(super::io::ClientIo(stream))
        .await
        .map_err(|_| Failure::Connect)?;
    let task = glommio::spawn_local(async move {
        let _ = conn.await;
    });
    Ok(Conn {
        sender,
        key: u.authority.clone(),
        _task: task,
    })
}

/// Returns a connection whose response ended cleanly, unless `max_idle` are idle.
pub fn put(c: Conn, max_idle: usize) {
    if c.sender.is_closed() {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let idle = p.entry(c.key.clone()).or_default();
        if idle.len() < max_idle {
            idle.push(c);
        }
    });
}

/// Drops every idle connection to `authority` (its worker failed).
pub fn forget(authority: &str) {
    POOL.with(|p| {
        p.borrow_mut().remove(authority);
    });
}
