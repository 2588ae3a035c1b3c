use super::*;

fn anthropic_stream() -> String {
    let ev = |name: &str, data: &str| format!("event: {name}\ndata: {data}\n\n");
    [
        ev("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":5,"output_tokens":0}}}"#),
        ev("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
        ev("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" t1"}}"#),
        ev("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" t2"}}"#),
        ev("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        ev("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":5,"output_tokens":7}}"#),
        ev("message_stop", r#"{"type":"message_stop"}"#),
    ]
    .concat()
}

#[test]
fn anthropic_events_give_first_token_usage_and_stop_whatever_the_split() {
    let all = anthropic_stream();
    for step in [all.len(), 1, 7, 64] {
        let mut t = StreamTracker::new(Api::Messages, true, 0);
        let (mut first, mut done, mut progressed) = (0, false, 0);
        for c in all.as_bytes().chunks(step) {
            let s = t.feed(c);
            first += u32::from(s.first_output);
            done |= s.done;
            progressed += u32::from(s.progressed);
        }
        assert_eq!((first, done, t.tokens()), (1, true, 7), "step {step}");
        assert!(progressed >= 1);
    }
    let mut t = StreamTracker::new(Api::Messages, true, 0);
    let s = t.feed(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"x\"}}\n\n");
    assert!(s.error && !s.first_output);
    // A role-less start and an empty delta carry no output.
    let s = t.feed(b"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"\"}}\n\n");
    assert!(!s.first_output);
    let s = t.feed(b"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}\n\n");
    assert!(s.first_output && t.tokens() == 1);
}

#[test]
fn responses_events_give_id_first_token_usage_and_completion() {
    let ev = |name: &str, data: &str| format!("event: {name}\ndata: {data}\n\n");
    let all = [
        ev("response.created", r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_abc","object":"response","status":"in_progress","output":[],"usage":null}}"#),
        ev("response.output_text.delta", r#"{"type":"response.output_text.delta","sequence_number":1,"item_id":"m","output_index":0,"content_index":0,"delta":" t1"}"#),
        ev("response.output_text.delta", r#"{"type":"response.output_text.delta","sequence_number":2,"item_id":"m","output_index":0,"content_index":0,"delta":" t2"}"#),
        ev("response.completed", r#"{"type":"response.completed","sequence_number":3,"response":{"id":"resp_abc","status":"completed","output":[{"type":"message"}],"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}}"#),
    ]
    .concat();
    let mut t = StreamTracker::new(Api::Responses, true, 0);
    let mut first = 0;
    let mut done = false;
    for c in all.as_bytes().chunks(5) {
        let s = t.feed(c);
        first += u32::from(s.first_output);
        done |= s.done;
    }
    assert_eq!((first, done, t.tokens()), (1, true, 2));
    assert_eq!(t.response_id(), Some("resp_abc"));
    let mut t = StreamTracker::new(Api::Responses, true, 0);
    let s = t.feed(b"data: {\"type\":\"response.failed\",\"response\":{\"id\":\"r\"}}\n\n");
    assert!(s.error && s.done);
}

#[test]
fn whole_answers_are_read_at_the_end_and_bounded() {
    let mut t = StreamTracker::new(Api::Messages, false, 1024);
    t.feed(br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"#);
    t.feed(br#""usage":{"input_tokens":3,"output_tokens":4}}"#);
    let s = t.finish();
    assert!(s.first_output && s.progressed && !s.error && t.tokens() == 4);
    let mut t = StreamTracker::new(Api::Messages, false, 1024);
    t.feed(br#"{"type":"error","error":{"type":"not_found_error","message":"x"}}"#);
    assert!(t.finish().error);
    let mut t = StreamTracker::new(Api::Responses, false, 1024);
    t.feed(br#"{"id":"resp_9","object":"response","status":"completed","error":null,"output":[{"type":"message"}],"usage":{"output_tokens":6}}"#);
    let s = t.finish();
    assert!(s.first_output && !s.error && t.tokens() == 6);
    assert_eq!(t.response_id(), Some("resp_9"));
    let mut t = StreamTracker::new(Api::Responses, false, 8);
    t.feed(b"0123456789");
    assert_eq!(t.finish(), Seen::default());
}

#[test]
fn odd_shapes_count_as_nothing_and_long_lines_are_skipped() {
    let mut t = StreamTracker::new(Api::Responses, true, 0);
    for junk in [
        &b"data: {\"type\":7,\"delta\":[1]}\n\n"[..],
        b"data: {\"type\":\"response.output_text.delta\",\"delta\":{\"a\":{}}}\n\n",
        b"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"output_tokens\":\"9\"}}}\n\n",
        b"data: [1,2\n\n",
        b"data: \"x\"\n\n",
    ] {
        let s = t.feed(junk);
        assert!(!s.first_output && !s.error);
    }
    assert_eq!(t.tokens(), 0);
    t.feed(&vec![b'x'; MAX_LINE + 5]);
    t.feed(b"\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n");
    assert!(t.line.len() <= MAX_LINE);
    assert_eq!(t.tokens(), 1);
}
