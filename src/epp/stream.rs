//! One ext_proc stream (one HTTP request through the gateway), sans I/O: the messages
//! the gateway sends go in ([`Stream::on_message`]), and what to do comes out
//! ([`Out`]): responses to send, the request to route, lifecycle signals, refusals.
//! The driver (`server`) routes a [`Route`] with the picker and hands the answer back
//! ([`Stream::on_pick`]); the end of the stream, clean or not, is
//! [`Stream::on_close`].
//!
//! Request phase. The body of `/v1/completions` and `/v1/chat/completions` is read
//! whole (within `max_body_bytes`, checked before each chunk is kept) and parsed by
//! the proxy's parser, then routed; the pick goes out where the gateway still applies
//! it, by body mode (`protocol_config` of the first message; `FULL_DUPLEX_STREAMED`,
//! the inference gateways' mode, when absent):
//! - `FULL_DUPLEX_STREAMED`, or `STREAMED` with `send_body_without_waiting_for_header_response`:
//!   the request headers response is held until the body is complete, then sent with
//!   the pick, followed by the body (full duplex: handed back in chunks of at most
//!   64 KiB; streamed: one "continue" per chunk received) and the trailers' answer;
//! - `BUFFERED`: headers are answered at once, the pick rides on the body's answer;
//! - `NONE`, or `STREAMED` waiting for the headers response: the pick could not reach
//!   the gateway in time; refused with a 500 saying which setting to change.
//!
//! Other paths (`/v1/models`, ...) and requests without a body are routed by load at
//! the request headers, and their body (if any) passes through.
//!
//! Response phase: response headers → `Admitted` (with the endpoint the gateway says
//! served it); body chunks → `FirstToken` / `Progress` through the proxy's own
//! lifecycle reader (`proxy::track::Tracker`, SSE or JSON); end of stream or
//! trailers → `Finish(Ok)`. A stream that ends before that → `Finish(Cut)`.
//!
//! Guarantees: for a routed request `Finish` comes exactly once and nothing after it;
//! every message gets exactly one answer (until an immediate response ends the
//! exchange; in observability mode none); nothing is buffered past the limits; no
//! input panics (checked by the `epp_stream` fuzz target).

use super::pick::{Life, NoPick, Outcome, Pick};
use super::reply::{self, Side};
use super::subset::Subset;
use crate::proxy::request::Endpoint;
use crate::proxy::track::Tracker;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};

pub use super::route::Route;

/// The stream's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_header_count: usize,
    pub max_header_bytes: usize,
}

/// How the gateway sends a body (`ProcessingMode.BodySendMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyMode {
    None,
    Streamed,
    Buffered,
    BufferedPartial,
    FullDuplex,
    Other(i32),
}

impl BodyMode {
    pub fn from_i32(v: i32) -> BodyMode {
        match v {
            0 => BodyMode::None,
            1 => BodyMode::Streamed,
            2 => BodyMode::Buffered,
            3 => BodyMode::BufferedPartial,
            4 => BodyMode::FullDuplex,
            n => BodyMode::Other(n),
        }
    }
}

/// A gRPC status ending the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fail {
    pub code: FailCode,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailCode {
    /// A message that makes no sense here (order, missing content).
    InvalidArgument,
    /// A message that came while the stream was not ready for one.
    FailedPrecondition,
}

