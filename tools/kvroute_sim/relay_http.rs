//! `kvroute-sim relay --http`: the least an HTTP proxy adds on this machine.
//!
//! hyper's HTTP/1.1 server and client (the same hyper that kvroute's proxy runs on
//! glommio), here on tokio's current-thread runtime (epoll): each accepted client
//! connection gets its own upstream connection, and every request on it is forwarded
//! as it came (head parsed, body streamed) and its answer streamed back. It reads no
//! body, routes nothing, pools nothing. Beside the byte relay it is the control for
//! a proxy's own cost: "HTTP relay minus byte relay" is what parsing and writing
//! HTTP with hyper costs here, the rest of a router's added latency is its own work
//! and its runtime (docs/PERFORMANCE.md, "Router-tier cost").
//!
//! With a router's work (`--route-tokenizer`, `relay_route.rs`) each request's body is
//! read whole, routed, and forwarded from memory; the decision's request is finished
//! when the worker's answer head arrives.
//!
//! Guarantees: at most `max_connections` client connections at once (beyond it a new
//! one is closed at once); a connection whose upstream cannot be reached is closed;
//! either side closing closes both. Runs until killed.

use super::relay_route::{RouteWork, MAX_BODY};
use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

pub fn run(
    listen: &str,
    upstream: &str,
    max_connections: usize,
    work: Option<RouteWork>,
) -> Result<(), String> {
    let work = work.map(Rc::new);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let l = TcpListener::bind(listen)
            .await
            .map_err(|e| format!("listen {listen}: {e}"))?;
        let addr = l.local_addr().map_err(|e| format!("local_addr: {e}"))?;
        println!("relay listening on {addr} -> {upstream} (http)");
        let live = Rc::new(Cell::new(0usize));
        loop {
            let Ok((client, _)) = l.accept().await else {
                // EMFILE and the like: back off instead of spinning on accept.
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            };
            if live.get() >= max_connections {
                continue; // dropped: closed
            }
            live.set(live.get() + 1);
            let (up, mine, work) = (upstream.to_string(), live.clone(), work.clone());
            tokio::task::spawn_local(async move {
                pair(client, &up, work).await;
                mine.set(mine.get() - 1);
            });
        }
    })
}

/// Serves one client connection over its own upstream connection until either closes.
async fn pair(client: TcpStream, upstream: &str, work: Option<Rc<RouteWork>>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    type Out = Either<Incoming, Full<Bytes>>;
    let Ok((tx, conn)) =
        hyper::client::conn::http1::handshake::<_, Out>(TokioIo::new(server)).await
    else {
        return;
    };
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    // One request at a time on the upstream connection, as HTTP/1.1 clients send them.
    let tx = Rc::new(tokio::sync::Mutex::new(tx));
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (tx, work) = (tx.clone(), work.clone());
        async move {
            let (req, routed) = match &work {
                None => (req.map(Either::Left), None),
                Some(w) => {
                    let (parts, body) = req.into_parts();
                    // A body over the limit, or broken off, ends the connection.
                    let raw = Limited::new(body, MAX_BODY).collect().await?.to_bytes();
                    let rid = w.route(parts.uri.path(), &raw);
                    (
                        Request::from_parts(parts, Either::Right(Full::new(raw))),
                        rid,
                    )
                }
            };
            let mut tx = tx.lock().await;
            tx.ready().await?;
            let resp = tx.send_request(req).await;
            if let (Some(w), Some(rid)) = (&work, routed) {
                w.finish(&rid);
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(resp?)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), svc)
        .await;
}
