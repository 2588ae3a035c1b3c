//! The agent APIs of `kvroute-sim fleet` (Anthropic Messages, OpenAI Responses) and
//! its other vLLM endpoints (embeddings, tokenize, detokenize), through the real
//! binary over loopback: the official `anthropic` and `openai` Python clients read
//! every shape, streamed and not; a Messages or Responses conversation hits the very
//! blocks the same conversation cached as a chat request (the prompt is rendered with
//! the chat template as vLLM renders it); a `previous_response_id` follow-up renders
//! the stored history (cache hit) and an unknown id is vLLM's 404; `--api-key` is a
//! bearer token only, as in vLLM; a client that goes away releases the worker.

mod common;

use common::fleet::{post, Fleet, FAST};
use common::tokenizer::TestTokenizer;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn words(r: std::ops::Range<u32>) -> String {
    common::fleet::words(r)
}

#[test]
fn official_clients_read_messages_responses_and_embeddings() {
    let f = Fleet::start(&[
        "--workers",
        "1",
        "--events",
        "none",
        "--timing",
        FAST,
        "--api-key",
        "sek",
    ]);
    let r = common::py_client(
        "agent_clients.py",
        &[&f.workers[0].url, "sek", "sim-model", "t1 t2 t3 t4"],
    );
    let m = &r["messages"];
    assert_eq!(
        m["text"].as_str().unwrap().split_whitespace().count(),
        4,
        "{r}"
    );
    assert_eq!(
        (m["stop_reason"].as_str(), m["output_tokens"].as_u64()),
        (Some("max_tokens"), Some(4))
    );
    let s = &r["messages_stream"];
    let ev: Vec<&str> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(ev.first(), Some(&"message_start"));
    assert_eq!(ev.last(), Some(&"message_stop"));
    assert_eq!(
        ev.iter().filter(|e| **e == "content_block_delta").count(),
        3
    );
    assert_eq!(s["output_tokens"], 3);
    assert_eq!(
        r["messages_not_found"],
        json!({"status": 404, "type": "not_found_error"})
    );
    let first = &r["responses"];
    assert_eq!(first["output_tokens"], 4);
    // The follow-up renders the stored turn, its answer and the new input.
    let fu = &r["follow_up"];
    assert!(
        fu["input_tokens"].as_u64() > first["input_tokens"].as_u64(),
        "{r}"
    );
    let rs = &r["responses_stream"];
    let ev: Vec<&str> = rs["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        (ev[0], *ev.last().unwrap()),
        ("response.created", "response.completed")
    );
    assert_eq!(rs["output_tokens"], 3);
    assert_eq!(
        r["previous_not_found"],
        json!({"status": 404, "message": "Response with id 'resp_unknown' not found."})
    );
    assert_eq!(
        r["embeddings"],
        json!({"n": 2, "dims": 16, "prompt_tokens": 3})
    );
}

fn stats(f: &Fleet) -> (u64, u64) {
    let s = f.stats(0);
    (
        s["prompt_blocks"].as_u64().unwrap(),
        s["cached_blocks"].as_u64().unwrap(),
    )
}

