//! Binary request API connections (frontends ↔ router, port 7401).
//!
//! After `Hello`, the frames of one read are answered concurrently where that cannot
//! change an outcome (`batch`: never two frames about one request id, admin frames
//! alone), and all answers to one read are written back in a single write, in frame
//! order (pipelined clients get batched replies). Each answer carries
//! the request's correlation id. A frame that cannot be decoded closes the connection
//! with an `Error` (its correlation id is unknowable); request-level failures (unknown
//! worker, duplicate id, no eligible worker, overload…) are `Error` answers and the
//! connection goes on. The `Hello` token names the connection's principal
//! (`credentials`): the shared token, or one worker's own token, which may then only
//! `Register` / `Deregister` that worker (anything else answers `unauthorized`).
//!
//! A session that sends no complete frame for `api_idle_timeout_ms` while none of its
//! requests is being answered is closed; while its answers are being computed it is
//! busy and never idle (pipelined clients waiting for answers stay).

use crate::codec::{
    self, ErrorCode, LifecycleOp, Prompt, RequestMsg, ResponseMsg, PROTOCOL_VERSION,
};
use crate::credentials::Principal;
use crate::engine::{DpRankSpec, RouteDecision, RouteRequest};
use crate::registry::Origin;
use crate::service::api::batch;
use crate::service::net::conn::{
    error_kind, read_for, read_hello, yield_to_poll, FramedReader, Stop, READ_CHUNK,
};
use crate::service::net::conn_slot::Slot;
use crate::service::routing::control;
use crate::service::routing::errors;
use crate::service::routing::router::{self, ApiError};
use crate::service::runtime::core::Core;
use crate::service::runtime::msg::LifeOp;
use bytes::BytesMut;
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use std::rc::Rc;
use std::sync::atomic::Ordering;

/// Converts a wire route request into the API form.
pub fn to_route_request(r: codec::Route) -> RouteRequest {
    let (tokens, block_hashes) = match &r.prompt {
        Prompt::Tokens(t) => (Some(t.iter().collect()), None),
        Prompt::Hashes(h) => (None, Some(h.iter().collect())),
    };
    RouteRequest {
        request_id: r.request_id,
        model: (!r.model.is_empty()).then_some(r.model),
        tokens,
        block_hashes,
        input_tokens: r.input_tokens,
        expected_output_tokens: r.expected_output_tokens,
        allow: r.allow,
        pin: r.pin,
        dp_rank: r.dp.map(|(lo, hi)| DpRankSpec::Range([lo, hi])),
        tolerations: (!r.tolerations.is_empty()).then_some(r.tolerations),
        mode: r.mode,
        explain: r.explain,
        lora_name: r.lora_name,
        cache_salt: r.cache_salt,
        session: None,
    }
}

fn fallback(s: &str) -> codec::Fallback {
    match s {
        "no_prefill_workers" => codec::Fallback::NoPrefillWorkers,
        "prefill_filtered_out" => codec::Fallback::PrefillFilteredOut,
        "prefill_failed" => codec::Fallback::PrefillFailed,
        _ => codec::Fallback::None,
    }
}

fn stage(s: &str) -> codec::Stage {
    match s {
        "prefill" => codec::Stage::Prefill,
        "decode" => codec::Stage::Decode,
        _ => codec::Stage::Aggregated,
    }
}

/// Converts an API decision into its wire form.
pub fn to_wire(corr: u64, d: RouteDecision) -> codec::Decision {
    codec::Decision {
        corr,
        fallback: fallback(&d.fallback),
        candidates: d
            .candidates
            .unwrap_or_default()
            .into_iter()
            .map(|c| codec::Candidate {
                stage: stage(&c.stage),
                worker: c.worker,
                prefill_blocks: c.prefill_blocks,
                overlap: c.overlap,
                adjusted_prefill: c.adjusted_prefill,
                decode_blocks: c.decode_blocks,
                cost: c.cost,
            })
            .collect(),
        request_id: d.request_id,
        decode_worker: d.decode_worker,
        prefill_worker: d.prefill_worker,
        dp_rank: d.dp_rank,
        overlap: d.overlap,
        cost: d.cost,
    }
}

