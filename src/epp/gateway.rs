//! The gateway's side of ext_proc: the `ProcessingRequest`s an inference gateway
//! (Envoy) sends the picker for a request and its response — headers, body chunks and
//! trailers. Used by the stream machine's tests, the benchmarks and test clients, so
//! that all of them speak the same messages. Builds messages only; decides nothing.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest,
};

/// Which half of the exchange a message belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Request,
    Response,
}

fn message(request: Request) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(request),
        ..Default::default()
    }
}

/// A headers message (pseudo-headers such as `:path` or `:status` included), each
/// value sent as `raw_value` as Envoy does.
pub fn headers(phase: Phase, pairs: &[(&str, &str)], end_of_stream: bool) -> ProcessingRequest {
    let h = HttpHeaders {
        headers: Some(HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: k.to_string(),
                    value: String::new(),
                    raw_value: v.as_bytes().to_vec(),
                })
                .collect(),
        }),
        end_of_stream,
        ..Default::default()
    };
    message(match phase {
        Phase::Request => Request::RequestHeaders(h),
        Phase::Response => Request::ResponseHeaders(h),
    })
}

/// A body chunk.
pub fn body(phase: Phase, bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    let b = HttpBody {
        body: bytes.to_vec(),
        end_of_stream,
        ..Default::default()
    };
    message(match phase {
        Phase::Request => Request::RequestBody(b),
        Phase::Response => Request::ResponseBody(b),
    })
}

/// Trailers (they end a body).
pub fn trailers(phase: Phase) -> ProcessingRequest {
    let t = HttpTrailers::default();
    message(match phase {
        Phase::Request => Request::RequestTrailers(t),
        Phase::Response => Request::ResponseTrailers(t),
    })
}