#[test]
fn each_api_hits_the_blocks_the_same_chat_cached() {
    let tok = TestTokenizer::new(256);
    let dir = tok.path().display().to_string();
    let f = Fleet::start(&[
        "--workers",
        "1",
        "--events",
        "none",
        "--timing",
        FAST,
        "--block-size",
        "4",
        "--model",
        "m",
        "--tokenizer",
        &dir,
    ]);
    let url = |p: &str| f.url(0, p);
    let (sys, user) = (words(0..40), words(40..80));
    let chat = json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "system", "content": sys}, {"role": "user", "content": user}]});
    let (code, _) = post(&url("/v1/chat/completions"), chat.clone());
    assert_eq!(code, 200);
    let (_, t) = post(&url("/tokenize"), chat.clone());
    let n = serde_json::from_str::<Value>(&t).unwrap()["count"]
        .as_u64()
        .unwrap();
    let full = n / 4;
    let (p0, c0) = stats(&f);
    let msgs = json!({"model": "m", "max_tokens": 1,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=42"}, {"type": "text", "text": sys}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}]});
    let (code, body) = post(&url("/v1/messages"), msgs);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["usage"]["input_tokens"],
        n
    );
    let (p1, c1) = stats(&f);
    assert_eq!(
        (p1 - p0, c1 - c0),
        (full, full),
        "the Messages prompt is the chat prompt"
    );
    let resp = json!({"model": "m", "max_output_tokens": 2, "instructions": sys, "input": user});
    let (code, body) = post(&url("/v1/responses"), resp);
    assert_eq!(code, 200, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    let (p2, c2) = stats(&f);
    assert_eq!(
        (p2 - p1, c2 - c1),
        (full, full),
        "the Responses prompt is the chat prompt"
    );
    // A follow-up renders the stored conversation (instructions do not carry over, so
    // an agent sends them again): all of it is cached.
    let id = first["id"].as_str().unwrap();
    let next = json!({"model": "m", "max_output_tokens": 1, "previous_response_id": id,
        "instructions": sys, "input": words(80..90)});
    let (code, body) = post(&url("/v1/responses"), next);
    assert_eq!(code, 200, "{body}");
    let (p3, c3) = stats(&f);
    assert!(
        p3 - p2 > full && c3 - c2 >= full,
        "{:?}",
        (p3 - p2, c3 - c2, full)
    );
    // The prompt-side shapes of the other endpoints.
    let (_, t) = post(
        &url("/tokenize"),
        json!({"model": "m", "prompt": "t5 t6 t7"}),
    );
    let ids = serde_json::from_str::<Value>(&t).unwrap()["tokens"].clone();
    let (code, d) = post(&url("/detokenize"), json!({"model": "m", "tokens": ids}));
    assert_eq!(code, 200);
    assert!(
        serde_json::from_str::<Value>(&d).unwrap()["prompt"]
            .as_str()
            .unwrap()
            .contains("t5 t6 t7"),
        "{d}"
    );
    let (code, _) = post(
        &url("/detokenize"),
        json!({"model": "m", "tokens": [1_000_000]}),
    );
    assert_eq!(code, 400);
}

#[test]
fn api_key_is_a_bearer_token_and_errors_have_each_api_shape() {
    let f = Fleet::start(&[
        "--workers",
        "1",
        "--events",
        "none",
        "--timing",
        FAST,
        "--api-key",
        "sek",
    ]);
    let url = f.url(0, "/v1/messages");
    let body = json!({"model": "sim-model", "max_tokens": 1, "messages": [{"role": "user", "content": "t1"}]});
    let call = |h: Option<(&str, &str)>, b: &Value| {
        let mut r = ureq::post(&url).timeout(Duration::from_secs(30));
        if let Some((k, v)) = h {
            r = r.set(k, v);
        }
        match r.send_json(b.clone()) {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{e}"),
        }
    };
    // vLLM 0.33 reads the key from `Authorization: Bearer` only.
    let (code, b) = call(Some(("x-api-key", "sek")), &body);
    assert_eq!((code, b.as_str()), (401, r#"{"error":"Unauthorized"}"#));
    let (code, _) = call(Some(("authorization", "Bearer sek")), &body);
    assert_eq!(code, 200);
    let bad = json!({"model": "sim-model", "messages": []});
    let (code, b) = call(Some(("authorization", "Bearer sek")), &bad);
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(
        (code, v["type"].as_str(), v["error"]["type"].as_str()),
        (400, Some("error"), Some("invalid_request_error"))
    );
    let rurl = f.url(0, "/v1/responses");
    let (code, b) = match ureq::post(&rurl)
        .set("authorization", "Bearer sek")
        .send_json(json!({"model": "sim-model", "input": [{"type": "item_reference", "id": "x"}]}))
    {
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap()),
        other => panic!("{other:?}"),
    };
    assert_eq!(code, 400);
    assert!(
        b.contains("Unsupported input item type: item_reference"),
        "{b}"
    );
}

#[test]
fn a_client_gone_mid_stream_releases_the_worker() {
    let f = Fleet::start(&["--workers", "1", "--events", "none", "--timing",
        "prefill_base_us=1000,prefill_us_per_token=1,prefill_attention_us=0,decode_step_base_us=20000,decode_us_per_seq=0"]);
    let addr = f.workers[0].url.trim_start_matches("http://").to_string();
    for (path, body) in [
        (
            "/v1/messages",
            json!({"model": "sim-model", "max_tokens": 500, "stream": true, "messages": [{"role": "user", "content": "t1"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "sim-model", "max_output_tokens": 500, "stream": true, "input": "t1"}),
        ),
    ] {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        let b = body.to_string();
        write!(s, "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}", b.len()).unwrap();
        let mut buf = [0u8; 4096];
        let mut got = String::new();
        while !got.contains("delta") {
            let k = s.read(&mut buf).unwrap();
            assert!(k > 0);
            got.push_str(&String::from_utf8_lossy(&buf[..k]));
        }
        assert_eq!(f.stats(0)["active"], 1, "{path}");
        drop(s);
        let t0 = Instant::now();
        while f.stats(0)["active"] != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{path}: still active"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