fn err(corr: u64, e: &ApiError) -> ResponseMsg {
    ResponseMsg::Error {
        corr,
        code: errors::code(e).as_u16(),
        message: e.to_string(),
    }
}

/// The `Error` answer to a frame the connection's credential does not allow.
fn forbidden(core: &Core, corr: u64, what: &str) -> ResponseMsg {
    core.shared.metrics.protocol_error("unauthorized");
    ResponseMsg::Error {
        corr,
        code: ErrorCode::Unauthorized.as_u16(),
        message: format!("this connection's token may not {what}"),
    }
}

async fn answer(
    core: &Core,
    who: &Principal,
    msg: RequestMsg,
) -> Result<ResponseMsg, &'static str> {
    let creds = &core.shared.creds;
    // A worker token may only register or remove its own worker (`credentials`).
    match (&msg, who) {
        (RequestMsg::Route(r), Principal::Worker(_)) => {
            return Ok(forbidden(core, r.corr, "route"))
        }
        (RequestMsg::Lifecycle { corr, .. }, Principal::Worker(_)) => {
            return Ok(forbidden(core, *corr, "report request lifecycle"))
        }
        (RequestMsg::Register { corr, spec }, _) if !creds.principal_may_act_on(who, &spec.id) => {
            return Ok(forbidden(
                core,
                *corr,
                &format!("register worker {:?}", spec.id),
            ))
        }
        (RequestMsg::Deregister { corr, worker_id }, _)
            if !creds.principal_may_act_on(who, worker_id) =>
        {
            return Ok(forbidden(
                core,
                *corr,
                &format!("remove worker {worker_id:?}"),
            ))
        }
        _ => {}
    }
    Ok(match msg {
        RequestMsg::Hello { .. } => return Err("second_hello"),
        RequestMsg::Route(r) => {
            let corr = r.corr;
            match router::route(core, &to_route_request(r)).await {
                Ok(d) => ResponseMsg::Decision(to_wire(corr, d)),
                Err(e) => err(corr, &e),
            }
        }
        RequestMsg::Lifecycle {
            corr,
            op,
            request_id,
            output_tokens,
        } => {
            let op = match op {
                LifecycleOp::FirstToken => LifeOp::FirstToken,
                LifecycleOp::Progress => LifeOp::Progress(output_tokens),
                LifecycleOp::Finish => LifeOp::Finish,
                LifecycleOp::PrefillFailed => LifeOp::PrefillFailed,
            };
            match router::lifecycle(core, op, &request_id).await {
                Ok(Some(d)) => ResponseMsg::Decision(to_wire(corr, d)),
                Ok(None) => ResponseMsg::Ack { corr },
                Err(e) => err(corr, &e),
            }
        }
        RequestMsg::Register { corr, spec } => {
            match control::register(core, spec, Origin::Admin).await {
                Ok(_) => ResponseMsg::Ack { corr },
                Err(e) => err(corr, &e),
            }
        }
        RequestMsg::Deregister { corr, worker_id } => {
            match control::deregister(core, &worker_id).await {
                Ok(()) => ResponseMsg::Ack { corr },
                Err(e) => err(corr, &e),
            }
        }
    })
}

/// What orders a frame among the frames of one read (`batch::segments`): the hash of
/// its request id, or `None` for frames that must run alone.
fn order_key(m: &RequestMsg) -> Option<u64> {
    let id = match m {
        RequestMsg::Route(r) => &r.request_id,
        RequestMsg::Lifecycle { request_id, .. } => request_id,
        RequestMsg::Hello { .. } | RequestMsg::Register { .. } | RequestMsg::Deregister { .. } => {
            return None
        }
    };
    Some(xxhash_rust::xxh3::xxh3_64(id.as_bytes()))
}

/// A session's per-read buffers, kept across reads so that answering a read allocates
/// nothing for its bookkeeping (decoded frames, their order keys, segment ends).
#[derive(Default)]
struct ReadBatch {
    msgs: Vec<RequestMsg>,
    keys: Vec<Option<u64>>,
    ends: Vec<usize>,
    seen: Vec<u64>,
}

