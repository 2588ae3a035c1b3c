//! The `ProcessingResponse` messages the EPP sends, built in one place.
//!
//! A pick is sent the two ways the endpoint picker protocol requires, always with the
//! same value: the request header `x-gateway-destination-endpoint` (with
//! `clear_route_cache`, so the gateway routes on it) and the dynamic metadata
//! `envoy.lb` / `x-gateway-destination-endpoint`. A refusal is an `ImmediateResponse`
//! whose body is an OpenAI-style JSON error (the proxy's `errors::body`), with
//! `retry-after` on a 429.

use super::pick::Pick;
use crate::proxy::errors;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// Header and metadata key of the picked endpoint.
pub const DESTINATION_KEY: &str = "x-gateway-destination-endpoint";
/// Metadata namespace of the picked endpoint (and of the served one).
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// Key under [`DESTINATION_NAMESPACE`] where the gateway reports the endpoint used.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// The decode worker's sidecar reads the prefill endpoint here (llm-d's convention).
pub const PREFILL_HEADER: &str = "x-prefiller-host-port";
/// Largest body chunk sent back in one streamed body response (the ext_proc
/// recommendation for `FULL_DUPLEX_STREAMED`).
pub const MAX_STREAMED_CHUNK: usize = 64 << 10;

/// Which side of the HTTP exchange a message is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Request,
    Response,
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

fn headers_response(side: Side, common: CommonResponse) -> Response {
    let r = HeadersResponse {
        response: Some(common),
    };
    match side {
        Side::Request => Response::RequestHeaders(r),
        Side::Response => Response::ResponseHeaders(r),
    }
}

fn body_response(side: Side, common: CommonResponse) -> Response {
    let r = BodyResponse {
        response: Some(common),
    };
    match side {
        Side::Request => Response::RequestBody(r),
        Side::Response => Response::ResponseBody(r),
    }
}

fn plain(r: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(r),
        ..Default::default()
    }
}

/// "Go on, unchanged" to a headers message.
pub fn headers_continue(side: Side) -> ProcessingResponse {
    plain(headers_response(side, CommonResponse::default()))
}

/// "Go on, unchanged" to a body chunk (STREAMED / BUFFERED modes).
pub fn body_continue(side: Side) -> ProcessingResponse {
    plain(body_response(side, CommonResponse::default()))
}

/// A body chunk handed back (`FULL_DUPLEX_STREAMED`: the gateway forwards what the
/// processor returns).
pub fn body_streamed(side: Side, chunk: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let common = CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                body: chunk,
                end_of_stream,
                ..Default::default()
            })),
        }),
        ..Default::default()
    };
    plain(body_response(side, common))
}

/// "Go on" to trailers.
pub fn trailers_continue(side: Side) -> ProcessingResponse {
    let r = TrailersResponse::default();
    plain(match side {
        Side::Request => Response::RequestTrailers(r),
        Side::Response => Response::ResponseTrailers(r),
    })
}

/// The pick, as a request headers response (`at_body`: as the response to the
/// buffered body instead, where header mutations still apply).
pub fn routed(pick: &Pick, at_body: bool) -> ProcessingResponse {
    let mut set = vec![header(DESTINATION_KEY, &pick.endpoint)];
    if let Some(p) = &pick.prefill {
        set.push(header(PREFILL_HEADER, p));
    }
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: set,
            remove_headers: Vec::new(),
        }),
        clear_route_cache: true,
        ..Default::default()
    };
    let response = if at_body {
        body_response(Side::Request, common)
    } else {
        headers_response(Side::Request, common)
    };
    ProcessingResponse {
        response: Some(response),
        dynamic_metadata: Some(destination_metadata(&pick.endpoint)),
        ..Default::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": endpoint}}`.
pub fn destination_metadata(endpoint: &str) -> Struct {
    let mut inner = Struct::default();
    inner.fields.insert(
        DESTINATION_KEY.into(),
        Value {
            kind: Some(Kind::StringValue(endpoint.into())),
        },
    );
    let mut outer = Struct::default();
    outer.fields.insert(
        DESTINATION_NAMESPACE.into(),
        Value {
            kind: Some(Kind::StructValue(inner)),
        },
    );
    outer
}

/// The response headers, with the worker and request id the proxy also reports.
pub fn response_headers(pick: &Pick) -> ProcessingResponse {
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: vec![
                header("x-kvroute-worker", &pick.worker),
                header("x-kvroute-request-id", &pick.request_id),
            ],
            remove_headers: Vec::new(),
        }),
        ..Default::default()
    };
    plain(headers_response(Side::Response, common))
}

/// A refusal: `status` with an OpenAI-style JSON error body.
pub fn immediate(status: u16, kind: &str, code: &str, message: &str) -> ProcessingResponse {
    let mut set = vec![header("content-type", "application/json")];
    if status == 429 {
        set.push(header("retry-after", "1"));
    }
    plain(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(status),
        }),
        headers: Some(HeaderMutation {
            set_headers: set,
            remove_headers: Vec::new(),
        }),
        body: errors::body(kind, code, message).to_vec(),
        grpc_status: None,
        details: format!("kvroute_epp_{code}"),
    }))
}
