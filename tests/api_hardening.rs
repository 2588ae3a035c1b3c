//! Doors of the real `kvroute serve` binary over
//! loopback: read-your-writes of JSON events, one id rule at every door, the binary
//! handshake's error codes, and LoRA-salted routing over HTTP and the binary API.

mod common;
use common::raw::{api_hello, event_hello};
use common::{hashes, raw, Server};
use serde_json::{json, Value};
use std::time::Duration;

fn worker(id: &str) -> Value {
    json!({"id": id, "role": "aggregated", "device": "gpu", "model": "m", "capacity_blocks": 100000})
}

/// POST with a keep-alive agent; returns (status, body).
fn post(agent: &ureq::Agent, url: &str, body: Value) -> (u16, Value) {
    match agent.post(url).send_json(body) {
        Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("POST {url}: {e:?}"),
    }
}

// ---- read-your-writes --------------------------------------------------------------

/// `{"applied": n}` means visible: a route sent right after the events answer, on the
/// same keep-alive connection, sees every block the events stored. Before the fix the
/// route's shard queries (urgent lane) overtook the queued index batches (bulk lane)
/// and missed in 1–9 % of tries.
#[test]
fn events_are_visible_to_the_next_route() {
    let s = Server::start(2, &[]);
    s.register(worker("w"));
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let (events, route) = (s.url("/v1/workers/w/events"), s.url("/v1/route"));
    let mut misses = Vec::new();
    for i in 0..500u64 {
        let h = hashes(1000 + i, 64);
        let (code, body) = post(
            &agent,
            &events,
            json!({"events": [{"type": "stored", "tier": "device", "parent": null, "block_hashes": h}]}),
        );
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["applied"], 1, "{body}");
        let id = format!("ryw-{i}");
        let (code, d) = post(
            &agent,
            &route,
            json!({"request_id": id, "model": "m", "block_hashes": h}),
        );
        assert_eq!(code, 200, "{d}");
        if d["overlap"]["device"] != 64 {
            misses.push((i, d["overlap"]["device"].clone()));
        }
        let (code, b) = post(
            &agent,
            &s.url(&format!("/v1/requests/{id}/finish")),
            json!({}),
        );
        assert_eq!(code, 200, "{b}");
    }
    assert!(
        misses.is_empty(),
        "{} of 500 routes missed blocks just applied: {misses:?}",
        misses.len()
    );
}

