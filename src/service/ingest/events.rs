//! Binary event connections (workers → router, port 7400).
//!
//! Per connection: the worker's `Hello` registers it (heartbeat-tracked) and binds the
//! connection to it exclusively; then every decoded read's events become batches of
//! index operations fanned out to all shards, in order, cut by [`crate::service::runtime::index_batch`]
//! (at most 1,024 hashes per batch, long events split zero-copy), which bounds how
//! long a routing query can wait behind one. Sequence numbers are checked:
//! a gap marks the worker suspect (overlap counted as zero) and asks it to resync; a
//! full re-announce between `ResyncBegin` and `ResyncEnd` rebuilds its index state.
//! A malformed, oversized or out-of-protocol frame closes only this connection, with
//! an `Error` frame, a log line and a counted protocol error.

use crate::codec::{resync_reason, ErrorCode, EventMsg, WorkerBound, PROTOCOL_VERSION};
use crate::registry::Origin;
use crate::service::net::conn::{
    error_kind, read_for, read_hello, yield_to_poll, FramedReader, READ_CHUNK,
};
use crate::service::net::conn_slot::Slot;
use crate::service::routing::control;
use crate::service::routing::errors;
use crate::service::runtime::core::Core;
use crate::service::runtime::index_batch::Batch;
use crate::service::runtime::msg::IndexOp;
use bytes::BytesMut;
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use std::rc::Rc;
use std::sync::atomic::Ordering;

async fn send_error(s: &mut TcpStream, code: ErrorCode, message: String) {
    let mut out = BytesMut::new();
    WorkerBound::Error {
        code: code.as_u16(),
        message,
    }
    .encode(&mut out);
    let _ = s.write_all(&out).await;
    let _ = s.flush().await;
}

fn log(msg: &str) {
    eprintln!("kvroute: events: {msg}");
}

/// One event connection. Until its `Hello` is read it holds only a small reader
/// (`FramedReader::preauth`), for at most `hello_timeout_ms`; the event loop is boxed,
/// so its state is allocated only once the worker is authenticated and registered.
pub async fn serve(core: Rc<Core>, mut s: TcpStream, conn: Rc<Slot>) {
    let sh = core.shared.clone();
    let mut rd = FramedReader::preauth(sh.settings.limits.max_hello_bytes);
    // Handshake.
    let limit = std::time::Duration::from_millis(sh.settings.hello_timeout_ms);
    let frame = match read_hello(&mut rd, &mut s, &conn, limit).await {
        Ok(f) => f,
        // Told to make room (`slots`): already counted at the accept.
        Err("preauth_displaced") => return,
        Err(kind) => {
            sh.metrics.protocol_error(kind);
            send_error(
                &mut s,
                errors::hello_failure(kind),
                format!("no valid first frame ({kind})"),
            )
            .await;
            return;
        }
    };
    conn.busy();
    let hello = match EventMsg::decode(&frame) {
        Ok(EventMsg::Hello(h)) => h,
        Ok(_) => {
            sh.metrics.protocol_error("no_hello");
            send_error(
                &mut s,
                ErrorCode::ProtocolViolation,
                "first frame must be Hello".into(),
            )
            .await;
            return;
        }
        Err(e) => {
            sh.metrics.protocol_error(error_kind(&e));
            log(&format!("bad hello: {e}"));
            send_error(
                &mut s,
                e.error_code(&crate::codec::kind::WORKER_BOUND),
                format!("bad hello: {e}"),
            )
            .await;
            return;
        }
    };
    // The worker's own token if it has one, else the shared token (`credentials`).
    if !sh.creds.may_act_on(&hello.auth_token, &hello.spec.id) {
        sh.metrics.protocol_error("unauthorized");
        log(&format!(
            "worker {:?}: wrong or missing token; closing",
            hello.spec.id
        ));
        send_error(
            &mut s,
            ErrorCode::Unauthorized,
            "wrong or missing auth token".into(),
        )
        .await;
        return;
    }
    let worker_id = hello.spec.id.clone();
    // Registers and binds this connection to the worker in one registry write: a second
    // connection, or a Hello changing the spec of a worker another door registered, is
    // refused (`conflict`) before anything changes.
    let (up, gen) = match control::register(&core, hello.spec, Origin::Events).await {
        Ok(r) => r,
        Err(e) => {
            if errors::code(&e) == ErrorCode::Conflict {
                sh.metrics.protocol_error("already_connected");
            }
            send_error(&mut s, errors::code(&e), e.to_string()).await;
            return;
        }
    };
    let slot = up.slot();
    let Some(cells) = sh.cells(slot) else {
        control::release_connection(&sh, slot, gen);
        return;
    };
    let next = cells.next_seq.load(Ordering::Acquire);
    let mut out = BytesMut::new();
    WorkerBound::HelloAck {
        server_version: PROTOCOL_VERSION,
        next_seq: next,
    }
    .encode(&mut out);
    if s.write_all(&out).await.is_err() {
        control::release_connection(&sh, slot, gen);
        return;
    }
    out.clear();
    rd.authenticated(sh.settings.limits.max_frame_bytes);
    let ctx = Session {
        core: core.clone(),
        conn: &conn,
        cells,
        slot,
        gen,
        worker_id: &worker_id,
    };
    let next = Box::pin(events(ctx, s, rd, out, next)).await;
    // A removed or re-registered worker's cells belong to its new identity now.
    if cells.gen.load(Ordering::Acquire) == gen {
        cells.next_seq.store(next, Ordering::Release);
    }
    control::release_connection(&sh, slot, gen);
}

