//! What the endpoint picker needs from routing: the one interface between the ext_proc
//! side (`stream`, `server`) and the request pipeline the proxy also drives (parse →
//! tokenize → route → lifecycle).
//!
//! [`Picker`] is implemented by the service (the routing handle) and, for tests, by
//! `fake::FakePicker`. The EPP hands it a request already parsed by the proxy's own
//! parser (`proxy::request::parse`), with the candidate workers the gateway allows;
//! the picker tokenizes it (`proxy::prompt`), routes it with the usual cost, and
//! answers with the endpoint (`ip:port`) of the chosen worker. Lifecycle signals come
//! back by the picker's request id, in order, each exactly once per request
//! ([`Life::Finish`] always last, whatever ended the stream).
//!
//! Guarantees of the contract: `pick` never blocks the caller's thread (it returns a
//! future); `life` and `endpoints` return at once (a picker queues what it cannot do
//! in place, bounded); a [`Pick`]'s endpoint is one of [`Picker::endpoints`]'.

use crate::proxy::request::{ClientRequest, Endpoint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// One worker as the gateway addresses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// The registry's worker id.
    pub worker: String,
    /// `host:port` of the worker's `url` (IPv6 as `[addr]:port`).
    pub endpoint: String,
}

/// A request to route, as the gateway sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct PickRequest {
    /// The OpenAI endpoint, when the path is one the proxy serves (`/v1/completions`,
    /// `/v1/chat/completions`); `None`: another path, routed by load only.
    pub endpoint: Option<Endpoint>,
    /// The body parsed by the proxy's parser (model, stream, `max_tokens`...); `None`
    /// for a request without a JSON body on another path.
    pub request: Option<ClientRequest>,
    /// Bytes of the request body (the load-only size estimate uses it).
    pub body_len: usize,
    /// The client's `x-request-id` (generated when absent or unusable), as the proxy
    /// propagates it.
    pub client_id: String,
    /// Worker ids the gateway allows (its subset hint, resolved against
    /// [`Picker::endpoints`]); `None`: every worker of the pool.
    pub allow: Option<Vec<String>>,
}

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    /// The picker's id for the routed request (lifecycle calls name it).
    pub request_id: String,
    pub worker: String,
    /// `ip:port` the gateway forwards to (header and metadata).
    pub endpoint: String,
    /// A disaggregated decision's prefill endpoint, for the decode worker's sidecar
    /// (`x-prefiller-host-port`, llm-d's convention); `None` for aggregated serving.
    pub prefill: Option<String>,
}

/// Why no endpoint was picked: the gateway answers the client with an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoPick {
    /// No eligible endpoint (none registered, none in the subset, all unhealthy): 503.
    NoEndpoint(String),
    /// Every eligible endpoint is at its limit, or the router is: 429.
    Busy(String),
    /// The request cannot be routed as sent (a prompt that does not tokenize): 400.
    BadRequest(String),
    /// The router failed: 500.
    Internal(String),
}

impl NoPick {
    /// HTTP status, OpenAI error `type` and `code` of the answer.
    pub fn shape(&self) -> (u16, &'static str, &'static str) {
        match self {
            NoPick::NoEndpoint(_) => (503, "service_unavailable", "no_upstream_worker"),
            NoPick::Busy(_) => (429, "rate_limit_exceeded", "workers_busy"),
            NoPick::BadRequest(_) => (400, "invalid_request_error", "invalid_prompt"),
            NoPick::Internal(_) => (500, "internal_error", "router_failed"),
        }
    }

    pub fn message(&self) -> &str {
        match self {
            NoPick::NoEndpoint(m) | NoPick::Busy(m) | NoPick::BadRequest(m) => m,
            NoPick::Internal(m) => m,
        }
    }

    /// The metric label of this outcome.
    pub fn kind(&self) -> &'static str {
        match self {
            NoPick::NoEndpoint(_) => "no_endpoint",
            NoPick::Busy(_) => "busy",
            NoPick::BadRequest(_) => "bad_prompt",
            NoPick::Internal(_) => "internal",
        }
    }
}

/// How a routed request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The response ended (end of stream, or trailers).
    Ok,
    /// The ext_proc stream ended before the response did: the client went away, the
    /// gateway reset the stream, or it gave up on the upstream.
    Cut,
    /// The EPP refused the stream after routing (protocol error, limit).
    Refused,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Cut => "cut",
            Outcome::Refused => "refused",
        }
    }
}

/// A lifecycle signal read off the response phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Life {
    /// Response headers came: the upstream accepted the request. `served`: the
    /// endpoint the gateway reports it used (`envoy.lb` /
    /// `x-gateway-destination-endpoint-served`), when it says.
    Admitted { status: u16, served: Option<String> },
    /// The first response chunk carrying output.
    FirstToken,
    /// Output tokens so far (usage when reported, else one per output choice).
    Progress(u32),
    /// The request is over; its load goes.
    Finish(Outcome),
}

pub type PickFuture = Pin<Box<dyn Future<Output = Result<Pick, NoPick>> + Send + 'static>>;

/// Routing, as the EPP uses it.
pub trait Picker: Send + Sync + 'static {
    /// Routes `req` (tokenize, cost, admit). The load it adds stays until
    /// `life(id, Life::Finish(_))`.
    fn pick(&self, req: PickRequest) -> PickFuture;
    /// A lifecycle signal for a request `pick` routed.
    fn life(&self, request_id: &str, life: Life);
    /// The workers the gateway can be sent to (those with a `url`).
    fn endpoints(&self) -> Arc<[EndpointInfo]>;
}
