//! A small listening ZMTP PUB socket: accepts SUB peers, completes the handshake,
//! tracks their subscriptions and sends multipart messages to every peer whose
//! subscription prefixes the first frame. For Rust tools and tests that publish engine
//! events without Python (it is not used by the router itself).
//!
//! Guarantees: one accept thread and one reader thread per peer, all stopped (within
//! about 50 ms) when the [`Publisher`] is dropped; a peer that fails a write is dropped;
//! sends never block longer than the write timeout per peer; subscriptions per peer are
//! bounded ([`MAX_SUBSCRIPTIONS`]).

use super::codec::{self, Command, Item, Limits};
use super::conn::Conn;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Subscriptions one peer may hold.
pub const MAX_SUBSCRIPTIONS: usize = 256;
const POLL: Duration = Duration::from_millis(50);
const HANDSHAKE: Duration = Duration::from_secs(2);

struct Peer {
    out: TcpStream,
    subs: Arc<Mutex<Vec<Vec<u8>>>>,
    alive: Arc<AtomicBool>,
}

struct Inner {
    peers: Mutex<Vec<Peer>>,
    stop: AtomicBool,
    /// Peers that completed the handshake, ever.
    accepted: AtomicUsize,
}

/// A PUB socket bound to a local address.
pub struct Publisher {
    inner: Arc<Inner>,
    addr: SocketAddr,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Publisher {
    /// Binds (e.g. `127.0.0.1:0`) and starts accepting subscribers.
    pub fn bind(addr: &str) -> std::io::Result<Publisher> {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let inner = Arc::new(Inner {
            peers: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
        });
        let i = inner.clone();
        let t = std::thread::Builder::new()
            .name("zmtp-pub-accept".into())
            .spawn(move || accept_loop(l, i))?;
        Ok(Publisher {
            inner,
            addr,
            threads: vec![t],
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `tcp://ip:port` for a subscriber's configuration.
    pub fn endpoint(&self) -> String {
        format!("tcp://{}", self.addr)
    }

    /// Peers that completed the handshake since the socket was bound (a subscriber
    /// that reconnects counts again).
    pub fn accepted(&self) -> usize {
        self.inner.accepted.load(Ordering::Acquire)
    }

    /// Waits until `n` peers were ever accepted and at least one live peer subscribed.
    pub fn wait_accepted(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.accepted() < n || self.subscribers() == 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Connected peers holding at least one subscription.
    pub fn subscribers(&self) -> usize {
        let peers = lock(&self.inner.peers);
        peers
            .iter()
            .filter(|p| p.alive.load(Ordering::Acquire) && !lock(&p.subs).is_empty())
            .count()
    }

    /// Waits until at least `n` peers subscribed; false on timeout.
    pub fn wait_subscribers(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.subscribers() < n {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Sends a multipart message to every peer subscribed to a prefix of its first
    /// frame. Returns the number of peers it went to.
    pub fn send<F: AsRef<[u8]>>(&self, frames: &[F]) -> usize {
        let topic = frames.first().map(|f| f.as_ref()).unwrap_or(&[]);
        let mut wire = Vec::new();
        codec::encode_message(&mut wire, frames);
        self.send_matching(topic, &wire)
    }

    /// Sends raw bytes (already framed, or deliberately not) to every subscribed peer.
    pub fn send_raw(&self, bytes: &[u8]) -> usize {
        self.send_matching(&[], bytes)
    }

    fn send_matching(&self, topic: &[u8], wire: &[u8]) -> usize {
        let mut peers = lock(&self.inner.peers);
        peers.retain(|p| p.alive.load(Ordering::Acquire));
        let mut sent = 0;
        for p in peers.iter_mut() {
            let matches = lock(&p.subs).iter().any(|s| topic.starts_with(s));
            if !matches {
                continue;
            }
            if (&p.out).write_all(wire).is_ok() {
                sent += 1;
            } else {
                p.alive.store(false, Ordering::Release);
                let _ = p.out.shutdown(std::net::Shutdown::Both);
            }
        }
        sent
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        for p in lock(&self.inner.peers).iter() {
            let _ = p.out.shutdown(std::net::Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn accept_loop(l: TcpListener, inner: Arc<Inner>) {
    let mut readers = Vec::new();
    while !inner.stop.load(Ordering::Acquire) {
        let s = match l.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                std::thread::sleep(POLL);
                continue;
            }
        };
        let _ = s.set_nonblocking(false);
        let Ok(mut conn) = Conn::handshake(s, "PUB", None, true, Limits::default(), HANDSHAKE)
        else {
            continue;
        };
        let Ok(out) = conn.stream().try_clone() else {
            continue;
        };
        let _ = out.set_write_timeout(Some(Duration::from_secs(5)));
        let _ = conn.set_poll(POLL);
        let subs = Arc::new(Mutex::new(Vec::new()));
        let alive = Arc::new(AtomicBool::new(true));
        lock(&inner.peers).push(Peer {
            out,
            subs: subs.clone(),
            alive: alive.clone(),
        });
        inner.accepted.fetch_add(1, Ordering::AcqRel);
        let i = inner.clone();
        if let Ok(t) = std::thread::Builder::new()
            .name("zmtp-pub-peer".into())
            .spawn(move || read_loop(conn, subs, alive, i))
        {
            readers.push(t);
        }
    }
    for t in readers {
        let _ = t.join();
    }
}

fn read_loop(
    mut conn: Conn,
    subs: Arc<Mutex<Vec<Vec<u8>>>>,
    alive: Arc<AtomicBool>,
    inner: Arc<Inner>,
) {
    while !inner.stop.load(Ordering::Acquire) && alive.load(Ordering::Acquire) {
        let item = match conn.recv_item(Instant::now() + POLL) {
            Ok(Some(i)) => i,
            Ok(None) => continue,
            Err(_) => break,
        };
        let (sub, topic) = match item {
            Item::Message(m) => match m.first().and_then(|f| f.split_first()) {
                Some((1, t)) => (true, t.to_vec()),
                Some((0, t)) => (false, t.to_vec()),
                _ => continue,
            },
            Item::Command(Command::Subscribe(t)) => (true, t),
            Item::Command(Command::Cancel(t)) => (false, t),
            Item::Command(Command::Ping(ctx)) => {
                let _ = conn.send_raw(&codec::pong(&ctx));
                continue;
            }
            Item::Command(_) => continue,
        };
        let mut s = lock(&subs);
        if sub {
            if s.len() < MAX_SUBSCRIPTIONS {
                s.push(topic);
            }
        } else if let Some(i) = s.iter().position(|x| *x == topic) {
            s.remove(i);
        }
    }
    alive.store(false, Ordering::Release);
}