/// Reads one HTTP/1.1 response (headers and a Content-Length body); `None` at EOF.
fn read_response(s: &mut std::net::TcpStream) -> Option<String> {
    use std::io::Read;
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => got.push(b[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&got).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some(format!("{head}{}", String::from_utf8_lossy(&body)))
}

/// A lifecycle call that takes no body but is sent one (`{}`, as clients do), arriving
/// after its headers, leaves the keep-alive connection usable. Before the fix the
/// handler answered without reading the body and hyper closed the connection after the
/// answer, so the client's next request on it failed with an EOF (it showed up as
/// "Unexpected EOF" in the 500-try test above once the route was read-your-writes).
#[test]
fn bodies_of_bodiless_calls_are_read_so_keep_alive_holds() {
    use std::io::Write;
    let s = Server::start(1, &[]);
    s.register(worker("w"));
    let mut c = std::net::TcpStream::connect(&s.http).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for op in ["first_token", "finish", "prefill_failed"] {
        let head = format!(
            "POST /v1/requests/nope/{op} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"
        );
        c.write_all(head.as_bytes()).unwrap();
        c.flush().unwrap();
        // The body comes in its own segment, after the handler may have answered.
        std::thread::sleep(Duration::from_millis(50));
        c.write_all(b"{}").unwrap();
        let r = read_response(&mut c).expect("an answer");
        assert!(r.starts_with("HTTP/1.1 404"), "{op}: {r}");
        c.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            .unwrap();
        let r = read_response(&mut c).unwrap_or_else(|| panic!("{op}: connection closed"));
        assert!(r.starts_with("HTTP/1.1 200"), "{op}: {r}");
    }
}

// ---- error codes of the binary handshake and framing ----------------------------------

const BAD_REQUEST: u16 = 1;
const UNSUPPORTED_VERSION: u16 = 10;
const PROTOCOL_VIOLATION: u16 = 11;

/// Every handshake and framing failure on the event port gets the code of
/// docs/PROTOCOL.md §5 (before the fix all of them got 11, `protocol_violation`).
#[test]
fn event_port_error_codes_match_the_protocol() {
    use raw::*;
    let s = Server::start(1, &[]);
    let e = s.events.as_str();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("bad magic", frame(0x01, &hello(b"KVRX", 1)), BAD_REQUEST),
        (
            "wrong version",
            frame(0x01, &hello(b"KVRE", 2)),
            UNSUPPORTED_VERSION,
        ),
        ("truncated Hello", frame(0x01, b"KVRE\x01"), BAD_REQUEST),
        ("unknown kind", frame(0x3f, &[]), BAD_REQUEST),
        ("length 0", vec![0, 0, 0, 0], BAD_REQUEST),
        (
            "event before Hello",
            frame(0x04, &[0, 0, 0, 0, 0, 0, 0, 0, 0]),
            PROTOCOL_VIOLATION,
        ),
        (
            "router kind sent by a worker",
            frame(0x41, &[]),
            PROTOCOL_VIOLATION,
        ),
    ];
    for (what, bytes, want) in cases {
        assert_eq!(event_error(&exchange(e, &bytes)), want, "{what}");
    }
    let after: Vec<(&str, &str, Vec<u8>, u16)> = vec![
        (
            "malformed event after Hello",
            "w1",
            frame(0x02, &[1, 2, 3]),
            BAD_REQUEST,
        ),
        ("second Hello", "w2", event_hello("w2"), PROTOCOL_VIOLATION),
    ];
    for (what, id, bytes, want) in after {
        let got = after_hello(e, &event_hello(id), &bytes);
        assert_eq!(event_error(&got), want, "{what}");
    }
    let (code, _) = s.get("/healthz");
    assert_eq!(code, 200);
}

/// The same mapping on the request (API) port.
#[test]
fn api_port_error_codes_match_the_protocol() {
    use raw::*;
    let s = Server::start(1, &[]);
    let a = s.api.as_str();
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("bad magic", frame(0x81, &hello(b"KVRX", 1)), BAD_REQUEST),
        (
            "wrong version",
            frame(0x81, &hello(b"KVRQ", 2)),
            UNSUPPORTED_VERSION,
        ),
        ("truncated Hello", frame(0x81, b"KVRQ"), BAD_REQUEST),
        ("unknown kind", frame(0x7f, &[]), BAD_REQUEST),
        ("length 0", vec![0, 0, 0, 0], BAD_REQUEST),
        (
            "request before Hello",
            frame(0x85, &[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, b'w']),
            PROTOCOL_VIOLATION,
        ),
        (
            "response kind sent by a frontend",
            frame(0xc3, &[1, 0, 0, 0, 0, 0, 0, 0]),
            PROTOCOL_VIOLATION,
        ),
    ];
    for (what, bytes, want) in cases {
        assert_eq!(api_error(&exchange(a, &bytes)), want, "{what}");
    }
    let after: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "malformed request after Hello",
            frame(0x82, &[1, 2, 3]),
            BAD_REQUEST,
        ),
        ("second Hello", api_hello(), PROTOCOL_VIOLATION),
    ];
    for (what, bytes, want) in after {
        let got = after_hello(a, &api_hello(), &bytes);
        assert_eq!(api_error(&got), want, "{what}");
    }
    let (code, _) = s.get("/healthz");
    assert_eq!(code, 200);
}

// ---- one id rule at every door ------------------------------------------------------

