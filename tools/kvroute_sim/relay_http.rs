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
//! read whole, routed, and forwarded from memory; the answer's first data frame is the
//! decision's first token and its end finishes it. `GET /metrics` then answers the
//! decisions' wall time instead of being forwarded. With workers registered by events
//! (`--events-addr`, `relay_events.rs`), a client connection opens one upstream
//! connection per worker its requests are routed to.
//!
//! Guarantees: at most `max_connections` client connections at once (beyond it a new
//! one is closed at once); a connection whose upstream cannot be reached is closed;
//! either side closing closes both, and a routed request whose answer is cut off is
//! finished all the same. Runs until killed.

use super::relay_route::{RouteWork, MAX_BODY};
use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::cell::{Cell, RefCell};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

type Out = Either<Incoming, Full<Bytes>>;
type Error = Box<dyn std::error::Error + Send + Sync>;
/// One upstream connection; one request at a time on it, as HTTP/1.1 clients send them.
type Tx = Rc<tokio::sync::Mutex<SendRequest<Out>>>;

/// Serves `listen`, relaying to `upstream`, or (with `events`, routing work required)
/// to the workers that register at `events`.
pub fn run(
    listen: &str,
    upstream: Option<&str>,
    max_connections: usize,
    work: Option<RouteWork>,
    events: Option<&str>,
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
        if let (Some(e), Some(w)) = (events, &work) {
            let el = TcpListener::bind(e)
                .await
                .map_err(|err| format!("listen {e}: {err}"))?;
            let ea = el.local_addr().map_err(|e| format!("local_addr: {e}"))?;
            println!("relay events on {ea}");
            tokio::task::spawn_local(super::relay_events::serve(el, w.clone()));
        }
        let to = upstream.unwrap_or("the workers registered by events");
        println!("relay listening on {addr} -> {to} (http)");
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
            let (up, mine, work) = (upstream.map(str::to_string), live.clone(), work.clone());
            tokio::task::spawn_local(async move {
                pair(client, up, work).await;
                mine.set(mine.get() - 1);
            });
        }
    })
}

/// A client connection's upstream connections, one per address, made when first
/// needed (`--upstream`'s at once, while the client sends its first request).
struct Upstreams {
    default: Option<String>,
    conns: RefCell<Vec<(String, Tx)>>,
}

impl Upstreams {
    /// The connection to `to` (`host:port`; `None`: `--upstream`'s).
    async fn get(&self, to: Option<&str>) -> Option<Tx> {
        let addr = to.or(self.default.as_deref())?;
        if let Some((_, tx)) = self.conns.borrow().iter().find(|(a, _)| a == addr) {
            return Some(tx.clone());
        }
        let server = TcpStream::connect(addr).await.ok()?;
        let _ = server.set_nodelay(true);
        let (tx, conn) = hyper::client::conn::http1::handshake::<_, Out>(TokioIo::new(server))
            .await
            .ok()?;
        tokio::task::spawn_local(async move {
            let _ = conn.await;
        });
        let tx = Rc::new(tokio::sync::Mutex::new(tx));
        self.conns.borrow_mut().push((addr.to_string(), tx.clone()));
        Some(tx)
    }
}

/// Serves one client connection until either side closes.
async fn pair(client: TcpStream, upstream: Option<String>, work: Option<Rc<RouteWork>>) {
    let ups = Rc::new(Upstreams {
        default: upstream,
        conns: RefCell::new(Vec::new()),
    });
    if ups.default.is_some() && ups.get(None).await.is_none() {
        return;
    }
    let _ = client.set_nodelay(true);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (ups, work) = (ups.clone(), work.clone());
        async move {
            let Some(w) = &work else {
                let tx = ups.get(None).await.ok_or("upstream unreachable")?;
                let resp = send(&tx, req.map(Either::Left)).await?;
                return Ok::<_, Error>(resp.map(|b| Either::Left(Tracked::new(b, None))));
            };
            if req.uri().path() == "/metrics" && req.method() == hyper::Method::GET {
                return Ok(Response::new(Either::Right(Full::new(w.metrics().into()))));
            }
            let (parts, body) = req.into_parts();
            // A body over the limit, or broken off, ends the connection.
            let raw = Limited::new(body, MAX_BODY).collect().await?.to_bytes();
            let routed = w.route(parts.uri.path(), &raw);
            let to = match &routed {
                Some(r) => r.to.clone(),
                None => w.fallback(),
            };
            let tx = ups.get(to.as_deref()).await.ok_or("upstream unreachable")?;
            let req = Request::from_parts(parts, Either::Right(Full::new(raw)));
            let resp = match send(&tx, req).await {
                Ok(r) => r,
                Err(e) => {
                    if let Some(r) = &routed {
                        w.finish(&r.rid);
                    }
                    return Err(e);
                }
            };
            let done = routed.map(|r| (w.clone(), r.rid));
            Ok(resp.map(|b| Either::Left(Tracked::new(b, done))))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), svc)
        .await;
}

async fn send(tx: &Tx, req: Request<Out>) -> Result<Response<Incoming>, Error> {
    let mut tx = tx.lock().await;
    tx.ready().await?;
    Ok(tx.send_request(req).await?)
}

/// An answer's body on its way back: its first data frame is the routed request's
/// first token, its end (or the client's going away) finishes it.
struct Tracked {
    inner: Incoming,
    done: Option<(Rc<RouteWork>, String)>,
    first: bool,
}

impl Tracked {
    fn new(inner: Incoming, done: Option<(Rc<RouteWork>, String)>) -> Tracked {
        Tracked {
            inner,
            done,
            first: false,
        }
    }

    fn end(&mut self) {
        if let Some((w, rid)) = self.done.take() {
            w.finish(&rid);
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) if f.is_data() && !this.first => {
                this.first = true;
                if let Some((w, rid)) = &this.done {
                    w.first_token(rid);
                }
            }
            Poll::Ready(None) => this.end(),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.end();
    }
}
