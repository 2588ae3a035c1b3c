//! The accept loop every listener of a core runs: connection slots, the displacement
//! of idle and pre-handshake connections at `max_connections`, and the proxy's 429 for
//! a connection refused. Part of the service's top layer (it hands connections to the
//! API servers and to the proxy's driver); it owns no state beyond each loop's table.

use super::runtime::core::Core;
use super::{metrics, net};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Accepts connections until shutdown. Each listener on each core has a slot table
/// (`conn_slot`): at `max_connections` a new connection displaces a pre-handshake or
/// idle one and is refused only when every slot is busy; pre-handshake connections are
/// capped at `max_preauth_connections`, the oldest going first (`slots`).
pub async fn accept_loop<F, Fut>(
    core: Rc<Core>,
    l: glommio::net::TcpListener,
    name: &'static str,
    serve: F,
) where
    F: Fn(Rc<Core>, glommio::net::TcpStream, Rc<net::conn_slot::Slot>) -> Fut + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let table = net::conn_slot::Table::new();
    let labels = metrics::ListenerLabel { listener: name };
    let limits = &core.shared.settings.limits;
    let caps = net::slots::Caps {
        max_connections: limits.max_connections,
        max_preauth: limits.max_preauth_connections,
    };
    loop {
        let stream = match l.accept().await {
            Ok(s) => s,
            // Stopped listening (shutdown), or a transient error (EMFILE...).
            Err(_) if core.shared.stopping.load(Ordering::Relaxed) => break,
            // The proxy's listener alone stops first, when the proxy drains.
            Err(_) if name == "proxy" && core.shared.draining.load(Ordering::Relaxed) => break,
            Err(_) => {
                glommio::timer::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        if core.shared.stopping.load(Ordering::Relaxed) {
            break;
        }
        core.shared
            .metrics
            .connections_total
            .get_or_create(&labels)
            .inc();
        let now = core.shared.now_ms();
        match table.admit(caps, now) {
            net::slots::Admission::Refuse => {
                core.shared.metrics.protocol_error("connection_limit");
                // The proxy answers 429 (`proxy::refuse`); the others drop it.
                if name == "proxy" {
                    if !crate::proxy::refuse::answer(stream, 4 * caps.max_connections) {
                        core.shared
                            .metrics
                            .protocol_error("connection_limit_dropped");
                    }
                } else {
                    drop(stream);
                }
                continue;
            }
            net::slots::Admission::Displace { why, .. } => {
                core.shared.metrics.protocol_error(why.label());
            }
            net::slots::Admission::Admit => {}
        }
        let _ = stream.set_nodelay(true);
        let guard = table.insert(now);
        core.shared.metrics.connections.get_or_create(&labels).inc();
        let (c, sh) = (core.clone(), core.shared.clone());
        let fut = serve(c, stream, guard.slot.clone());
        glommio::spawn_local(async move {
            fut.await;
            drop(guard);
            sh.metrics
                .connections
                .get_or_create(&metrics::ListenerLabel { listener: name })
                .dec();
        })
        .detach();
        // Let the new connection read what it already has (a Hello sent right after
        // connecting) before the next accept. glommio accepts synchronously while the
        // backlog is non-empty, but a new socket's first read waits for the rings: in a
        // reconnect storm the loop would accept the whole backlog before any Hello is
        // read, and displace those connections as pre-handshake.
        net::conn::yield_to_poll().await;
    }
}
