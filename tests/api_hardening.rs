//! Issue 13 items 8, 9, 10 and 16 against the real `kvroute serve` binary over
//! loopback: read-your-writes of JSON events, one id rule at every door, the binary
//! handshake's error codes, and LoRA-salted routing over HTTP and the binary API.

mod common;
use common::{hashes, Server};
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
        Err(e) => panic!("POST {url}: {e}"),
    }
}

// ---- item 8: read-your-writes ------------------------------------------------------

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

// ---- item 10: error codes of the binary handshake and framing -------------------------

mod raw {
    use bytes::{BufMut, BytesMut};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    /// One frame: `u32` length (kind + payload), kind, payload.
    pub fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_u32_le(payload.len() as u32 + 1);
        b.put_u8(kind);
        b.put_slice(payload);
        b.to_vec()
    }

    /// A `Hello` payload prefix: magic, version, empty token.
    pub fn hello(magic: &[u8; 4], version: u16) -> Vec<u8> {
        let mut p = magic.to_vec();
        p.extend_from_slice(&version.to_le_bytes());
        p.extend_from_slice(&0u16.to_le_bytes());
        p
    }

    /// Sends `bytes`, reads until the router closes (or 10 s), returns what came back.
    pub fn exchange(addr: &str, bytes: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    }

    /// Sends `hello`, waits for its answer frame, then sends `rest` and reads until the
    /// router closes; returns everything that came back.
    pub fn after_hello(addr: &str, hello: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(hello).unwrap();
        let mut head = [0u8; 4];
        s.read_exact(&mut head).unwrap();
        let mut ack = vec![0u8; u32::from_le_bytes(head) as usize];
        s.read_exact(&mut ack).unwrap();
        assert!(ack[0] == 0x41 || ack[0] == 0xc1, "not a HelloAck: {ack:?}");
        s.write_all(rest).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    }

    /// The frames in `bytes`, as (kind, payload).
    pub fn frames(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        while bytes.len() >= 5 {
            let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            out.push((bytes[4], bytes[5..4 + len].to_vec()));
            bytes = &bytes[4 + len..];
        }
        out
    }

    /// The code of the last frame, which must be an event-port `Error` (0x43).
    pub fn event_error(bytes: &[u8]) -> u16 {
        let f = frames(bytes);
        let (kind, p) = f.last().expect("an Error frame");
        assert_eq!(*kind, 0x43, "{f:?}");
        u16::from_le_bytes([p[0], p[1]])
    }

    /// The code of the last frame, which must be an API-port `Error` (0xc4) with corr 0.
    pub fn api_error(bytes: &[u8]) -> u16 {
        let f = frames(bytes);
        let (kind, p) = f.last().expect("an Error frame");
        assert_eq!(*kind, 0xc4, "{f:?}");
        assert_eq!(&p[..8], &[0u8; 8], "connection-level errors carry corr 0");
        u16::from_le_bytes([p[8], p[9]])
    }
}

const BAD_REQUEST: u16 = 1;
const UNSUPPORTED_VERSION: u16 = 10;
const PROTOCOL_VIOLATION: u16 = 11;

fn event_hello(id: &str) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    kvroute::codec::EventMsg::Hello(kvroute::codec::EventHello {
        auth_token: String::new(),
        spec: common::spec(id),
    })
    .encode(&mut b);
    b.to_vec()
}

fn api_hello() -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    kvroute::codec::RequestMsg::Hello {
        auth_token: String::new(),
    }
    .encode(&mut b);
    b.to_vec()
}

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
