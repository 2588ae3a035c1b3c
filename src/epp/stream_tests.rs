//! The ext_proc stream machine, message by message: body modes, limits, the pick's
//! two forms, refusals, lifecycle from the response, and protocol errors.

use super::*;
use crate::epp::gateway::{self, Phase};
use crate::epp::pick::PickRequest;
use crate::epp::reply::{DESTINATION_KEY, DESTINATION_NAMESPACE, SERVED_KEY};
use crate::epp::subset;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as R;
use envoy_types::pb::envoy::service::ext_proc::v3::{CommonResponse, ProtocolConfiguration};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

const LIMITS: Limits = Limits {
    max_body_bytes: 1 << 20,
    max_header_count: 16,
    max_header_bytes: 4096,
};

fn headers(pairs: &[(&str, &str)], eos: bool) -> ProcessingRequest {
    gateway::headers(Phase::Request, pairs, eos)
}

fn body(b: &[u8], eos: bool) -> ProcessingRequest {
    gateway::body(Phase::Request, b, eos)
}

fn trailers(response: bool) -> ProcessingRequest {
    gateway::trailers(if response {
        Phase::Response
    } else {
        Phase::Request
    })
}

fn chat() -> ProcessingRequest {
    headers(
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
            ("x-request-id", "client-1"),
        ],
        false,
    )
}

/// `m` as the first message of a stream in these body modes.
fn mode(mut m: ProcessingRequest, req: i32, resp: i32, no_wait: bool) -> ProcessingRequest {
    m.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: req,
        response_body_mode: resp,
        send_body_without_waiting_for_header_response: no_wait,
    });
    m
}

fn resp_headers(status: &str, ct: &str, served: Option<&str>, eos: bool) -> ProcessingRequest {
    let mut m = gateway::headers(
        Phase::Response,
        &[(":status", status), ("content-type", ct)],
        eos,
    );
    if let Some(s) = served {
        let mut inner = Struct::default();
        inner.fields.insert(
            SERVED_KEY.into(),
            Value {
                kind: Some(Kind::StringValue(s.into())),
            },
        );
        let mut md = Metadata::default();
        md.filter_metadata
            .insert(DESTINATION_NAMESPACE.into(), inner);
        m.metadata_context = Some(md);
    }
    m
}

fn resp_body(b: &[u8], eos: bool) -> ProcessingRequest {
    gateway::body(Phase::Response, b, eos)
}

fn pick() -> Pick {
    Pick {
        request_id: "r1".into(),
        worker: "w1".into(),
        endpoint: "10.0.0.1:8000".into(),
        prefill: None,
    }
}

const BODY: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7}"#;

fn sends(outs: &[Out]) -> Vec<&ProcessingResponse> {
    outs.iter()
        .filter_map(|o| match o {
            Out::Send(r) => Some(r),
            _ => None,
        })
        .collect()
}

fn route_of(outs: &[Out]) -> &Route {
    outs.iter()
        .find_map(|o| match o {
            Out::Route(r) => Some(r),
            _ => None,
        })
        .expect("a route")
}

fn lifes(outs: &[Out]) -> Vec<Life> {
    outs.iter()
        .filter_map(|o| match o {
            Out::Life(id, l) => {
                assert_eq!(id, "r1");
                Some(l.clone())
            }
            _ => None,
        })
        .collect()
}

fn common(r: &ProcessingResponse) -> &CommonResponse {
    match r.response.as_ref().unwrap() {
        R::RequestHeaders(h) | R::ResponseHeaders(h) => h.response.as_ref().unwrap(),
        R::RequestBody(b) | R::ResponseBody(b) => b.response.as_ref().unwrap(),
        other => panic!("no common response in {other:?}"),
    }
}

fn set_header<'a>(c: &'a CommonResponse, key: &str) -> Option<&'a [u8]> {
    let m = c.header_mutation.as_ref()?;
    m.set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == key)
        .map(|h| h.raw_value.as_slice())
}

/// The endpoint a routed answer names, checking header and metadata agree.
fn destination(r: &ProcessingResponse) -> String {
    let c = common(r);
    assert!(c.clear_route_cache);
    let h = String::from_utf8(set_header(c, DESTINATION_KEY).unwrap().to_vec()).unwrap();
    let md = r.dynamic_metadata.as_ref().unwrap();
    let Some(Kind::StructValue(ns)) = &md.fields[DESTINATION_NAMESPACE].kind else {
        panic!("no envoy.lb struct");
    };
    let Some(Kind::StringValue(m)) = &ns.fields[DESTINATION_KEY].kind else {
        panic!("no destination string");
    };
    assert_eq!(&h, m, "header and metadata differ");
    h
}