/// What the driver does next, in order.
#[derive(Debug, PartialEq)]
pub enum Out {
    Send(ProcessingResponse),
    /// Route this with the picker, then call [`Stream::on_pick`].
    Route(Route),
    /// A lifecycle signal for the picker's request id.
    Life(String, Life),
    /// A request refused (for the metrics): its kind.
    Refused(&'static str),
    /// End the stream with this status.
    Fail(Fail),
}

/// How the held answers go out once the pick is known.
#[derive(Clone, Debug, PartialEq)]
enum Deliver {
    /// As the request headers' answer (nothing else pending).
    Headers,
    /// As the request headers' answer, then the body and the trailers' answer.
    HeldBody {
        body: Vec<u8>,
        chunks: u32,
        end_of_stream: bool,
        trailers: bool,
    },
    /// As the buffered body's answer (headers already answered).
    BufferedBody,
}

#[derive(Debug)]
enum Phase {
    Start,
    /// Collecting the body; `answered`: the request headers were answered already.
    Body {
        endpoint: Endpoint,
        subset: Option<Subset>,
        client_id: String,
        buf: Vec<u8>,
        chunks: u32,
        answered: bool,
    },
    Picking(Deliver),
    Routed(Box<Routed>),
    /// Refused (immediate response sent) or failed: the rest is ignored.
    Done,
}

#[derive(Debug)]
struct Routed {
    pick: Pick,
    tracker: Option<Tracker>,
    finished: bool,
}

/// The state of one ext_proc stream.
#[derive(Debug)]
pub struct Stream {
    limits: Limits,
    phase: Phase,
    /// From the first message's `protocol_config`.
    request_mode: BodyMode,
    response_mode: BodyMode,
    body_without_waiting: bool,
    observe_only: bool,
    /// Client ids generated for requests without a usable `x-request-id`.
    id_seed: u64,
}

fn fail(code: FailCode, message: impl Into<String>) -> Out {
    Out::Fail(Fail {
        code,
        message: message.into(),
    })
}

impl Stream {
    /// `id_seed`: makes generated client ids unique (e.g. a random number per stream).
    pub fn new(limits: Limits, id_seed: u64) -> Stream {
        Stream {
            limits,
            phase: Phase::Start,
            request_mode: BodyMode::FullDuplex,
            response_mode: BodyMode::FullDuplex,
            body_without_waiting: false,
            observe_only: false,
            id_seed,
        }
    }

    /// The pick, once routed.
    pub fn pick(&self) -> Option<&Pick> {
        match &self.phase {
            Phase::Routed(r) => Some(&r.pick),
            _ => None,
        }
    }

    /// Whether a `Route` is waiting for [`Stream::on_pick`].
    pub fn picking(&self) -> bool {
        matches!(self.phase, Phase::Picking(_))
    }

    pub fn on_message(&mut self, msg: ProcessingRequest) -> Vec<Out> {
        let mut out = Vec::new();
        self.observe_only = msg.observability_mode;
        if let Some(pc) = msg.protocol_config {
            self.request_mode = BodyMode::from_i32(pc.request_body_mode);
            self.response_mode = BodyMode::from_i32(pc.response_body_mode);
            self.body_without_waiting = pc.send_body_without_waiting_for_header_response;
        }
        let md = msg.metadata_context.as_ref();
        match msg.request {
            None => self.protocol_error(
                FailCode::InvalidArgument,
                "a message with no request",
                &mut out,
            ),
            Some(Request::RequestHeaders(h)) => self.request_headers(h, md, &mut out),
            Some(Request::RequestBody(b)) => self.request_body(b, &mut out),
            Some(Request::RequestTrailers(_)) => self.request_trailers(&mut out),
            Some(Request::ResponseHeaders(h)) => self.response_headers(h, md, &mut out),
            Some(Request::ResponseBody(b)) => self.response_body(b, &mut out),
            Some(Request::ResponseTrailers(_)) => self.response_trailers(&mut out),
        }
        if self.observe_only {
            out.retain(|o| !matches!(o, Out::Send(_)));
        }
        out
    }