impl ReadBatch {
    /// Frames kept room for between reads; a read of more (a burst of tiny frames)
    /// gives the extra memory back afterwards.
    const KEEP: usize = 64;

    fn trim(&mut self) {
        self.msgs.clear();
        if self.msgs.capacity() > Self::KEEP {
            self.msgs.shrink_to(Self::KEEP);
            self.keys.shrink_to(Self::KEEP);
            self.ends.shrink_to(Self::KEEP);
            self.seen.shrink_to(Self::KEEP);
        }
    }
}

/// Answers the frames of one read (`rb.msgs`) into `out`, in frame order, running
/// independent frames concurrently (`batch`). Stops at the first protocol violation.
async fn answer_all(
    core: &Core,
    who: &Principal,
    rb: &mut ReadBatch,
    out: &mut BytesMut,
) -> Result<(), &'static str> {
    let sh = &core.shared;
    rb.keys.clear();
    rb.keys.extend(rb.msgs.iter().map(order_key));
    batch::segments_into(&rb.keys, &mut rb.ends, &mut rb.seen);
    let mut msgs = rb.msgs.drain(..);
    let mut start = 0usize;
    for &end in &rb.ends {
        let n = end - start;
        start = end;
        sh.inflight.fetch_add(n, Ordering::SeqCst);
        // One or two frames (a route and the previous request's finish) are the
        // common read: answered without allocating.
        let mut one = None;
        let mut two = None;
        let mut more = Vec::new();
        match (n, msgs.next(), (n >= 2).then(|| msgs.next()).flatten()) {
            (_, None, _) => {}
            (1, Some(a), _) => one = Some(answer(core, who, a).await),
            (2, Some(a), Some(b)) => {
                two = Some(batch::join_two(answer(core, who, a), answer(core, who, b)).await)
            }
            (_, Some(a), b) => {
                let rest = msgs.by_ref().take(n.saturating_sub(2));
                let futs = [Some(a), b]
                    .into_iter()
                    .flatten()
                    .chain(rest)
                    .map(|m| answer(core, who, m))
                    .collect();
                more = batch::join_all(futs).await;
            }
        }
        sh.inflight.fetch_sub(n, Ordering::SeqCst);
        for a in one.into_iter().chain(two.into_iter().flatten()).chain(more) {
            a?.encode(out);
        }
    }
    Ok(())
}

async fn fatal(s: &mut TcpStream, out: &mut BytesMut, code: ErrorCode, message: String) {
    ResponseMsg::Error {
        corr: 0,
        code: code.as_u16(),
        message,
    }
    .encode(out);
    let _ = s.write_all(out).await;
    let _ = s.flush().await;
}

/// One request-API connection. Until its `Hello` is read it holds only a small reader
/// (`FramedReader::preauth`), and no more than `hello_timeout_ms`; the session that
/// follows is boxed, so its larger state is allocated only once authenticated.
pub async fn serve(core: Rc<Core>, mut s: TcpStream, slot: Rc<Slot>) {
    let sh = core.shared.clone();
    let mut rd = FramedReader::preauth(sh.settings.limits.max_hello_bytes);
    let mut out = BytesMut::new();
    let limit = std::time::Duration::from_millis(sh.settings.hello_timeout_ms);
    let first = match read_hello(&mut rd, &mut s, &slot, limit).await {
        Ok(f) => f,
        // Told to make room (`slots`): already counted at the accept.
        Err("preauth_displaced") => return,
        Err(kind) => {
            sh.metrics.protocol_error(kind);
            let code = errors::hello_failure(kind);
            fatal(
                &mut s,
                &mut out,
                code,
                format!("no valid first frame ({kind})"),
            )
            .await;
            return;
        }
    };
    slot.busy();
    // The shared token (frontends, admins) or one worker's own token (`credentials`).
    let who = match RequestMsg::decode(&first) {
        Ok(RequestMsg::Hello { auth_token }) => match sh.creds.principal(&auth_token) {
            Some(p) => p,
            None => {
                sh.metrics.protocol_error("unauthorized");
                ResponseMsg::Error {
                    corr: 0,
                    code: ErrorCode::Unauthorized.as_u16(),
                    message: "wrong or missing auth token".into(),
                }
                .encode(&mut out);
                let _ = s.write_all(&out).await;
                return;
            }
        },
        Ok(_) => {
            sh.metrics.protocol_error("no_hello");
            let code = ErrorCode::ProtocolViolation;
            fatal(&mut s, &mut out, code, "first frame must be Hello".into()).await;
            return;
        }
        Err(e) => {
            sh.metrics.protocol_error(error_kind(&e));
            let code = e.error_code(&codec::kind::RESPONSES);
            fatal(&mut s, &mut out, code, format!("bad hello: {e}")).await;
            return;
        }
    };
    ResponseMsg::HelloAck {
        server_version: PROTOCOL_VERSION,
    }
    .encode(&mut out);
    if s.write_all(&out).await.is_err() {
        return;
    }
    Box::pin(session(core, s, slot, rd, who)).await
}