fn streamed(r: &ProcessingResponse) -> (Vec<u8>, bool) {
    match &common(r).body_mutation.as_ref().unwrap().mutation {
        Some(Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not streamed: {other:?}"),
    }
}

/// An immediate response's status and parsed JSON body.
fn immediate(r: &ProcessingResponse) -> (i32, serde_json::Value) {
    match r.response.as_ref().unwrap() {
        R::ImmediateResponse(i) => (
            i.status.as_ref().unwrap().code,
            serde_json::from_slice(&i.body).unwrap(),
        ),
        other => panic!("not immediate: {other:?}"),
    }
}

fn is(r: &ProcessingResponse, name: &str) -> bool {
    let n = match r.response.as_ref().unwrap() {
        R::RequestHeaders(_) => "request_headers",
        R::ResponseHeaders(_) => "response_headers",
        R::RequestBody(_) => "request_body",
        R::ResponseBody(_) => "response_body",
        R::RequestTrailers(_) => "request_trailers",
        R::ResponseTrailers(_) => "response_trailers",
        R::ImmediateResponse(_) => "immediate",
        R::StreamedImmediateResponse(_) => "streamed_immediate",
    };
    n == name
}

/// A stream routed in full-duplex mode (the default) with [`BODY`].
fn routed() -> Stream {
    let mut s = Stream::new(LIMITS, 1);
    assert!(s.on_message(chat()).is_empty());
    let outs = s.on_message(body(BODY, true));
    assert!(matches!(outs.as_slice(), [Out::Route(_)]));
    s.on_pick(Ok(pick()));
    s
}

#[test]
fn full_duplex_holds_the_headers_until_the_body_ends_then_routes_and_returns_the_body() {
    let mut s = Stream::new(LIMITS, 1);
    assert!(s.on_message(mode(chat(), 4, 4, false)).is_empty());
    let (a, b) = BODY.split_at(20);
    assert!(s.on_message(body(a, false)).is_empty());
    let outs = s.on_message(body(b, true));
    let r = route_of(&outs);
    assert!(s.picking() && r.subset.is_none());
    let req: &PickRequest = &r.request;
    assert_eq!(req.endpoint, Some(Endpoint::Chat));
    let creq = req.request.as_ref().unwrap();
    assert_eq!((creq.model.as_str(), creq.max_tokens), ("m", Some(7)));
    assert_eq!(
        (req.body_len, req.client_id.as_str()),
        (BODY.len(), "client-1")
    );
    let outs = s.on_pick(Ok(pick()));
    let sent = sends(&outs);
    assert_eq!(sent.len(), 2);
    assert!(is(sent[0], "request_headers"));
    assert_eq!(destination(sent[0]), "10.0.0.1:8000");
    assert_eq!(streamed(sent[1]), (BODY.to_vec(), true));
    assert_eq!(s.pick(), Some(&pick()));
}

#[test]
fn a_large_body_goes_back_in_64k_chunks_and_trailers_end_a_body() {
    let big = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(150_000));
    let mut s = Stream::new(LIMITS, 1);
    s.on_message(mode(
        headers(&[(":path", "/v1/completions")], false),
        4,
        4,
        false,
    ));
    s.on_message(body(big.as_bytes(), false));
    let outs = s.on_message(trailers(false));
    assert!(route_of(&outs).request.request.is_some());
    let outs = s.on_pick(Ok(pick()));
    let sent = sends(&outs);
    assert_eq!(sent.len(), 1 + 3 + 1);
    let mut back = Vec::new();
    for r in &sent[1..4] {
        let (b, eos) = streamed(r);
        assert!(b.len() <= reply::MAX_STREAMED_CHUNK && !eos);
        back.extend(b);
    }
    assert_eq!(back, big.as_bytes());
    assert!(is(sent[4], "request_trailers"));
}

