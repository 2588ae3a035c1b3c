//! Raw bytes on the binary ports: frames built by hand (to send what the codec would
//! refuse to encode), exchanges that read until the router closes, and the frames and
//! error codes that came back.

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

/// An event-port `Hello` for worker `id` (no token), encoded by the codec.
pub fn event_hello(id: &str) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    kvroute::codec::EventMsg::Hello(kvroute::codec::EventHello {
        auth_token: String::new(),
        spec: super::spec(id),
    })
    .encode(&mut b);
    b.to_vec()
}

/// A request-API `Hello` (no token), encoded by the codec.
pub fn api_hello() -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    kvroute::codec::RequestMsg::Hello {
        auth_token: String::new(),
    }
    .encode(&mut b);
    b.to_vec()
}