/// Ids a path segment cannot carry as is (and the length limit).
fn bad_ids() -> Vec<String> {
    ["a/b", "a?b", "a#b", "a%2Fb", "a b", ""]
        .iter()
        .map(|s| s.to_string())
        .chain(std::iter::once("x".repeat(129)))
        .collect()
}

const RULE: &str = "1..=128 bytes of [A-Z a-z 0-9 . _ : @ + = -]";

fn assert_refused(what: &str, code: u16, body: &Value) {
    assert_eq!(code, 400, "{what}: {body}");
    assert_eq!(body["code"], "bad_request", "{what}: {body}");
    let msg = body["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains(RULE),
        "{what}: the error names the rule: {msg}"
    );
}

/// Before the fix `a/b`, `a?b`, `a#b` and `a%2Fb` were accepted as worker and request
/// ids, and the lifecycle and DELETE calls could not address them (their requests
/// stayed active forever). Now every door refuses them with `bad_request` naming the
/// rule, and an id using every allowed character at the maximum length round-trips
/// through every door.
#[test]
fn ids_outside_the_rule_are_refused_at_every_door() {
    use kvroute::client::{EventPublisher, RequestClient};
    use kvroute::codec::ErrorCode;
    let s = Server::start(1, &[]);
    s.register(worker("w"));
    let h = hashes(9, 4);
    for id in bad_ids() {
        // HTTP register, route.
        let mut spec = worker("w");
        spec["id"] = json!(id);
        let (code, body) = s.post("/v1/workers", spec);
        assert_refused(&format!("register {id:?}"), code, &body);
        let (code, body) = s.post(
            "/v1/route",
            json!({"request_id": id, "model": "m", "block_hashes": h}),
        );
        assert_refused(&format!("route {id:?}"), code, &body);
        // Binary Register, Hello, Route, Lifecycle, Deregister.
        let mut api = RequestClient::connect(&s.api, "").unwrap();
        let e = api.register(common::spec(&id)).unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{id:?}: {e}");
        let e = api.route(&common::req(&id, &h)).unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{id:?}: {e}");
        let e = api.finish(&id).unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{id:?}: {e}");
        let e = api.deregister(&id).unwrap_err();
        assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{id:?}: {e}");
        match EventPublisher::connect(&s.events, common::spec(&id), "") {
            Err(e) => assert_eq!(e.code(), Some(ErrorCode::BadRequest), "{id:?}: {e}"),
            Ok(_) => panic!("Hello with worker id {id:?} accepted"),
        }
    }
    // HTTP doors addressed by path: an encoded or over-long segment is refused, not
    // "unknown".
    for seg in ["a%2Fb", "a%23b", "a%3Fb", &"x".repeat(129)] {
        let (code, body) = s.post(&format!("/v1/requests/{seg}/finish"), json!({}));
        assert_refused(&format!("finish {seg}"), code, &body);
        let (code, body) = s.delete(&format!("/v1/workers/{seg}"));
        assert_refused(&format!("delete {seg}"), code, &body);
        let (code, body) = s.post(
            &format!("/v1/workers/{seg}/events"),
            json!({"events": [{"type": "cleared"}]}),
        );
        assert_refused(&format!("events {seg}"), code, &body);
    }
    assert_eq!(s.workers().len(), 1, "only w is registered");
    // The whole charset at the maximum length works through every door.
    let long = format!("{}{}", "AZaz09._:@+=-", "x".repeat(128 - 13));
    assert_eq!(long.len(), 128);
    s.register(worker(&long));
    let (code, body) = s.post(
        &format!("/v1/workers/{long}/events"),
        json!({"events": [{"type": "stored", "tier": "device", "parent": null, "block_hashes": h}]}),
    );
    assert_eq!(code, 200, "{body}");
    let (code, d) = s.post(
        "/v1/route",
        json!({"request_id": long, "model": "m", "block_hashes": h, "pin": long}),
    );
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["overlap"]["device"], 4, "{d}");
    let (code, body) = s.post(&format!("/v1/requests/{long}/finish"), json!({}));
    assert_eq!(code, 200, "{body}");
    let (code, body) = s.delete(&format!("/v1/workers/{long}"));
    assert_eq!(code, 200, "{body}");
    let mut api = RequestClient::connect(&s.api, "").unwrap();
    api.register(common::spec(&long)).unwrap();
    api.route(&common::req(&long, &h)).unwrap();
    api.finish(&long).unwrap();
    api.deregister(&long).unwrap();
}