/// An authenticated session: full-size reads, answers, and the idle timeout.
async fn session(
    core: Rc<Core>,
    mut s: TcpStream,
    slot: Rc<Slot>,
    mut rd: FramedReader,
    who: Principal,
) {
    let sh = core.shared.clone();
    let mut out = BytesMut::new();
    let mut rb = ReadBatch::default();
    rd.authenticated(sh.settings.limits.max_frame_bytes);
    let idle_limit = sh.settings.api_idle_timeout_ms;
    // The session's idle clock: reset by every complete frame, not by stray bytes, so
    // a frame trickled in byte by byte does not keep an idle session alive.
    let mut idle_since = sh.now_ms();
    let mut answered = true;
    // Frames that arrived in the same read as the `Hello` (a frontend may send `Hello`
    // and its first requests in one write) are answered before the next read.
    let mut carried = rd.pending() > 0;
    loop {
        out.clear();
        if answered || rd.pending() == 0 {
            idle_since = sh.now_ms();
        }
        if !std::mem::take(&mut carried) {
            slot.idle(idle_since, 0);
            let left = idle_limit.saturating_sub(sh.now_ms().saturating_sub(idle_since));
            let left = std::time::Duration::from_millis(left);
            let read = read_for(&mut rd, &mut s, &slot, Some(left)).await;
            slot.busy();
            match read {
                Err(stop) => {
                    match stop {
                        Stop::TimedOut => sh.metrics.protocol_error("api_idle_timeout"),
                        Stop::Closed if rd.pending() > 0 => {
                            sh.metrics.protocol_error("cut_mid_frame")
                        }
                        _ => {}
                    }
                    return;
                }
                // A client pipelining faster than we answer: keep the others served.
                Ok(n) if n == READ_CHUNK => yield_to_poll().await,
                Ok(_) => {}
            }
        }
        // Every complete frame of this read; a bad frame ends the connection after the
        // frames before it are answered.
        let mut bad = None;
        loop {
            match rd.next_frame().map(|f| f.map(|f| RequestMsg::decode(&f))) {
                Ok(None) => break,
                Ok(Some(Ok(m))) => rb.msgs.push(m),
                Ok(Some(Err(e))) | Err(e) => {
                    bad = Some(e);
                    break;
                }
            }
        }
        answered = !rb.msgs.is_empty();
        let all = answer_all(&core, &who, &mut rb, &mut out).await;
        rb.trim();
        if let Err(kind) = all {
            sh.metrics.protocol_error(kind);
            let code = ErrorCode::ProtocolViolation;
            fatal(&mut s, &mut out, code, "Hello after handshake".into()).await;
            return;
        }
        if let Some(e) = bad {
            sh.metrics.protocol_error(error_kind(&e));
            eprintln!("kvroute: api: {e}; closing connection");
            let code = e.error_code(&codec::kind::RESPONSES);
            fatal(&mut s, &mut out, code, e.to_string()).await;
            return;
        }
        if !out.is_empty() && s.write_all(&out).await.is_err() {
            return;
        }
    }
}
