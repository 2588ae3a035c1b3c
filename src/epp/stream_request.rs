//! The request phase of [`Stream`]: headers, body, trailers (see the parent module).

use super::{push_streamed, BodyMode, Deliver, FailCode, Out, Phase, Route, Stream};
use crate::epp::headers;
use crate::epp::pick::PickRequest;
use crate::epp::reply::{self, Side};
use crate::epp::subset;
use crate::proxy::request;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders};

const BAD_REQUEST: (u16, &str, &str) = (400, "invalid_request_error", "invalid_json");

impl Stream {
    pub(super) fn request_headers(
        &mut self,
        h: HttpHeaders,
        md: Option<&Metadata>,
        out: &mut Vec<Out>,
    ) {
        match self.phase {
            Phase::Start => {}
            Phase::Done => return,
            _ => {
                let m = "request headers came twice";
                return self.protocol_error(FailCode::InvalidArgument, m, out);
            }
        }
        let l = self.limits;
        let head = match headers::read(h.headers.as_ref(), l.max_header_count, l.max_header_bytes) {
            Ok(head) => head,
            Err(e) => {
                let shape = (431, "invalid_request_error", "headers_too_large");
                return self.refuse("headers_too_large", shape, &e.0, out);
            }
        };
        let subset = match subset::from_metadata(md) {
            Ok(s) => s,
            Err(e) => {
                let shape = (503, "service_unavailable", "bad_subset_hint");
                let m = format!("unreadable subset hint from the gateway: {}", e.0);
                return self.refuse("bad_subset", shape, &m, out);
            }
        };
        let seed = self.id_seed;
        let client_id =
            request::client_request_id(head.request_id.as_deref(), || format!("kvr-{seed:016x}"));
        let Some(endpoint) = head.endpoint() else {
            // Not an inference request: routed by load now, its body passes through.
            let request = PickRequest {
                endpoint: None,
                request: None,
                body_len: head.content_length.unwrap_or(0) as usize,
                client_id,
                allow: None,
            };
            out.push(Out::Route(Route { request, subset }));
            self.phase = Phase::Picking(Deliver::Headers);
            return;
        };
        if head.is_json() == Some(false) {
            let shape = (415, "invalid_request_error", "unsupported_media_type");
            let m = format!(
                "content-type {:?}: the body must be application/json",
                head.content_type.as_deref().unwrap_or_default()
            );
            return self.refuse("bad_content_type", shape, &m, out);
        }
        if h.end_of_stream {
            let m = format!("{} needs a JSON body", head.path);
            return self.refuse("missing_body", BAD_REQUEST, &m, out);
        }
        if head
            .content_length
            .is_some_and(|n| n > l.max_body_bytes as u64)
        {
            return self.too_large(out);
        }
        let answered = match (self.request_mode, self.body_without_waiting) {
            (BodyMode::FullDuplex, _) | (BodyMode::Streamed, true) => false,
            (BodyMode::Buffered | BodyMode::BufferedPartial, _) => {
                out.push(Out::Send(reply::headers_continue(Side::Request)));
                true
            }
            (mode, _) => {
                let shape = (500, "internal_error", "gateway_body_mode");
                let m = format!(
                    "the gateway's ext_proc request_body_mode ({mode:?}, body without waiting: {}) \
                     cannot carry a pick made from the body: use FULL_DUPLEX_STREAMED \
                     (or BUFFERED)",
                    self.body_without_waiting
                );
                return self.refuse("gateway_mode", shape, &m, out);
            }
        };
        self.phase = Phase::Body {
            endpoint,
            subset,
            client_id,
            buf: Vec::new(),
            chunks: 0,
            answered,
        };
    }

    fn too_large(&mut self, out: &mut Vec<Out>) {
        let shape = (413, "invalid_request_error", "request_too_large");
        let m = format!(
            "request body larger than {} bytes",
            self.limits.max_body_bytes
        );
        self.refuse("too_large", shape, &m, out);
    }

    pub(super) fn request_body(&mut self, b: HttpBody, out: &mut Vec<Out>) {
        match &mut self.phase {
            Phase::Body { buf, chunks, .. } => {
                if buf.len().saturating_add(b.body.len()) > self.limits.max_body_bytes {
                    return self.too_large(out);
                }
                buf.extend_from_slice(&b.body);
                *chunks = chunks.saturating_add(1);
            }
            Phase::Routed(_) => {
                // A body passing through a request routed at its headers.
                return match self.request_mode {
                    BodyMode::FullDuplex => {
                        push_streamed(out, Side::Request, b.body, b.end_of_stream)
                    }
                    _ => out.push(Out::Send(reply::body_continue(Side::Request))),
                };
            }
            Phase::Done => return,
            Phase::Start | Phase::Picking(_) => {
                let m = "request body before the request headers were answered";
                return self.protocol_error(FailCode::FailedPrecondition, m, out);
            }
        }
        match self.request_mode {
            // The whole body (as much as the gateway buffers) in this one message.
            BodyMode::Buffered => self.body_complete(true, false, out),
            BodyMode::BufferedPartial if !b.end_of_stream => {
                // Cut at the gateway's buffer limit: not a whole request.
                self.too_large(out)
            }
            _ if b.end_of_stream => self.body_complete(true, false, out),
            _ => {}
        }
    }

    pub(super) fn request_trailers(&mut self, out: &mut Vec<Out>) {
        match self.phase {
            Phase::Body { .. } => self.body_complete(false, true, out),
            Phase::Routed(_) => out.push(Out::Send(reply::trailers_continue(Side::Request))),
            Phase::Done => {}
            Phase::Start | Phase::Picking(_) => {
                let m = "request trailers before the request headers were answered";
                self.protocol_error(FailCode::FailedPrecondition, m, out)
            }
        }
    }

    /// The whole body is in: parse it and ask for the route.
    fn body_complete(&mut self, end_of_stream: bool, trailers: bool, out: &mut Vec<Out>) {
        let Phase::Body {
            endpoint,
            subset,
            client_id,
            buf,
            chunks,
            answered,
        } = std::mem::replace(&mut self.phase, Phase::Done)
        else {
            return;
        };
        if buf.is_empty() {
            let m = "the request body is empty".to_string();
            return self.refuse("missing_body", BAD_REQUEST, &m, out);
        }
        let creq = match request::parse(buf.as_slice()) {
            Ok(c) => c,
            Err(e) => return self.refuse("bad_request", BAD_REQUEST, &e.0, out),
        };
        let request = PickRequest {
            endpoint: Some(endpoint),
            request: Some(creq),
            body_len: buf.len(),
            client_id,
            allow: None,
        };
        out.push(Out::Route(Route { request, subset }));
        let deliver = if answered {
            // BUFFERED: trailers (if any) come after this body's answer.
            Deliver::BufferedBody
        } else {
            Deliver::HeldBody {
                body: buf,
                chunks,
                end_of_stream,
                trailers,
            }
        };
        self.phase = Phase::Picking(deliver);
    }
}
