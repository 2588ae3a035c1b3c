use super::*;
use crate::tokenize::testing;
use serde_json::json;

/// The proxy's bound on an untokenized prompt.
const MAX: usize = crate::proxy::prompt::MAX_PROMPT_TOKENS;

#[test]
fn a_messages_prompt_is_the_chat_prompt_the_engine_renders() {
    let t = testing::in_memory("m", 64).unwrap();
    let msgs = json!({"model": "m", "max_tokens": 3, "system": "t1 t2",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "t3 t4"}]}]});
    let chat = json!({"model": "m", "messages": [
        {"role": "system", "content": "t1 t2"}, {"role": "user", "content": "t3 t4"}]});
    let want = t
        .prompt_tokens(tokenize::Endpoint::Chat, "m", &chat)
        .unwrap();
    assert!(want.as_ref().is_some_and(|w| !w.is_empty()));
    for quick in [false, true] {
        let got = prompt_tokens(Some(&t), Endpoint::Messages, &msgs, quick, MAX).unwrap();
        assert_eq!(got.unwrap(), want);
    }
    let resp = json!({"model": "m", "instructions": "t1 t2", "input": "t3 t4"});
    let got = prompt_tokens(Some(&t), Endpoint::Responses, &resp, false, MAX).unwrap();
    assert_eq!(got.unwrap(), want);
}

#[test]
fn bad_bodies_are_refused_with_or_without_a_tokenizer_and_passthroughs_have_no_prompt() {
    let t = testing::in_memory("m", 64).unwrap();
    let bad = json!({"model": "m", "max_tokens": 1, "messages": "nope"});
    for tok in [Some(&t), None] {
        let r = prompt_tokens(tok, Endpoint::Messages, &bad, false, MAX).unwrap();
        assert!(r.is_err(), "{r:?}");
    }
    let ok = json!({"model": "m", "input": "t1"});
    assert_eq!(
        prompt_tokens(None, Endpoint::Responses, &ok, true, MAX).unwrap(),
        Ok(None)
    );
    for e in [
        Endpoint::Embeddings,
        Endpoint::Tokenize,
        Endpoint::Detokenize,
    ] {
        assert!(passthrough(e) && handles(e) && api_of(e).is_none());
        assert_eq!(
            prompt_tokens(Some(&t), e, &ok, true, MAX).unwrap(),
            Ok(None)
        );
    }
    assert!(!handles(Endpoint::Chat) && !passthrough(Endpoint::Messages));
}

#[test]
fn answers_are_read_in_their_api_and_cut_streams_end_in_its_shape() {
    let mut t = AnswerTracker::new(Endpoint::Responses, true);
    let s = t.feed(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n");
    assert!(s.first_output);
    assert_eq!(t.response_id(), Some("resp_1"));
    let e = AnswerTracker::new(Endpoint::Messages, true).error_event("timeout", "slow");
    assert!(
        e.starts_with(b"event: error\ndata: {\"type\":\"error\""),
        "{e:?}"
    );
    let e = AnswerTracker::new(Endpoint::Chat, true).error_event("timeout", "slow");
    assert!(e.starts_with(b"data: {\"error\""), "{e:?}");
    assert_eq!(
        AnswerTracker::new(Endpoint::Embeddings, false).response_id(),
        None
    );
}

#[test]
fn prefill_workers_are_candidates_for_completions_and_chat_only() {
    use crate::types::Role;
    assert!(candidate(Endpoint::Chat, Role::Prefill));
    assert!(candidate(Endpoint::Completions, Role::Prefill));
    for e in [
        Endpoint::Messages,
        Endpoint::Responses,
        Endpoint::Embeddings,
    ] {
        assert!(!candidate(e, Role::Prefill));
        assert!(candidate(e, Role::Decode) && candidate(e, Role::Aggregated));
    }
}

#[test]
fn stored_responses_are_remembered_per_worker() {
    let r = Responses::default();
    r.remember("resp_1", "w1", 0);
    assert_eq!(r.worker("resp_1", 10).as_deref(), Some("w1"));
    assert_eq!(r.worker("resp_1", RESPONSES_TTL_MS), None);
    assert_eq!(r.worker("resp_2", 10), None);
}