#[test]
fn buffered_mode_answers_headers_at_once_and_routes_on_the_body_answer() {
    let mut s = Stream::new(LIMITS, 1);
    let outs = s.on_message(mode(chat(), 2, 0, false));
    assert!(is(sends(&outs)[0], "request_headers"));
    assert!(common(sends(&outs)[0]).header_mutation.is_none());
    let outs = s.on_message(body(BODY, true));
    route_of(&outs);
    let outs = s.on_pick(Ok(pick()));
    let sent = sends(&outs);
    assert_eq!(sent.len(), 1);
    assert!(is(sent[0], "request_body"));
    assert_eq!(destination(sent[0]), "10.0.0.1:8000");
    // Trailers after a buffered body get their own answer.
    assert!(is(
        sends(&s.on_message(trailers(false)))[0],
        "request_trailers"
    ));
    // A partial buffer (the gateway's limit cut the body) is too large.
    let mut s = Stream::new(LIMITS, 1);
    s.on_message(mode(chat(), 3, 0, false));
    let outs = s.on_message(body(b"{\"model\":", false));
    assert_eq!(immediate(sends(&outs)[0]).0, 413);
}

#[test]
fn streamed_without_waiting_answers_each_chunk_after_the_pick() {
    let mut s = Stream::new(LIMITS, 1);
    assert!(s.on_message(mode(chat(), 1, 1, true)).is_empty());
    for c in BODY.chunks(30) {
        let last = c.as_ptr_range().end == BODY.as_ptr_range().end;
        let outs = s.on_message(body(c, last));
        assert_eq!(outs.is_empty(), !last);
    }
    let outs = s.on_pick(Ok(pick()));
    let sent = sends(&outs);
    assert_eq!(sent.len(), 1 + BODY.len().div_ceil(30));
    assert!(sent[1..]
        .iter()
        .all(|r| is(r, "request_body") && common(r).body_mutation.is_none()));
    // Its response body is answered, not handed back.
    s.on_message(resp_headers("200", "application/json", None, false));
    let outs = s.on_message(resp_body(b"{}", true));
    assert!(common(sends(&outs)[0]).body_mutation.is_none());
}

#[test]
fn body_modes_that_cannot_carry_a_pick_are_refused_with_the_fix() {
    for (m, no_wait) in [(0, false), (1, false), (5, false), (9, true)] {
        let mut s = Stream::new(LIMITS, 1);
        let outs = s.on_message(mode(chat(), m, 0, no_wait));
        let (status, err) = immediate(sends(&outs)[0]);
        assert_eq!(status, 500, "mode {m}");
        assert!(err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("FULL_DUPLEX_STREAMED"));
        assert!(outs.contains(&Out::Refused("gateway_mode")));
        assert!(
            s.on_message(body(BODY, true)).is_empty(),
            "ignored after a refusal"
        );
    }
}

#[test]
fn the_body_limit_is_checked_before_buffering() {
    let limits = Limits {
        max_body_bytes: 100,
        ..LIMITS
    };
    let mut s = Stream::new(limits, 1);
    s.on_message(chat());
    assert!(s.on_message(body(&[b' '; 60], false)).is_empty());
    assert!(
        s.on_message(body(&[b' '; 40], false)).is_empty(),
        "exactly the limit"
    );
    let outs = s.on_message(body(b" ", true));
    let (status, err) = immediate(sends(&outs)[0]);
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (413, Some("request_too_large"))
    );
    // Declared too large: refused at the headers.
    let mut s = Stream::new(limits, 1);
    let mut h = chat();
    if let Some(Request::RequestHeaders(x)) = &mut h.request {
        x.headers.as_mut().unwrap().headers.push(HeaderValue {
            key: "content-length".into(),
            value: "101".into(),
            raw_value: Vec::new(),
        });
    }
    assert_eq!(immediate(sends(&s.on_message(h))[0]).0, 413);
}

#[test]
fn header_limits_give_431() {
    let many: Vec<(String, String)> = (0..17).map(|i| (format!("h{i}"), "v".into())).collect();
    let pairs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut s = Stream::new(LIMITS, 1);
    assert_eq!(
        immediate(sends(&s.on_message(headers(&pairs, false)))[0]).0,
        431
    );
    let long = "v".repeat(5000);
    let mut s = Stream::new(LIMITS, 1);
    let outs = s.on_message(headers(&[("x", &long)], false));
    assert_eq!(immediate(sends(&outs)[0]).0, 431);
}

