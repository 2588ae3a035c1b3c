//! `kvroute-sim relay --http --route-tokenizer … --events-addr ADDR`: the routing
//! control's KV-event door, kvroute's binary event protocol (docs/PROTOCOL.md) on
//! tokio, decoded by kvroute's own sans-I/O codec (`kvroute::codec`).
//!
//! Per connection: the worker's `Hello` registers it with the control's engine
//! (`relay_route::RouteWork::register`) and is answered `HelloAck` (sequence 0); then
//! `Stored`, `Removed` and `Cleared` are applied to the engine as they arrive, and a
//! re-announce (`ResyncBegin`) first clears the worker's blocks. Heartbeats are read
//! and dropped: the control routes among every worker that ever registered.
//!
//! Who may call it: anyone on loopback; it is a benchmark's control, with no
//! authentication. What it trusts: nothing in a frame. A frame over the codec's
//! default limit, one that does not decode, anything before `Hello` or a second
//! `Hello` ends the connection with an `Error` frame; the decoder allocates nothing
//! for a frame before its bytes are in.

use super::relay_route::RouteWork;
use bytes::BytesMut;
use kvroute::codec::{
    ErrorCode, EventMsg, FrameDecoder, WorkerBound, DEFAULT_MAX_FRAME, PROTOCOL_VERSION,
};
use kvroute::engine::KvEvent;
use std::rc::Rc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Accepts event connections on `l` for as long as the relay runs.
pub async fn serve(l: TcpListener, work: Rc<RouteWork>) {
    loop {
        let Ok((s, _)) = l.accept().await else {
            // EMFILE and the like: back off instead of spinning on accept.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            continue;
        };
        let work = work.clone();
        tokio::task::spawn_local(async move {
            if let Err(e) = connection(s, &work).await {
                log(&format!("event connection closed: {e}"));
            }
        });
    }
}

/// Serves one worker's event connection until it closes or breaks the protocol.
async fn connection(mut s: TcpStream, work: &RouteWork) -> Result<(), String> {
    let _ = s.set_nodelay(true);
    let mut dec = FrameDecoder::new(DEFAULT_MAX_FRAME);
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut worker: Option<String> = None;
    loop {
        loop {
            // A frame, then its message: either failing ends the connection.
            let next = dec
                .decode(&mut buf)
                .and_then(|f| f.map(|f| EventMsg::decode(&f)).transpose());
            let msg = match next {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    let code = e.error_code(&kvroute::codec::kind::WORKER_BOUND);
                    return refuse(&mut s, code, e.to_string()).await;
                }
            };
            match (msg, &worker) {
                (EventMsg::Hello(h), None) => {
                    let id = h.spec.id.clone();
                    if let Err(e) = work.register(h.spec) {
                        return refuse(&mut s, ErrorCode::BadRequest, e).await;
                    }
                    log(&format!("worker {id} registered"));
                    let mut out = BytesMut::new();
                    WorkerBound::HelloAck {
                        server_version: PROTOCOL_VERSION,
                        next_seq: 0,
                    }
                    .encode(&mut out);
                    s.write_all(&out).await.map_err(|e| e.to_string())?;
                    worker = Some(id);
                }
                (EventMsg::Hello(_), Some(_)) | (_, None) => {
                    let m = "Hello must come first, once".to_string();
                    return refuse(&mut s, ErrorCode::ProtocolViolation, m).await;
                }
                (m, Some(id)) => {
                    if let Some(ev) = as_event(m) {
                        work.apply(id, &ev);
                    }
                }
            }
        }
        // The decoder needs more bytes: read what has come.
        buf.reserve(64 << 10);
        match s.read_buf(&mut buf).await {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// One line on stderr; a closed stderr is no reason to stop.
fn log(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "relay: {line}");
}

/// The engine's view of an event frame after `Hello` (`None`: nothing to apply).
fn as_event(m: EventMsg) -> Option<KvEvent> {
    match m {
        EventMsg::Stored {
            tier,
            parent,
            hashes,
            ..
        } => Some(KvEvent::Stored {
            tier,
            parent,
            block_hashes: hashes.to_vec(),
        }),
        EventMsg::Removed { tier, hashes, .. } => Some(KvEvent::Removed {
            tier,
            block_hashes: hashes.to_vec(),
        }),
        EventMsg::Cleared { tier, .. } => Some(KvEvent::Cleared { tier }),
        // A re-announce rebuilds the worker's blocks from nothing.
        EventMsg::ResyncBegin { .. } => Some(KvEvent::Cleared { tier: None }),
        EventMsg::Hello(_) | EventMsg::Heartbeat { .. } | EventMsg::ResyncEnd { .. } => None,
    }
}

/// Answers a protocol error with an `Error` frame; the connection then closes.
async fn refuse(s: &mut TcpStream, code: ErrorCode, message: String) -> Result<(), String> {
    let mut out = BytesMut::new();
    WorkerBound::Error {
        code: code.as_u16(),
        message: message.clone(),
    }
    .encode(&mut out);
    let _ = s.write_all(&out).await;
    Err(message)
}
