//! `kvroute-sim relay`: the least any proxy can add on this machine.
//!
//! A byte relay with no protocol: each accepted client connection gets its own
//! upstream connection, and two threads copy bytes each way as they arrive (blocking
//! reads, `TCP_NODELAY` on both sides, no buffering beyond one read). It parses
//! nothing, routes nothing, pools nothing. Replayed through it, "relay minus direct"
//! is the cost of one more process on the path: its two wake-ups (request in,
//! response in), its four system calls and, for a new client connection, one upstream
//! connect. That is a floor for every router's added latency on the same machine,
//! the yardstick for "kvroute's added latency" against a peer's (docs/PERFORMANCE.md,
//! "Proxy overhead").
//!
//! Guarantees: at most `--max-connections` client connections at once (beyond it a
//! new one is closed at once); a connection whose upstream cannot be reached is
//! closed; either side closing closes both. Runs until killed.

use clap::Args;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct RelayArgs {
    /// Address to listen on (port 0: pick one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Where every connection is relayed to.
    #[arg(long, required_unless_present = "events_addr")]
    upstream: Option<String>,
    /// Client connections relayed at once.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Relay HTTP/1.1 with hyper on tokio instead of bytes (`relay_http.rs`).
    #[arg(long)]
    http: bool,
    /// With `--http`: do a router's work on every request before forwarding it, with
    /// this tokenizer (`MODEL=DIR`, as `kvroute serve --tokenizer`; `relay_route.rs`).
    #[arg(long, requires = "http")]
    route_tokenizer: Option<String>,
    /// The routing work's block size.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// With `--route-tokenizer` and no `--upstream`: route among the workers that
    /// register at this address by kvroute's binary event protocol, with their KV
    /// events (`relay_events.rs`; port 0: pick one, printed).
    #[arg(long, requires = "route_tokenizer", conflicts_with = "upstream")]
    events_addr: Option<String>,
}

pub fn run(a: RelayArgs) -> Result<(), String> {
    if a.http {
        let work = match &a.route_tokenizer {
            Some(t) => Some(super::relay_route::RouteWork::new(
                t,
                a.block_size,
                a.upstream.is_some(),
            )?),
            None => None,
        };
        return super::relay_http::run(
            &a.listen,
            a.upstream.as_deref(),
            a.max_connections,
            work,
            a.events_addr.as_deref(),
        );
    }
    let Some(upstream) = a.upstream else {
        return Err("--upstream is needed without --events-addr".into());
    };
    let l = TcpListener::bind(&a.listen).map_err(|e| format!("listen {}: {e}", a.listen))?;
    let addr = l.local_addr().map_err(|e| format!("local_addr: {e}"))?;
    println!("relay listening on {addr} -> {upstream}");
    let live = Arc::new(AtomicUsize::new(0));
    for c in l.incoming() {
        let Ok(client) = c else {
            // EMFILE and the like: back off instead of spinning on accept.
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        if live.load(Ordering::Relaxed) >= a.max_connections {
            continue; // dropped: closed
        }
        live.fetch_add(1, Ordering::Relaxed);
        let (up, mine) = (upstream.clone(), live.clone());
        let spawned = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || {
                pair(client, &up);
                mine.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Relays one client connection until either side closes.
fn pair(client: TcpStream, upstream: &str) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let back = std::thread::Builder::new()
        .name("relay-back".into())
        .spawn(move || copy(s2, c2));
    copy(client, server);
    if let Ok(h) = back {
        let _ = h.join();
    }
}

/// Copies `from` to `to` read by read; closes both directions at the end.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
