//! The stream machine fed arbitrary message sequences (any order, any body mode,
//! observability on or off, picks that succeed or fail, a close at any point): it never
//! panics, a routed request finishes exactly once (at the close at the latest) with
//! nothing after, a `Route` always waits for its pick, nothing is answered once the
//! exchange is over, and no request body above the limit is handed to the picker.
//!
//! (A libFuzzer target would rebuild tonic and Envoy's generated protos instrumented;
//! this property test covers the same input space at a fraction of the cost.)

use super::*;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, HttpTrailers, ProtocolConfiguration,
};
use proptest::prelude::*;

const LIMIT: usize = 200;

#[derive(Clone, Debug)]
enum Msg {
    ReqHeaders { path: u8, ct: u8, eos: bool },
    ReqBody { body: u8, eos: bool },
    ReqTrailers,
    RespHeaders { sse: bool, eos: bool },
    RespBody { body: u8, eos: bool },
    RespTrailers,
    Empty,
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        (0u8..4, 0u8..3, any::<bool>()).prop_map(|(path, ct, eos)| Msg::ReqHeaders {
            path,
            ct,
            eos
        }),
        (0u8..6, any::<bool>()).prop_map(|(body, eos)| Msg::ReqBody { body, eos }),
        Just(Msg::ReqTrailers),
        (any::<bool>(), any::<bool>()).prop_map(|(sse, eos)| Msg::RespHeaders { sse, eos }),
        (0u8..4, any::<bool>()).prop_map(|(body, eos)| Msg::RespBody { body, eos }),
        Just(Msg::RespTrailers),
        Just(Msg::Empty),
    ]
}

fn hv(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.into(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

fn request_body(i: u8) -> Vec<u8> {
    match i {
        0 => br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
        1 => br#"{"model":"m","prompt":[1,2,3]"#.to_vec(),
        2 => b"}".to_vec(),
        3 => vec![b' '; LIMIT],
        4 => Vec::new(),
        _ => b"\xff\x00garbage".to_vec(),
    }
}

fn response_body(i: u8) -> Vec<u8> {
    match i {
        0 => b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n".to_vec(),
        1 => b"data: {\"choices\":[{\"delta\":{\"con".to_vec(),
        2 => {
            br#"{"choices":[{"message":{"content":"x"}}],"usage":{"completion_tokens":3}}"#.to_vec()
        }
        _ => b"\n\n\r\xff".to_vec(),
    }
}

fn build(m: &Msg) -> ProcessingRequest {
    let headers = |pairs: Vec<HeaderValue>, eos: bool| HttpHeaders {
        headers: Some(HeaderMap { headers: pairs }),
        end_of_stream: eos,
        ..Default::default()
    };
    let body = |b: Vec<u8>, eos: bool| HttpBody {
        body: b,
        end_of_stream: eos,
        ..Default::default()
    };
    let request = match m {
        Msg::ReqHeaders { path, ct, eos } => {
            let p = ["/v1/chat/completions", "/v1/completions", "/v1/models", ""][*path as usize];
            let c = ["application/json", "text/plain", ""][*ct as usize];
            let mut hs = vec![hv(":path", p)];
            if !c.is_empty() {
                hs.push(hv("content-type", c));
            }
            Some(Request::RequestHeaders(headers(hs, *eos)))
        }
        Msg::ReqBody { body: b, eos } => Some(Request::RequestBody(body(request_body(*b), *eos))),
        Msg::ReqTrailers => Some(Request::RequestTrailers(HttpTrailers::default())),
        Msg::RespHeaders { sse, eos } => {
            let ct = if *sse {
                "text/event-stream"
            } else {
                "application/json"
            };
            let hs = vec![hv(":status", "200"), hv("content-type", ct)];
            Some(Request::ResponseHeaders(headers(hs, *eos)))
        }
        Msg::RespBody { body: b, eos } => {
            Some(Request::ResponseBody(body(response_body(*b), *eos)))
        }
        Msg::RespTrailers => Some(Request::ResponseTrailers(HttpTrailers::default())),
        Msg::Empty => None,
    };
    ProcessingRequest {
        request,
        ..Default::default()
    }
}

/// Checks what one step emitted against what came before.
struct Check {
    finished: bool,
    done: bool,
}

impl Check {
    fn step(&mut self, st: &Stream, outs: &[Out]) {
        for o in outs {
            assert!(
                !self.done || !matches!(o, Out::Send(_) | Out::Route(_)),
                "{o:?} after the end"
            );
            match o {
                Out::Life(_, l) => {
                    assert!(!self.finished, "{l:?} after Finish");
                    self.finished |= matches!(l, Life::Finish(_));
                }
                Out::Route(r) => {
                    assert!(st.picking());
                    assert!(r.request.body_len <= LIMIT || r.request.request.is_none());
                }
                Out::Send(r) => {
                    let immediate = matches!(
                        r.response,
                        Some(envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response::ImmediateResponse(_))
                    );
                    self.done |= immediate;
                }
                Out::Fail(_) => self.done = true,
                Out::Refused(_) => {}
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_message_sequence_keeps_the_invariants(
        req_mode in 0i32..7,
        resp_mode in 0i32..7,
        no_wait in any::<bool>(),
        observe in any::<bool>(),
        msgs in proptest::collection::vec(msg(), 0..24),
        picks in proptest::collection::vec(0u8..5, 24),
    ) {
        let limits = Limits {
            max_body_bytes: LIMIT,
            max_header_count: 8,
            max_header_bytes: 512,
        };
        let mut st = Stream::new(limits, 7);
        let mut check = Check { finished: false, done: false };
        let mut routed = false;
        for (i, m) in msgs.iter().enumerate() {
            let mut pm = build(m);
            pm.observability_mode = observe;
            if i == 0 {
                pm.protocol_config = Some(ProtocolConfiguration {
                    request_body_mode: req_mode,
                    response_body_mode: resp_mode,
                    send_body_without_waiting_for_header_response: no_wait,
                });
            }
            if st.picking() {
                // The driver never reads while a pick is pending.
                let answer = match picks[i] {
                    0 => Err(NoPick::Busy("b".into())),
                    1 => Err(NoPick::NoEndpoint("n".into())),
                    _ => Ok(Pick {
                        request_id: "r".into(),
                        worker: "w".into(),
                        endpoint: "1.2.3.4:5".into(),
                        prefill: None,
                    }),
                };
                let outs = st.on_pick(answer);
                check.step(&st, &outs);
                routed |= st.pick().is_some();
                prop_assert!(!st.picking());
            }
            let outs = st.on_message(pm);
            if observe {
                prop_assert!(!outs.iter().any(|o| matches!(o, Out::Send(_))));
            }
            check.step(&st, &outs);
        }
        let outs = st.on_close();
        check.step(&st, &outs);
        prop_assert_eq!(check.finished, routed, "a routed request finishes once, others never");
        prop_assert!(st.on_close().is_empty());
    }
}