#[test]
fn bad_requests_get_openai_errors() {
    let ct = |c: &str| headers(&[(":path", "/v1/completions"), ("content-type", c)], false);
    let mut s = Stream::new(LIMITS, 1);
    let outs = s.on_message(ct("text/plain"));
    let (status, err) = immediate(sends(&outs)[0]);
    assert_eq!(status, 415);
    assert_eq!(err["error"]["type"], "invalid_request_error");
    // No body on an inference path.
    let mut s = Stream::new(LIMITS, 1);
    let outs = s.on_message(headers(&[(":path", "/v1/completions")], true));
    assert_eq!(immediate(sends(&outs)[0]).0, 400);
    for (b, what) in [
        (&b""[..], "empty"),
        (b"{nope", "invalid JSON"),
        (b"[1]", "JSON object"),
        (br#"{"model":1}"#, "model must be a string"),
    ] {
        let mut s = Stream::new(LIMITS, 1);
        s.on_message(ct("application/json"));
        let outs = s.on_message(body(b, true));
        let (status, err) = immediate(sends(&outs)[0]);
        assert_eq!(status, 400);
        assert!(
            err["error"]["message"].as_str().unwrap().contains(what),
            "{err}"
        );
    }
}

#[test]
fn other_paths_are_routed_at_the_headers_and_their_body_passes() {
    let mut s = Stream::new(LIMITS, 1);
    let outs = s.on_message(headers(
        &[(":method", "GET"), (":path", "/v1/models")],
        true,
    ));
    let r = route_of(&outs);
    assert_eq!(
        (r.request.endpoint, r.request.request.is_none()),
        (None, true)
    );
    let outs = s.on_pick(Ok(pick()));
    assert_eq!(destination(sends(&outs)[0]), "10.0.0.1:8000");
    let mut s = Stream::new(LIMITS, 1);
    s.on_message(headers(&[(":path", "/v1/embeddings")], false));
    s.on_pick(Ok(pick()));
    let outs = s.on_message(body(b"abc", true));
    assert_eq!(streamed(sends(&outs)[0]), (b"abc".to_vec(), true));
}

#[test]
fn subset_hints_travel_with_the_route_and_bad_ones_are_503() {
    let mut m = chat();
    let mut inner = Struct::default();
    let hint = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    inner
        .fields
        .insert(subset::SUBSET_KEY.into(), hint("10.0.0.1:8000,10.0.0.2"));
    let mut md = Metadata::default();
    md.filter_metadata
        .insert(subset::SUBSET_NAMESPACE.into(), inner.clone());
    m.metadata_context = Some(md.clone());
    let mut s = Stream::new(LIMITS, 1);
    s.on_message(m);
    let outs = s.on_message(body(BODY, true));
    assert_eq!(route_of(&outs).subset.as_ref().unwrap().entries.len(), 2);
    inner.fields.insert(
        subset::SUBSET_KEY.into(),
        Value {
            kind: Some(Kind::NumberValue(3.0)),
        },
    );
    md.filter_metadata
        .insert(subset::SUBSET_NAMESPACE.into(), inner);
    let mut m = chat();
    m.metadata_context = Some(md);
    let mut s = Stream::new(LIMITS, 1);
    let outs = s.on_message(m);
    assert_eq!(immediate(sends(&outs)[0]).0, 503);
}

#[test]
fn no_pick_becomes_503_429_400_or_500() {
    for (no, status) in [
        (NoPick::NoEndpoint("none".into()), 503),
        (NoPick::Busy("full".into()), 429),
        (NoPick::BadRequest("bad prompt".into()), 400),
        (NoPick::Internal("oops".into()), 500),
    ] {
        let mut s = Stream::new(LIMITS, 1);
        s.on_message(chat());
        s.on_message(body(BODY, true));
        let outs = s.on_pick(Err(no.clone()));
        let r = sends(&outs)[0];
        let (st, err) = immediate(r);
        assert_eq!(st, status);
        assert_eq!(err["error"]["message"], no.message());
        let R::ImmediateResponse(i) = r.response.as_ref().unwrap() else {
            unreachable!()
        };
        let retry = i
            .headers
            .as_ref()
            .unwrap()
            .set_headers
            .iter()
            .any(|h| h.header.as_ref().is_some_and(|h| h.key == "retry-after"));
        assert_eq!(retry, status == 429);
        assert!(outs.contains(&Out::Refused(no.kind())));
        assert!(s.pick().is_none() && lifes(&s.on_close()).is_empty());
    }
}

#[path = "stream_tests_life.rs"]
mod life;