    /// The picker's answer to the last [`Out::Route`].
    pub fn on_pick(&mut self, result: Result<Pick, NoPick>) -> Vec<Out> {
        let mut out = Vec::new();
        let deliver = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Picking(d) => d,
            other => {
                self.phase = other;
                return out;
            }
        };
        let pick = match result {
            Ok(p) => p,
            Err(no) => {
                let (status, kind, code) = no.shape();
                out.push(Out::Refused(no.kind()));
                out.push(Out::Send(reply::immediate(
                    status,
                    kind,
                    code,
                    no.message(),
                )));
                return self.observed(out);
            }
        };
        match deliver {
            Deliver::Headers => out.push(Out::Send(reply::routed(&pick, false))),
            Deliver::BufferedBody => out.push(Out::Send(reply::routed(&pick, true))),
            Deliver::HeldBody {
                body,
                chunks,
                end_of_stream,
                trailers,
            } => {
                out.push(Out::Send(reply::routed(&pick, false)));
                if self.request_mode == BodyMode::FullDuplex {
                    push_streamed(&mut out, Side::Request, body, end_of_stream);
                } else {
                    for _ in 0..chunks {
                        out.push(Out::Send(reply::body_continue(Side::Request)));
                    }
                }
                if trailers {
                    out.push(Out::Send(reply::trailers_continue(Side::Request)));
                }
            }
        }
        self.phase = Phase::Routed(Box::new(Routed {
            pick,
            tracker: None,
            finished: false,
        }));
        self.observed(out)
    }

    /// The stream ended (`Ok(())` cleanly, or reset): a routed request not yet
    /// finished is finished as cut.
    pub fn on_close(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        self.finish(Outcome::Cut, &mut out);
        self.phase = Phase::Done;
        out
    }

    fn observed(&self, mut out: Vec<Out>) -> Vec<Out> {
        if self.observe_only {
            out.retain(|o| !matches!(o, Out::Send(_)));
        }
        out
    }

    /// A protocol error: the routed request (if any) is finished, the stream fails.
    fn protocol_error(&mut self, code: FailCode, message: &str, out: &mut Vec<Out>) {
        self.finish(Outcome::Refused, out);
        self.phase = Phase::Done;
        out.push(Out::Refused("protocol"));
        out.push(fail(code, message));
    }

    /// A refusal to the client (immediate response): the exchange is over.
    fn refuse(
        &mut self,
        kind: &'static str,
        (status, err_type, code): (u16, &str, &str),
        message: &str,
        out: &mut Vec<Out>,
    ) {
        self.finish(Outcome::Refused, out);
        self.phase = Phase::Done;
        out.push(Out::Refused(kind));
        out.push(Out::Send(reply::immediate(status, err_type, code, message)));
    }

    /// `Finish(outcome)` for a routed request not yet finished.
    fn finish(&mut self, outcome: Outcome, out: &mut Vec<Out>) {
        if let Phase::Routed(r) = &mut self.phase {
            if !r.finished {
                r.finished = true;
                out.push(Out::Life(r.pick.request_id.clone(), Life::Finish(outcome)));
            }
        }
    }
}

/// `body` handed back in chunks of at most `reply::MAX_STREAMED_CHUNK`; the last one
/// carries `end_of_stream` (an empty body: one empty chunk when it ends the stream).
fn push_streamed(out: &mut Vec<Out>, side: Side, body: Vec<u8>, end_of_stream: bool) {
    if body.is_empty() {
        if end_of_stream {
            out.push(Out::Send(reply::body_streamed(side, Vec::new(), true)));
        }
        return;
    }
    if body.len() <= reply::MAX_STREAMED_CHUNK {
        out.push(Out::Send(reply::body_streamed(side, body, end_of_stream)));
        return;
    }
    let n = body.len().div_ceil(reply::MAX_STREAMED_CHUNK);
    for (i, c) in body.chunks(reply::MAX_STREAMED_CHUNK).enumerate() {
        let last = i + 1 == n;
        out.push(Out::Send(reply::body_streamed(
            side,
            c.to_vec(),
            end_of_stream && last,
        )));
    }
}

#[path = "stream_request.rs"]
mod request_phase;
#[path = "stream_response.rs"]
mod response_phase;

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "stream_props.rs"]
mod props;