/// `[[engines]]` worker ids follow the same rule: the router refuses to start.
#[test]
fn engine_worker_ids_outside_the_rule_stop_the_start() {
    use std::process::{Command, Stdio};
    let port = common::free_port;
    for id in ["e/1", "e?1", "e#1"] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvroute"))
            .args(["serve", "--cores", "1", "--proxy-addr", "off"])
            .args(["--events-addr", &format!("127.0.0.1:{}", port())])
            .args(["--api-addr", &format!("127.0.0.1:{}", port())])
            .args(["--http-addr", &format!("127.0.0.1:{}", port())])
            .args([
                "--engine",
                &format!("worker_id={id},endpoint=tcp://127.0.0.1:{}", port()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if std::time::Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let Some(status) = status else {
            kvroute::process::terminate(&mut child, Duration::from_secs(10));
            panic!("kvroute started with engine worker_id {id:?}");
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(!status.success(), "{id:?}: {err}");
        assert!(
            err.contains(RULE),
            "{id:?}: the error names the rule: {err}"
        );
    }
}

// ---- LoRA on route ---------------------------------------------------------------------

/// What the engine adapter stores for a vLLM `BlockStored` of `tokens` under LoRA
/// `lora` (the hashes a ZMQ-connected engine's blocks get in the index).
fn adapter_hashes(tokens: &[u32], block_size: u32, lora: Option<&str>) -> Vec<u64> {
    use kvroute::engines::adapter::{Adapter, Change};
    use kvroute::engines::{EngineEvent, EngineHash, Stored};
    let n = tokens.len() / block_size as usize;
    let mut a = Adapter::new(block_size, 1 << 16, None);
    let mut out = Vec::new();
    a.apply(
        &EngineEvent::Stored(Stored {
            block_hashes: (0..n as u64).map(EngineHash::Int).collect(),
            token_ids: tokens.to_vec(),
            lora_name: lora.map(str::to_string),
            ..Default::default()
        }),
        &mut out,
    );
    out.into_iter()
        .flat_map(|c| match c {
            Change::Stored { hashes, .. } => hashes,
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// A frontend routes LoRA token prompts by name (`lora_name`), over HTTP and the binary
/// API, and finds the blocks the engine adapter stored for that adapter; without the
/// name (or with another one) the same tokens match nothing. Before the fix
/// `lora_name` was an unknown field (400) and the binary Route had no such field.
#[test]
fn lora_name_on_route_finds_the_adapters_blocks() {
    use kvroute::client::RequestClient;
    // Speculative indexing off: this test is about the index's hash spaces, and the
    // requests it routes (never finished) would otherwise make their own (unsalted)
    // blocks pending on `w` for the later ones.
    let s = Server::start(2, &["--block-size", "16", "--speculative-ttl-ms", "0"]);
    s.register(worker("w"));
    let tokens: Vec<u32> = (0..16 * 8).map(|i| 1000 + i).collect();
    let salted = adapter_hashes(&tokens, 16, Some("sql-lora"));
    assert_eq!(salted.len(), 8);
    assert_eq!(
        salted,
        kvroute::engines::salted_sequence_hashes(&tokens, 16, Some("sql-lora")),
        "the library helper agrees with the adapter"
    );
    s.store("w", "device", &salted);
    // HTTP.
    let route = |id: &str, lora: Option<&str>| {
        let mut body = json!({"request_id": id, "model": "m", "tokens": tokens});
        if let Some(l) = lora {
            body["lora_name"] = json!(l);
        }
        let (code, d) = s.post("/v1/route", body);
        assert_eq!(code, 200, "{d}");
        d["overlap"]["device"].as_u64().unwrap()
    };
    assert_eq!(route("h1", Some("sql-lora")), 8);
    assert_eq!(route("h2", None), 0);
    assert_eq!(route("h3", Some("other-lora")), 0);
    // Binary.
    let mut api = RequestClient::connect(&s.api, "").unwrap();
    let mut r = kvroute::engine::RouteRequest {
        request_id: "b1".into(),
        model: Some("m".into()),
        tokens: Some(tokens.clone()),
        lora_name: Some("sql-lora".into()),
        ..Default::default()
    };
    assert_eq!(api.route(&r).unwrap().overlap.device, 8);
    r.request_id = "b2".into();
    r.lora_name = None;
    assert_eq!(api.route(&r).unwrap().overlap.device, 0);
    r.request_id = "b3".into();
    r.lora_name = Some("other-lora".into());
    assert_eq!(api.route(&r).unwrap().overlap.device, 0);
    // Precomputed hashes are used as given: a LoRA name with them is refused, on both.
    let (code, body) = s.post(
        "/v1/route",
        json!({"request_id": "h4", "model": "m", "block_hashes": salted, "lora_name": "sql-lora"}),
    );
    assert_eq!(
        (code, &body["code"]),
        (400, &json!("bad_request")),
        "{body}"
    );
    let e = api
        .route(&kvroute::engine::RouteRequest {
            request_id: "b4".into(),
            block_hashes: Some(salted.clone()),
            lora_name: Some("sql-lora".into()),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.code(), Some(kvroute::codec::ErrorCode::BadRequest), "{e}");
    let (code, body) = s.post(
        "/v1/route",
        json!({"request_id": "h5", "model": "m", "tokens": tokens, "lora_name": ""}),
    );
    assert_eq!(code, 400, "{body}");
}

// ---- frames sent in the same write as the Hello ------------------------------------

/// A frontend may send `Hello` and its first requests in one write (the request
/// protocol's pipelining allows it), and a worker its `Hello` and first events: those
/// frames are handled at once, not left buffered until more bytes arrive (before the
/// fix both connections hung until the client's read timed out).
#[test]
fn frames_in_the_same_write_as_hello_are_handled() {
    use kvroute::codec::{EventMsg, Prompt, RequestMsg, Route};
    use kvroute::types::Tier;
    use std::io::{Read, Write};
    let s = Server::start(1, &[]);
    // Event port: Hello + Stored in one write, then the socket stays open and silent.
    let mut w = event_hello("wh");
    let mut b = bytes::BytesMut::new();
    EventMsg::encode_stored(&mut b, 0, Tier::Device, None, &[501, 502, 503]);
    w.extend_from_slice(&b);
    let mut ev = std::net::TcpStream::connect(&s.events).unwrap();
    ev.write_all(&w).unwrap();
    s.wait_until("stored blocks of the Hello's write", |s| {
        s.cached("wh") == 3
    });
    // API port: Hello + Route in one write; both answers arrive without another write.
    let mut q = api_hello();
    let mut b = bytes::BytesMut::new();
    RequestMsg::Route(Route::new(
        7,
        "r-hello",
        Prompt::from_hashes(&[501, 502, 503]),
    ))
    .encode(&mut b);
    q.extend_from_slice(&b);
    let mut api = std::net::TcpStream::connect(&s.api).unwrap();
    api.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    api.write_all(&q).unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let mut head = [0u8; 4];
        api.read_exact(&mut head)
            .expect("answers to Hello and Route");
        let mut f = vec![0u8; u32::from_le_bytes(head) as usize];
        api.read_exact(&mut f).unwrap();
        kinds.push(f[0]);
    }
    assert_eq!(kinds[0], 0xc1, "HelloAck first: {kinds:x?}");
    assert_eq!(kinds[1], 0xc2, "then the Decision: {kinds:x?}");
    drop(ev);
}
