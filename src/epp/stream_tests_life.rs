//! The stream machine's response phase: lifecycle signals, cuts, protocol errors,
//! observability mode (helpers in the parent module).

use super::*;

#[test]
fn sse_responses_give_admitted_first_token_progress_and_finish() {
    let mut s = routed();
    let outs = s.on_message(resp_headers(
        "200",
        "text/event-stream",
        Some("10.0.0.1:8000"),
        false,
    ));
    assert_eq!(
        lifes(&outs),
        vec![Life::Admitted {
            status: 200,
            served: Some("10.0.0.1:8000".into())
        }]
    );
    let sent = sends(&outs);
    assert_eq!(
        set_header(common(sent[0]), "x-kvroute-worker"),
        Some(&b"w1"[..])
    );
    let role = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    let outs = s.on_message(resp_body(role, false));
    assert!(lifes(&outs).is_empty());
    assert_eq!(streamed(sends(&outs)[0]), (role.to_vec(), false));
    let tok = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"con";
    let outs = s.on_message(resp_body(tok, false));
    assert_eq!(lifes(&outs), vec![Life::FirstToken, Life::Progress(1)]);
    let outs = s.on_message(resp_body(b"tent\":\"b\"}}]}\n\ndata: [DONE]\n\n", true));
    assert_eq!(
        lifes(&outs),
        vec![Life::Progress(2), Life::Finish(Outcome::Ok)]
    );
    assert!(streamed(sends(&outs)[0]).1);
    assert!(lifes(&s.on_close()).is_empty(), "finish comes once");
}

#[test]
fn json_responses_are_read_at_the_end_and_trailers_finish() {
    let mut s = routed();
    s.on_message(resp_headers("200", "application/json", None, false));
    let outs = s.on_message(resp_body(
        br#"{"choices":[{"message":{"content":"hi"}}],"#,
        false,
    ));
    assert!(lifes(&outs).is_empty());
    let outs = s.on_message(resp_body(br#""usage":{"completion_tokens":5}}"#, false));
    assert!(lifes(&outs).is_empty());
    let outs = s.on_message(trailers(true));
    assert_eq!(
        lifes(&outs),
        vec![
            Life::FirstToken,
            Life::Progress(5),
            Life::Finish(Outcome::Ok)
        ]
    );
    assert!(is(sends(&outs)[0], "response_trailers"));
    // Headers-only response.
    let mut s = routed();
    let outs = s.on_message(resp_headers("503", "text/plain", None, true));
    assert_eq!(
        lifes(&outs),
        vec![
            Life::Admitted {
                status: 503,
                served: None
            },
            Life::Finish(Outcome::Ok)
        ]
    );
}

#[test]
fn a_stream_cut_early_finishes_its_request_once() {
    let mut s = routed();
    s.on_message(resp_headers("200", "text/event-stream", None, false));
    assert_eq!(lifes(&s.on_close()), vec![Life::Finish(Outcome::Cut)]);
    assert!(lifes(&s.on_close()).is_empty());
    // Cut before any response: still finished.
    let mut s = routed();
    assert_eq!(lifes(&s.on_close()), vec![Life::Finish(Outcome::Cut)]);
    // Cut before the pick: nothing was routed.
    let mut s = Stream::new(LIMITS, 1);
    s.on_message(chat());
    assert!(s.on_close().is_empty());
}

#[test]
fn protocol_errors_fail_the_stream_and_finish_a_routed_request() {
    let fails = |outs: &[Out]| outs.iter().any(|o| matches!(o, Out::Fail(_)));
    let mut s = Stream::new(LIMITS, 1);
    assert!(fails(&s.on_message(body(b"x", true))));
    let mut s = Stream::new(LIMITS, 1);
    assert!(fails(&s.on_message(ProcessingRequest::default())));
    let mut s = Stream::new(LIMITS, 1);
    assert!(fails(&s.on_message(resp_headers("200", "x", None, false))));
    let mut s = Stream::new(LIMITS, 1);
    s.on_message(chat());
    assert!(fails(&s.on_message(chat())));
    let mut s = routed();
    assert!(
        fails(&s.on_message(resp_body(b"x", false))),
        "body before headers"
    );
    let mut s = routed();
    s.on_message(resp_headers("200", "x", None, false));
    let outs = s.on_message(resp_headers("200", "x", None, false));
    assert!(fails(&outs));
    assert_eq!(lifes(&outs), vec![Life::Finish(Outcome::Refused)]);
    assert!(
        s.on_message(resp_body(b"x", true)).is_empty(),
        "ignored after"
    );
    // Trailers before the response headers; headers after the response ended: no
    // signal comes after `Finish`.
    let mut s = routed();
    let outs = s.on_message(trailers(true));
    assert!(fails(&outs));
    assert_eq!(lifes(&outs), vec![Life::Finish(Outcome::Refused)]);
    let mut s = routed();
    s.on_message(resp_headers("200", "x", None, true));
    let outs = s.on_message(resp_headers("200", "x", None, false));
    assert!(fails(&outs) && lifes(&outs).is_empty());
    // A pick nobody asked for changes nothing.
    let mut s = Stream::new(LIMITS, 1);
    assert!(s.on_pick(Ok(pick())).is_empty() && s.pick().is_none());
}

#[test]
fn observability_mode_sends_nothing_but_still_follows_the_request() {
    let mut s = Stream::new(LIMITS, 1);
    let mut h = chat();
    h.observability_mode = true;
    assert!(s.on_message(h).is_empty());
    let mut b = body(BODY, true);
    b.observability_mode = true;
    route_of(&s.on_message(b));
    assert!(sends(&s.on_pick(Ok(pick()))).is_empty());
    let mut rh = resp_headers("200", "text/event-stream", None, false);
    rh.observability_mode = true;
    let outs = s.on_message(rh);
    assert!(sends(&outs).is_empty() && lifes(&outs).len() == 1);
}

#[test]
fn prefill_and_client_ids() {
    let mut s = Stream::new(LIMITS, 1);
    s.on_message(chat());
    s.on_message(body(BODY, true));
    let p = Pick {
        prefill: Some("10.0.0.9:8000".into()),
        ..pick()
    };
    let outs = s.on_pick(Ok(p));
    let c = common(sends(&outs)[0]);
    assert_eq!(
        set_header(c, reply::PREFILL_HEADER),
        Some(&b"10.0.0.9:8000"[..])
    );
    for (given, want) in [
        (None, "kvr-00000000000000ab"),
        (Some("a b"), "kvr-00000000000000ab"),
    ] {
        let mut pairs = vec![(":path", "/v1/models")];
        if let Some(g) = given {
            pairs.push(("x-request-id", g));
        }
        let mut s = Stream::new(LIMITS, 0xab);
        let outs = s.on_message(headers(&pairs, true));
        assert_eq!(route_of(&outs).request.client_id, want);
    }
}
