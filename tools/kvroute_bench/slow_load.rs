//! Slow clients of a soak (`--slow-clients N`), on every replica's HTTP ports: a third
//! trickle a request head (a byte a second: slowloris), a third send a full head
//! announcing a 100,000-byte body and trickle the body (a byte every 3 s), a third
//! read streamed completions slowly (a 4 KiB receive buffer, 256 bytes every 100 ms).
//! A connection the router cuts is opened again, so the pressure never lets up. The
//! router is expected to cut the first two kinds (their cuts are counted, not
//! errors) and to serve the slow readers in full.

use serde::Serialize;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Default, Serialize)]
pub struct SlowOut {
    pub heads_opened: u64,
    pub heads_cut: u64,
    pub bodies_opened: u64,
    pub bodies_cut: u64,
    pub streams_started: u64,
    pub streams_completed: u64,
    /// Slow readers whose stream ended without `[DONE]` (cut by the router, or the
    /// replica restarting).
    pub streams_cut: u64,
}

impl SlowOut {
    pub fn add(&mut self, o: SlowOut) {
        self.heads_opened += o.heads_opened;
        self.heads_cut += o.heads_cut;
        self.bodies_opened += o.bodies_opened;
        self.bodies_cut += o.bodies_cut;
        self.streams_started += o.streams_started;
        self.streams_completed += o.streams_completed;
        self.streams_cut += o.streams_cut;
    }
}

fn open(addr: &str, first: &[u8]) -> Option<TcpStream> {
    let sa = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(1)).ok()?;
    s.write_all(first).ok()?;
    s.set_nonblocking(true).ok()?;
    Some(s)
}

/// The router closed `s`, or answered on it (it is closing it).
fn done(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    match s.read(&mut buf) {
        Ok(0) | Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// `n` tricklers over `targets` (address, first bytes), one byte every `every`.
/// Returns (opened, cut).
fn trickle(
    targets: &[(String, Vec<u8>)],
    n: usize,
    every: Duration,
    stop: &AtomicBool,
) -> (u64, u64) {
    let (mut opened, mut cut) = (0u64, 0u64);
    let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut next_byte = Instant::now() + every;
    while !stop.load(Ordering::Relaxed) {
        let byte = Instant::now() >= next_byte;
        if byte {
            next_byte += every;
        }
        for (k, slot) in socks.iter_mut().enumerate() {
            let alive = match slot {
                Some(s) => !done(s) && (!byte || s.write_all(b" ").is_ok()),
                None => true,
            };
            if !alive {
                cut += 1;
                *slot = None;
            }
            if slot.is_none() {
                let (addr, first) = &targets[k % targets.len()];
                *slot = open(addr, first);
                opened += u64::from(slot.is_some());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    (opened, cut)
}

/// Slowloris heads on every HTTP port of `https` and `proxies`.
pub fn heads(https: &[String], proxies: &[String], n: usize, stop: &AtomicBool) -> SlowOut {
    let head = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ".to_vec();
    let targets: Vec<(String, Vec<u8>)> = https
        .iter()
        .chain(proxies)
        .map(|a| (a.clone(), head.clone()))
        .collect();
    let (heads_opened, heads_cut) = trickle(&targets, n, Duration::from_secs(1), stop);
    SlowOut {
        heads_opened,
        heads_cut,
        ..Default::default()
    }
}

/// Trickled bodies: `POST /v1/workers` on the JSON API ports, `POST /v1/completions`
/// on the proxy ports.
pub fn bodies(https: &[String], proxies: &[String], n: usize, stop: &AtomicBool) -> SlowOut {
    let head = |path: &str| {
        format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{").into_bytes()
    };
    let targets: Vec<(String, Vec<u8>)> = https
        .iter()
        .map(|a| (a.clone(), head("/v1/workers")))
        .chain(proxies.iter().map(|a| (a.clone(), head("/v1/completions"))))
        .collect();
    let (bodies_opened, bodies_cut) = trickle(&targets, n, Duration::from_secs(3), stop);
    SlowOut {
        bodies_opened,
        bodies_cut,
        ..Default::default()
    }
}

fn slow_socket(addr: &str) -> Option<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let sa: std::net::SocketAddr = addr.parse().ok()?;
    let s = Socket::new(Domain::for_address(sa), Type::STREAM, None).ok()?;
    s.set_recv_buffer_size(4096).ok()?;
    s.connect_timeout(&sa.into(), Duration::from_secs(1)).ok()?;
    Some(s.into())
}

/// One slow reader of streamed completions, on the proxies in turn, until `stop`.
pub fn reader(proxies: &[String], r: usize, stop: &AtomicBool) -> SlowOut {
    let mut out = SlowOut::default();
    let mut i = r;
    while !stop.load(Ordering::Relaxed) {
        let proxy = &proxies[i % proxies.len()];
        i += 1;
        let Some(mut s) = slow_socket(proxy) else {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        let body = serde_json::json!({
            "model": crate::proxy_load::MODEL,
            "prompt": crate::proxy_load::prompt(i as u64 % 16, 1 << 40 | i as u64, 16),
            "max_tokens": 256,
            "stream": true,
        })
        .to_string();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        if s.write_all(req.as_bytes()).is_err() {
            continue;
        }
        out.streams_started += 1;
        let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if stop.load(Ordering::Relaxed) {
                // Abandoned at the end of the run: neither completed nor cut.
                return out;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if got.windows(12).any(|w| w == b"data: [DONE]") {
            out.streams_completed += 1;
        } else {
            out.streams_cut += 1;
        }
    }
    out
}
