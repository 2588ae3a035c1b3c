//! The response phase of [`Stream`]: lifecycle signals read off the upstream's
//! response as the gateway relays it (see the parent module).

use super::{push_streamed, BodyMode, FailCode, Out, Phase, Stream};
use crate::epp::headers;
use crate::epp::pick::{Life, Outcome};
use crate::epp::reply::{self, Side, DESTINATION_NAMESPACE, SERVED_KEY};
use crate::proxy::track::{Seen, Tracker};
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders};
use envoy_types::pb::google::protobuf::value::Kind;

/// The endpoint the gateway reports it forwarded to (`envoy.lb` /
/// `x-gateway-destination-endpoint-served`), at most 300 bytes.
pub fn served_endpoint(md: Option<&Metadata>) -> Option<String> {
    let ns = md?.filter_metadata.get(DESTINATION_NAMESPACE)?;
    match &ns.fields.get(SERVED_KEY)?.kind {
        Some(Kind::StringValue(s)) if !s.is_empty() && s.len() <= 300 => Some(s.clone()),
        _ => None,
    }
}

impl Stream {
    /// The routed request, or a protocol error when the response phase starts early.
    fn routed_for_response(&mut self, what: &str, out: &mut Vec<Out>) -> bool {
        match self.phase {
            Phase::Routed(_) => true,
            Phase::Done => false,
            _ => {
                let m = format!("{what} before the request was routed");
                self.protocol_error(FailCode::FailedPrecondition, &m, out);
                false
            }
        }
    }

    pub(super) fn response_headers(
        &mut self,
        h: HttpHeaders,
        md: Option<&Metadata>,
        out: &mut Vec<Out>,
    ) {
        if !self.routed_for_response("response headers", out) {
            return;
        }
        let Phase::Routed(r) = &mut self.phase else {
            return;
        };
        if r.tracker.is_some() || r.finished {
            let m = "response headers came twice, or after the response ended";
            return self.protocol_error(FailCode::InvalidArgument, m, out);
        }
        let all = h
            .headers
            .as_ref()
            .map(|m| m.headers.as_slice())
            .unwrap_or_default();
        let find = |k: &str| {
            all.iter().find(|x| x.key == k).map(|x| {
                String::from_utf8_lossy(headers::value(x))
                    .trim()
                    .to_ascii_lowercase()
            })
        };
        let status = find(":status")
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(0);
        let sse = find("content-type").is_some_and(|c| c.starts_with("text/event-stream"));
        r.tracker = Some(Tracker::new(sse));
        let id = r.pick.request_id.clone();
        let served = served_endpoint(md);
        out.push(Out::Life(id, Life::Admitted { status, served }));
        out.push(Out::Send(reply::response_headers(&r.pick)));
        if h.end_of_stream {
            self.finish(Outcome::Ok, out);
        }
    }

    pub(super) fn response_body(&mut self, b: HttpBody, out: &mut Vec<Out>) {
        if !self.routed_for_response("a response body", out) {
            return;
        }
        let Phase::Routed(r) = &mut self.phase else {
            return;
        };
        let Some(t) = r.tracker.as_mut() else {
            let m = "a response body before the response headers";
            return self.protocol_error(FailCode::FailedPrecondition, m, out);
        };
        if !r.finished {
            let seen = t.feed(&b.body);
            signals(&r.pick.request_id, seen, t, out);
            if b.end_of_stream {
                let seen = t.finish();
                signals(&r.pick.request_id, seen, t, out);
            }
        }
        match self.response_mode {
            BodyMode::FullDuplex => push_streamed(out, Side::Response, b.body, b.end_of_stream),
            _ => out.push(Out::Send(reply::body_continue(Side::Response))),
        }
        if b.end_of_stream {
            self.finish(Outcome::Ok, out);
        }
    }

    pub(super) fn response_trailers(&mut self, out: &mut Vec<Out>) {
        if !self.routed_for_response("response trailers", out) {
            return;
        }
        let Phase::Routed(r) = &mut self.phase else {
            return;
        };
        let Some(t) = r.tracker.as_mut() else {
            let m = "response trailers before the response headers";
            return self.protocol_error(FailCode::FailedPrecondition, m, out);
        };
        if !r.finished {
            let seen = t.finish();
            signals(&r.pick.request_id, seen, t, out);
        }
        out.push(Out::Send(reply::trailers_continue(Side::Response)));
        self.finish(Outcome::Ok, out);
    }
}

/// `FirstToken` / `Progress` for what a chunk changed.
fn signals(id: &str, seen: Seen, t: &Tracker, out: &mut Vec<Out>) {
    if seen.first_output {
        out.push(Out::Life(id.to_string(), Life::FirstToken));
    }
    if seen.progressed {
        out.push(Out::Life(id.to_string(), Life::Progress(t.tokens())));
    }
}