/// What the event loop of one authenticated connection works with.
struct Session<'a> {
    core: Rc<Core>,
    conn: &'a Slot,
    cells: &'a crate::service::runtime::shared::WorkerCells,
    slot: crate::types::WorkerSlot,
    gen: u64,
    worker_id: &'a str,
}

/// The event loop; returns the next expected sequence number when the connection ends.
/// The connection's slot is idle while it waits for the worker (displaceable once the
/// worker has been silent for `heartbeat_timeout_ms`, i.e. is no longer live).
async fn events(
    ctx: Session<'_>,
    mut s: TcpStream,
    mut rd: FramedReader,
    mut out: BytesMut,
    mut next: u64,
) -> u64 {
    let Session {
        core,
        conn,
        cells,
        slot,
        gen,
        worker_id,
    } = ctx;
    let sh = &core.shared;
    let mut resync_asked = false;
    let mut heard_ms = sh.now_ms();
    // Frames that arrived in the same read as the `Hello` are applied before the next
    // read (a worker may send `Hello` and its first events in one write).
    let mut carried = rd.pending() > 0;
    'conn: loop {
        if !std::mem::take(&mut carried) {
            conn.idle(heard_ms, sh.settings.heartbeat_timeout_ms);
            let read = read_for(&mut rd, &mut s, conn, None).await;
            conn.busy();
            match read {
                Err(_) => {
                    if rd.pending() > 0 {
                        sh.metrics.protocol_error("cut_mid_frame");
                    }
                    break;
                }
                // A full read: the publisher is ahead of us; let the other connections'
                // I/O be polled before the next one (see `conn::yield_to_poll`).
                Ok(n) if n == READ_CHUNK => yield_to_poll().await,
                Ok(_) => {}
            }
        }
        heard_ms = sh.now_ms();
        if cells.gen.load(Ordering::Acquire) != gen {
            send_error(
                &mut s,
                ErrorCode::Conflict,
                "worker was removed or re-registered".into(),
            )
            .await;
            break;
        }
        cells.last_seen_ms.store(sh.now_ms(), Ordering::Release);
        // `--cluster`: records of this worker were dropped (publish buffer full), so
        // the peers' view of it is stale; a re-announce republishes all of it.
        if crate::service::runtime::cluster_hooks::take_lost(sh, slot) && !resync_asked {
            resync_asked = true;
            WorkerBound::Resync {
                reason: resync_reason::SEQUENCE_GAP,
            }
            .encode(&mut out);
        }
        let mut batch = Batch::default();
        let mut full = Vec::new();
        loop {
            // Full batches go out before the next frame is decoded, so `full` is
            // empty wherever the loop is left and `batch` alone holds the rest.
            for ops in full.drain(..) {
                control::index_ops(&core, slot, gen, ops).await;
            }
            // Framing and message errors alike leave the stream unrecoverable.
            let decoded = rd
                .next_frame()
                .and_then(|f| f.map(|f| EventMsg::decode(&f)).transpose());
            let msg = match decoded {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    sh.metrics.protocol_error(error_kind(&e));
                    log(&format!("worker {worker_id:?}: {e}; closing"));
                    control::index_ops(&core, slot, gen, batch.take()).await;
                    let code = e.error_code(&crate::codec::kind::WORKER_BOUND);
                    send_error(&mut s, code, e.to_string()).await;
                    break 'conn;
                }
            };
            let Some(seq) = msg.seq() else {
                sh.metrics.protocol_error("second_hello");
                control::index_ops(&core, slot, gen, batch.take()).await;
                send_error(
                    &mut s,
                    ErrorCode::ProtocolViolation,
                    "Hello after handshake".into(),
                )
                .await;
                break 'conn;
            };
            if seq < next {
                sh.metrics.protocol_error("stale_sequence");
                continue;
            }
            if seq > next {
                sh.metrics.sequence_gaps.inc();
                cells.suspect.store(true, Ordering::Release);
                if !resync_asked {
                    resync_asked = true;
                    WorkerBound::Resync {
                        reason: resync_reason::SEQUENCE_GAP,
                    }
                    .encode(&mut out);
                }
            }
            next = seq + 1;
            match msg {
                EventMsg::Stored { tier, hashes, .. } => {
                    sh.metrics.event("stored", 1);
                    batch.add_wire(hashes, |hashes| IndexOp::Stored { tier, hashes }, &mut full);
                }
                EventMsg::Removed { tier, hashes, .. } => {
                    sh.metrics.event("removed", 1);
                    batch.add_wire(
                        hashes,
                        |hashes| IndexOp::Removed { tier, hashes },
                        &mut full,
                    );
                }
                EventMsg::Cleared { tier, .. } => {
                    sh.metrics.event("cleared", 1);
                    batch.push(IndexOp::Cleared { tier });
                }
                EventMsg::Heartbeat { .. } => sh.metrics.event("heartbeat", 1),
                EventMsg::ResyncBegin { .. } => {
                    sh.metrics.event("resync_begin", 1);
                    batch.push(IndexOp::Cleared { tier: None });
                }
                EventMsg::ResyncEnd { .. } => {
                    sh.metrics.event("resync_end", 1);
                    control::index_ops(&core, slot, gen, batch.take()).await;
                    cells.suspect.store(false, Ordering::Release);
                    resync_asked = false;
                }
                EventMsg::Hello(_) => {}
            }
        }
        cells.next_seq.store(next, Ordering::Release);
        control::index_ops(&core, slot, gen, batch.take()).await;
        if !out.is_empty() {
            if s.write_all(&out).await.is_err() {
                break;
            }
            out.clear();
        }
    }
    next
}
