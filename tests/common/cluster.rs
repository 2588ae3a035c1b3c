//! NATS harness for the replica tests (tests/cluster*.rs): a `nats-server` with
//! JetStream on a free loopback port and a temporary store directory, killed in Drop,
//! optionally with a configuration (accounts, users, permissions); `restart` keeps the
//! port and the store (a NATS restart mid-run). [`RawNats`] is a plain NATS client
//! over the text protocol: what any process with access to the server can send.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tier secret of every test replica (`Server::start` passes it in
/// `KVROUTE_CLUSTER_SECRET`).
pub const TEST_SECRET: &str = "kvroute-test-tier-secret";

pub struct NatsServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    /// A configuration file (`-c`), when started with [`NatsServer::start_conf`].
    conf: Option<std::path::PathBuf>,
}

/// Whether `nats-server` is installed. Without it the tests skip with a message,
/// except under CI, where `.ci/run` installs it and a missing binary is a failure.
pub fn nats_available() -> bool {
    let ok = Command::new("nats-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "nats-server missing under CI (.ci/run installs it)"
        );
        eprintln!("SKIPPED: nats-server is not installed (apt-get install nats-server)");
    }
    ok
}

impl NatsServer {
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut s = NatsServer {
            child: None,
            port: super::free_port(),
            dir,
            conf: None,
        };
        s.spawn();
        s
    }

    /// [`NatsServer::start`] with `conf` (NATS configuration syntax: `authorization`,
    /// `accounts`...) added to the port, host and JetStream store.
    pub fn start_conf(conf: &str) -> NatsServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nats.conf");
        std::fs::write(&path, conf).expect("write nats.conf");
        let mut s = NatsServer {
            child: None,
            port: super::free_port(),
            dir,
            conf: Some(path),
        };
        s.spawn();
        s
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new("nats-server");
        if let Some(conf) = &self.conf {
            cmd.arg("-c").arg(conf);
        }
        let child = cmd
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL: no goodbye to the clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the server sent besides `PING` / `+OK` / `INFO`.
#[derive(Debug)]
pub enum Event {
    Msg { subject: String, payload: Vec<u8> },
    Pong,
    Err(String),
}

/// A plain NATS client over the text protocol, no library: connect (optionally as a
/// user), publish (with headers too), subscribe, read messages.
pub struct RawNats {
    s: TcpStream,
    buf: Vec<u8>,
    msgs: VecDeque<(String, Vec<u8>)>,
}

impl RawNats {
    /// Connects (as `user`/`pass` if given) and waits for the server's first `PONG`;
    /// `Err` with the server's `-ERR` (e.g. authorization violation).
    pub fn connect(port: u16, user: Option<(&str, &str)>) -> Result<RawNats, String> {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        let mut n = RawNats {
            s,
            buf: Vec::new(),
            msgs: VecDeque::new(),
        };
        let mut c = serde_json::json!({"verbose": false, "pedantic": false, "headers": true});
        if let Some((u, p)) = user {
            c["user"] = u.into();
            c["pass"] = p.into();
        }
        n.send(format!("CONNECT {c}\r\n").as_bytes());
        match n.flush().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("write to nats");
    }

    pub fn publish(&mut self, subject: &str, reply: Option<&str>, payload: &[u8]) {
        let reply = reply.map(|r| format!(" {r}")).unwrap_or_default();
        let mut out = format!("PUB {subject}{reply} {}\r\n", payload.len()).into_bytes();
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
        self.send(&out);
    }

    /// Publishes with NATS headers (e.g. a KV delete: `KV-Operation: DEL`).
    pub fn hpublish(&mut self, subject: &str, headers: &[(&str, &str)], payload: &[u8]) {
        let mut h = "NATS/1.0\r\n".to_string();
        for (k, v) in headers {
            h.push_str(&format!("{k}: {v}\r\n"));
        }
        h.push_str("\r\n");
        let total = h.len() + payload.len();
        let mut out = format!("HPUB {subject} {} {total}\r\n{h}", h.len()).into_bytes();
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
        self.send(&out);
    }

    pub fn subscribe(&mut self, subject: &str, sid: u32) {
        self.send(format!("SUB {subject} {sid}\r\n").as_bytes());
    }

    /// A round trip: everything sent before was handled by the server. Returns the
    /// `-ERR` lines it sent meanwhile (permission violations...; or the one before it
    /// closed the connection); messages that arrived are kept for
    /// [`RawNats::next_msg`].
    pub fn flush(&mut self) -> Vec<String> {
        self.send(b"PING\r\n");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut errs = Vec::new();
        loop {
            match self.event(deadline) {
                Some(Event::Pong) => return errs,
                Some(Event::Err(e)) => errs.push(e),
                Some(Event::Msg { subject, payload }) => self.msgs.push_back((subject, payload)),
                None if !errs.is_empty() => return errs,
                None => panic!("no PONG from nats within 10 s"),
            }
        }
    }

    /// The next message within `wait`: (subject, payload).
    pub fn next_msg(&mut self, wait: Duration) -> Option<(String, Vec<u8>)> {
        if let Some(m) = self.msgs.pop_front() {
            return Some(m);
        }
        let deadline = Instant::now() + wait;
        loop {
            match self.event(deadline)? {
                Event::Msg { subject, payload } => return Some((subject, payload)),
                Event::Pong | Event::Err(_) => {}
            }
        }
    }

    fn fill(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        self.s.set_read_timeout(Some(left)).expect("read timeout");
        let mut b = [0u8; 65536];
        match self.s.read(&mut b) {
            // Closed (after an `-ERR` that ends the connection): nothing more.
            Ok(0) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&b[..n]);
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(e) => panic!("nats read: {e}"),
        }
    }

    fn line(&mut self, deadline: Instant) -> Option<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                self.buf.drain(..i + 2);
                return Some(l);
            }
            if !self.fill(deadline) {
                return None;
            }
        }
    }

    fn bytes(&mut self, n: usize, deadline: Instant) -> Option<Vec<u8>> {
        while self.buf.len() < n + 2 {
            if !self.fill(deadline) {
                return None;
            }
        }
        let b = self.buf[..n].to_vec();
        self.buf.drain(..n + 2);
        Some(b)
    }

    fn event(&mut self, deadline: Instant) -> Option<Event> {
        loop {
            let l = self.line(deadline)?;
            let parts: Vec<&str> = l.split_whitespace().collect();
            match parts.first().copied() {
                Some("PING") => self.send(b"PONG\r\n"),
                Some("PONG") => return Some(Event::Pong),
                Some("-ERR") => return Some(Event::Err(l)),
                Some("MSG") => {
                    let n: usize = parts.last()?.parse().ok()?;
                    let payload = self.bytes(n, deadline)?;
                    let subject = parts.get(1)?.to_string();
                    return Some(Event::Msg { subject, payload });
                }
                Some("HMSG") => {
                    let total: usize = parts.last()?.parse().ok()?;
                    let hdr: usize = parts.get(parts.len() - 2)?.parse().ok()?;
                    let all = self.bytes(total, deadline)?;
                    let subject = parts.get(1)?.to_string();
                    let payload = all.get(hdr..).unwrap_or_default().to_vec();
                    return Some(Event::Msg { subject, payload });
                }
                _ => {} // INFO, +OK
            }
        }
    }
}
