//! Blocking clients of the two binary protocols, used by the tools and the tests.
//!
//! `EventPublisher` speaks the event protocol as a worker would (handshake, sequenced
//! events, heartbeats, resync); `RequestClient` speaks the request protocol as a
//! frontend would (route, lifecycle, admin), one request at a time or pipelined.
//! Plain `std::net` + the crate's codec: no runtime needed by callers.

use crate::codec::{
    self, CodecError, EventHello, EventMsg, FrameDecoder, LifecycleOp, Prompt, RequestMsg,
    ResponseMsg, WorkerBound,
};
use crate::engine::{CandidateOut, RouteDecision, RouteRequest};
use crate::types::{Tier, WorkerSpec};
use bytes::BytesMut;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Client-side failure.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    /// The router answered with an error frame.
    #[error("router error {code} ({name}): {message}")]
    Router {
        code: u16,
        name: &'static str,
        message: String,
    },
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    #[error("connection closed by the router")]
    Closed,
}

impl ClientError {
    fn router(code: u16, message: String) -> ClientError {
        let name = codec::ErrorCode::from_u16(code)
            .map(|c| c.name())
            .unwrap_or("unknown");
        ClientError::Router {
            code,
            name,
            message,
        }
    }

    /// The router's error code, if this is a router error.
    pub fn code(&self) -> Option<codec::ErrorCode> {
        match self {
            ClientError::Router { code, .. } => codec::ErrorCode::from_u16(*code),
            _ => None,
        }
    }
}

struct Framed {
    stream: TcpStream,
    buf: BytesMut,
    dec: FrameDecoder,
    out: BytesMut,
}

impl Framed {
    fn connect(addr: impl ToSocketAddrs) -> Result<Framed, ClientError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Framed {
            stream,
            buf: BytesMut::new(),
            dec: FrameDecoder::new(64 << 20),
            out: BytesMut::new(),
        })
    }

    fn flush(&mut self) -> Result<(), ClientError> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Next frame, blocking (or `None` on timeout when a read timeout is set).
    fn read_frame(&mut self) -> Result<Option<codec::Frame>, ClientError> {
        loop {
            if let Some(f) = self.dec.decode(&mut self.buf)? {
                return Ok(Some(f));
            }
            let mut tmp = [0u8; 64 << 10];
            match self.stream.read(&mut tmp) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// A worker's event connection.
pub struct EventPublisher {
    io: Framed,
    seq: u64,
    /// Resync requests received from the router and not yet handled.
    pub resync_requested: bool,
}

impl EventPublisher {
    /// Connects and performs the handshake; sequence numbers continue where the router
    /// expects them (`HelloAck.next_seq`).
    pub fn connect(
        addr: impl ToSocketAddrs,
        spec: WorkerSpec,
        auth_token: &str,
    ) -> Result<EventPublisher, ClientError> {
        let mut io = Framed::connect(addr)?;
        EventMsg::Hello(EventHello {
            auth_token: auth_token.to_string(),
            spec,
        })
        .try_encode(&mut io.out)?;
        io.flush()?;
        let f = io.read_frame()?.ok_or(ClientError::Closed)?;
        match WorkerBound::decode(&f)? {
            WorkerBound::HelloAck { next_seq, .. } => Ok(EventPublisher {
                io,
                seq: next_seq,
                resync_requested: false,
            }),
            WorkerBound::Error { code, message } => Err(ClientError::router(code, message)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Next sequence number to be used.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Skips sequence numbers (to test gap handling).
    pub fn skip_seq(&mut self, n: u64) {
        self.seq += n;
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq += 1;
        s
    }

    /// Queues a `Stored` event (sent on `flush`).
    pub fn stored(&mut self, tier: Tier, parent: Option<u64>, hashes: &[u64]) {
        let seq = self.next_seq();
        EventMsg::encode_stored(&mut self.io.out, seq, tier, parent, hashes);
    }

    pub fn removed(&mut self, tier: Tier, hashes: &[u64]) {
        let seq = self.next_seq();
        EventMsg::encode_removed(&mut self.io.out, seq, tier, hashes);
    }

    pub fn cleared(&mut self, tier: Option<Tier>) {
        let seq = self.next_seq();
        EventMsg::Cleared { seq, tier }.encode(&mut self.io.out);
    }

    pub fn heartbeat(
        &mut self,
        active_requests: u32,
        kv_used_blocks: u64,
        kv_capacity_blocks: u64,
    ) {
        let seq = self.next_seq();
        EventMsg::Heartbeat {
            seq,
            active_requests,
            waiting_requests: 0,
            kv_used_blocks,
            kv_capacity_blocks,
        }
        .encode(&mut self.io.out);
    }

    pub fn resync_begin(&mut self) {
        let seq = self.next_seq();
        EventMsg::ResyncBegin { seq }.encode(&mut self.io.out);
    }

    pub fn resync_end(&mut self) {
        let seq = self.next_seq();
        EventMsg::ResyncEnd { seq }.encode(&mut self.io.out);
        self.resync_requested = false;
    }

    /// Raw bytes (to test malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.io.flush()?;
        self.io.stream.write_all(bytes)?;
        Ok(())
    }

    /// Bytes queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.io.out.len()
    }

    pub fn flush(&mut self) -> Result<(), ClientError> {
        self.io.flush()
    }

    /// Reads router → worker frames available within `wait` (resync requests, errors).
    pub fn poll(&mut self, wait: Duration) -> Result<Option<WorkerBound>, ClientError> {
        self.io
            .stream
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        let r = self.io.read_frame();
        self.io.stream.set_read_timeout(None)?;
        match r? {
            None => Ok(None),
            Some(f) => {
                let m = WorkerBound::decode(&f)?;
                if matches!(m, WorkerBound::Resync { .. }) {
                    self.resync_requested = true;
                }
                Ok(Some(m))
            }
        }
    }
}

/// A frontend's request connection.
pub struct RequestClient {
    io: Framed,
    corr: u64,
}

fn to_wire_route(corr: u64, r: &RouteRequest) -> Result<codec::Route, ClientError> {
    let prompt = match (&r.tokens, &r.block_hashes) {
        (Some(t), None) => Prompt::from_tokens(t),
        (None, Some(h)) => Prompt::from_hashes(h),
        _ => {
            return Err(ClientError::Unexpected(
                "give exactly one of tokens / block_hashes".into(),
            ))
        }
    };
    let mut w = codec::Route::new(corr, r.request_id.clone(), prompt);
    w.model = r.model.clone().unwrap_or_default();
    w.mode = r.mode;
    w.explain = r.explain;
    w.input_tokens = r.input_tokens;
    w.expected_output_tokens = r.expected_output_tokens;
    w.allow = r.allow.clone();
    w.pin = r.pin.clone();
    w.dp = r.dp_rank.map(|d| d.bounds());
    w.tolerations = r.tolerations.clone().unwrap_or_default();
    w.lora_name = r.lora_name.clone();
    w.cache_salt = r.cache_salt.clone();
    Ok(w)
}

fn from_wire_decision(d: codec::Decision) -> RouteDecision {
    let fallback = match d.fallback {
        codec::Fallback::None => "none",
        codec::Fallback::NoPrefillWorkers => "no_prefill_workers",
        codec::Fallback::PrefillFilteredOut => "prefill_filtered_out",
        codec::Fallback::PrefillFailed => "prefill_failed",
    };
    let candidates = (!d.candidates.is_empty()).then(|| {
        d.candidates
            .into_iter()
            .map(|c| CandidateOut {
                worker: c.worker,
                stage: match c.stage {
                    codec::Stage::Aggregated => "aggregated",
                    codec::Stage::Prefill => "prefill",
                    codec::Stage::Decode => "decode",
                }
                .to_string(),
                prefill_blocks: c.prefill_blocks,
                overlap: c.overlap,
                adjusted_prefill: c.adjusted_prefill,
                decode_blocks: c.decode_blocks,
                cost: c.cost,
                // The binary protocol does not carry it (JSON explain only).
                speculative: 0,
            })
            .collect()
    });
    RouteDecision {
        request_id: d.request_id,
        decode_worker: d.decode_worker,
        prefill_worker: d.prefill_worker,
        dp_rank: d.dp_rank,
        overlap: d.overlap,
        cost: d.cost,
        fallback: fallback.to_string(),
        candidates,
        local_prefill: None,
        affinity: None,
    }
}

/// One answer of the request protocol.
#[derive(Debug)]
pub enum Answer {
    Decision(u64, RouteDecision),
    Ack(u64),
    Error(u64, ClientError),
}

impl RequestClient {
    pub fn connect(
        addr: impl ToSocketAddrs,
        auth_token: &str,
    ) -> Result<RequestClient, ClientError> {
        let mut io = Framed::connect(addr)?;
        RequestMsg::Hello {
            auth_token: auth_token.to_string(),
        }
        .try_encode(&mut io.out)?;
        io.flush()?;
        let f = io.read_frame()?.ok_or(ClientError::Closed)?;
        match ResponseMsg::decode(&f)? {
            ResponseMsg::HelloAck { .. } => Ok(RequestClient { io, corr: 1 }),
            ResponseMsg::Error { code, message, .. } => Err(ClientError::router(code, message)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    fn next_corr(&mut self) -> u64 {
        let c = self.corr;
        self.corr += 1;
        c
    }

    /// Queues a route request (pipelining); returns its correlation id.
    pub fn send_route(&mut self, r: &RouteRequest) -> Result<u64, ClientError> {
        let corr = self.next_corr();
        RequestMsg::Route(to_wire_route(corr, r)?).try_encode(&mut self.io.out)?;
        Ok(corr)
    }

    /// Queues a lifecycle call; returns its correlation id.
    pub fn send_lifecycle(
        &mut self,
        op: LifecycleOp,
        id: &str,
        output_tokens: u32,
    ) -> Result<u64, ClientError> {
        let corr = self.next_corr();
        RequestMsg::Lifecycle {
            corr,
            op,
            request_id: id.to_string(),
            output_tokens,
        }
        .try_encode(&mut self.io.out)?;
        Ok(corr)
    }

    pub fn flush(&mut self) -> Result<(), ClientError> {
        self.io.flush()
    }

    /// Receives the next answer (blocking).
    pub fn recv(&mut self) -> Result<Answer, ClientError> {
        let f = self.io.read_frame()?.ok_or(ClientError::Closed)?;
        Ok(match ResponseMsg::decode(&f)? {
            ResponseMsg::Decision(d) => Answer::Decision(d.corr, from_wire_decision(d)),
            ResponseMsg::Ack { corr } => Answer::Ack(corr),
            ResponseMsg::Error {
                corr,
                code,
                message,
            } => Answer::Error(corr, ClientError::router(code, message)),
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        })
    }

    fn call(&mut self) -> Result<Option<RouteDecision>, ClientError> {
        self.flush()?;
        match self.recv()? {
            Answer::Decision(_, d) => Ok(Some(d)),
            Answer::Ack(_) => Ok(None),
            Answer::Error(_, e) => Err(e),
        }
    }

    /// Routes one request.
    pub fn route(&mut self, r: &RouteRequest) -> Result<RouteDecision, ClientError> {
        self.send_route(r)?;
        self.call()?
            .ok_or_else(|| ClientError::Unexpected("ack instead of decision".into()))
    }

    pub fn first_token(&mut self, id: &str) -> Result<(), ClientError> {
        self.send_lifecycle(LifecycleOp::FirstToken, id, 0)?;
        self.call().map(|_| ())
    }

    pub fn progress(&mut self, id: &str, output_tokens: u32) -> Result<(), ClientError> {
        self.send_lifecycle(LifecycleOp::Progress, id, output_tokens)?;
        self.call().map(|_| ())
    }

    pub fn finish(&mut self, id: &str) -> Result<(), ClientError> {
        self.send_lifecycle(LifecycleOp::Finish, id, 0)?;
        self.call().map(|_| ())
    }

    /// Reports a prefill failure; answers with the decode-only decision.
    pub fn prefill_failed(&mut self, id: &str) -> Result<RouteDecision, ClientError> {
        self.send_lifecycle(LifecycleOp::PrefillFailed, id, 0)?;
        self.call()?
            .ok_or_else(|| ClientError::Unexpected("ack instead of decision".into()))
    }

    pub fn register(&mut self, spec: WorkerSpec) -> Result<(), ClientError> {
        let corr = self.next_corr();
        RequestMsg::Register { corr, spec }.try_encode(&mut self.io.out)?;
        self.call().map(|_| ())
    }

    pub fn deregister(&mut self, id: &str) -> Result<(), ClientError> {
        let corr = self.next_corr();
        RequestMsg::Deregister {
            corr,
            worker_id: id.to_string(),
        }
        .try_encode(&mut self.io.out)?;
        self.call().map(|_| ())
    }

    /// Raw bytes (to test malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.flush()?;
        self.io.stream.write_all(bytes)?;
        Ok(())
    }
}
