//! `kvroute-sim relay`, the controls of the router-tier side-by-side, end to end: the
//! byte relay, hyper's HTTP relay, that relay doing kvroute's routing work, and the
//! routing control that routes among workers by their binary KV events.

use std::process::Command;

/// A running `kvroute-sim relay`, killed when dropped.
struct Relay(std::process::Child);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kvroute-sim relay` (with `extra` flags) to `upstream`; its address.
fn start_relay(upstream: &str, extra: &[&str]) -> (Relay, String) {
    let mut args = vec!["--upstream", upstream];
    args.extend(extra);
    let (relay, lines) = spawn_relay(&args);
    // "relay listening on ADDR -> UPSTREAM"
    (relay, word(&lines, "relay listening on"))
}

/// Starts `kvroute-sim relay ARGS`; its output up to its "listening" line.
fn spawn_relay(args: &[&str]) -> (Relay, Vec<String>) {
    use std::io::BufRead;
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvroute-sim"))
        .arg("relay")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "relay ended: {lines:?}"
        );
        lines.push(line.trim_end().to_string());
        if line.contains("listening") {
            break;
        }
    }
    (Relay(c), lines)
}

/// The word after `prefix` on the first of `lines` that starts with it.
fn word(lines: &[String], prefix: &str) -> String {
    let l = lines.iter().find(|l| l.starts_with(prefix)).unwrap();
    l[prefix.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// An address where nothing listens.
fn dead_addr() -> String {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    dead.local_addr().unwrap().to_string()
}

/// A relay to a dead upstream closes its client (EOF, not a hang).
fn closes_on_a_dead_upstream(extra: &[&str]) {
    use std::io::Read;
    let (_relay, addr) = start_relay(&dead_addr(), extra);
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0, "closed");
}

/// `kvroute-sim relay` copies bytes both ways, over several connections at once, and
/// closes a client whose upstream cannot be reached.
#[test]
fn relay_copies_both_ways_and_closes_on_a_dead_upstream() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    // An upstream that answers each read with its bytes reversed.
    let up = TcpListener::bind("127.0.0.1:0").unwrap();
    let up_addr = up.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in up.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let r: Vec<u8> = buf[..n].iter().rev().copied().collect();
                    if s.write_all(&r).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let (_relay, addr) = start_relay(&up_addr, &[]);
    let mut clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    for round in 0..3 {
        for (i, c) in clients.iter_mut().enumerate() {
            let msg = format!("c{i}r{round}");
            c.write_all(msg.as_bytes()).unwrap();
            let mut got = vec![0u8; msg.len()];
            c.read_exact(&mut got).unwrap();
            let want: Vec<u8> = msg.bytes().rev().collect();
            assert_eq!(got, want);
        }
    }
    closes_on_a_dead_upstream(&[]);
}

/// `kvroute-sim relay --http` forwards each request of a kept-alive connection to
/// the upstream and streams its answer back, and closes a client whose upstream
/// cannot be reached.
#[test]
fn http_relay_forwards_requests_on_a_kept_alive_connection() {
    http_relay_forwards(&["--http"]);
}

/// The same with a router's work on every request (`--route-tokenizer`): the bodies,
/// routed or not, reach the upstream unchanged.
#[test]
fn routing_http_relay_forwards_requests_unchanged() {
    let d = tempfile::tempdir().unwrap();
    kvroute::tokenize::testing::write_dir(d.path(), 1000).unwrap();
    let spec = format!("m={}", d.path().display());
    http_relay_forwards(&["--http", "--route-tokenizer", &spec]);
}

/// One HTTP/1.1 message from `r`: its head's lines and its body (content-length).
/// An HTTP/1.1 upstream on a free port that answers every request with
/// `answer(head lines, body)`; its address.
fn http_upstream(answer: fn(&[String], &[u8]) -> Vec<u8>) -> String {
    use std::io::{BufReader, Write};
    let up = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = up.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in up.incoming().flatten() {
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                while let Some((head, body)) = message(&mut r) {
                    let out = answer(&head, &body);
                    let resp = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", out.len());
                    if w.write_all(resp.as_bytes())
                        .and_then(|_| w.write_all(&out))
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    addr
}

fn message(r: &mut std::io::BufReader<std::net::TcpStream>) -> Option<(Vec<String>, Vec<u8>)> {
    use std::io::{BufRead, Read};
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    let len = head
        .iter()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>())
        })
        .and_then(Result::ok)
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

fn http_relay_forwards(flags: &[&str]) {
    use std::io::{BufReader, Write};
    use std::net::TcpStream;
    // An upstream that answers each request with its path and its body reversed.
    let up_addr = http_upstream(|head, body| {
        let path = head[0].split_whitespace().nth(1).unwrap_or("");
        // The first header as it arrived: hyper writes names in lowercase.
        let first = head.get(1).map_or("", String::as_str);
        let mut out: Vec<u8> = format!("{first}|{path}").into_bytes();
        out.extend(body.iter().rev());
        out
    });
    let (_relay, addr) = start_relay(&up_addr, flags);
    let c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    let asks = [
        ("/p0", "hello0".to_string()),
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"t1 t2 t3"}"#.to_string(),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"m","messages":[{"role":"user","content":"t4 t5"}]}"#.to_string(),
        ),
    ];
    for (path, body) in asks {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        w.write_all(req.as_bytes()).unwrap();
        let (head, got) = message(&mut r).expect("an answer on the same connection");
        assert!(head[0].starts_with("HTTP/1.1 200"), "{head:?}");
        // Parsed and written again by hyper, not copied: the name comes lowercased.
        let want: String = format!("host: x|{path}{}", body.chars().rev().collect::<String>());
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
    closes_on_a_dead_upstream(flags);
}

/// Sends `body` to `path` on kept-alive connection `c` (`w`, `r`); the answer's body.
fn ask(
    w: &mut std::net::TcpStream,
    r: &mut std::io::BufReader<std::net::TcpStream>,
    method: &str,
    path: &str,
    body: &[u8],
) -> Vec<u8> {
    use std::io::Write;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes()).unwrap();
    w.write_all(body).unwrap();
    let (head, got) = message(r).expect("an answer on the same connection");
    assert!(head[0].starts_with("HTTP/1.1 200"), "{head:?}");
    got
}

/// The routing control (`--events-addr`): workers register by kvroute's binary event
/// protocol through kvroute's own client, and their `Stored` events steer a prompt to
/// the worker that holds its blocks; `GET /metrics` counts the decisions in kvroute's
/// histogram; an event connection that breaks the protocol gets an `Error` frame and
/// is closed.
#[test]
fn routing_control_routes_by_the_workers_binary_events() {
    use kvroute::codec::{ErrorCode, EventMsg, FrameDecoder, WorkerBound};
    use std::io::{BufReader, Read, Write};
    let d = tempfile::tempdir().unwrap();
    kvroute::tokenize::testing::write_dir(d.path(), 1000).unwrap();
    let spec = format!("m={}", d.path().display());
    let (_relay, lines) = spawn_relay(&[
        "--http",
        "--route-tokenizer",
        &spec,
        "--events-addr",
        "127.0.0.1:0",
    ]);
    let (events, addr) = (
        word(&lines, "relay events on"),
        word(&lines, "relay listening on"),
    );
    // Two workers, each answering with its name.
    let urls = [
        http_upstream(|_, _| b"a".to_vec()),
        http_upstream(|_, _| b"b".to_vec()),
    ];
    let mut pubs: Vec<_> = ["a", "b"]
        .iter()
        .zip(&urls)
        .map(|(id, url)| {
            let spec = serde_json::from_value(serde_json::json!({
                "id": id, "model": "m", "url": format!("http://{url}"),
            }))
            .unwrap();
            kvroute::client::EventPublisher::connect(events.as_str(), spec, "").unwrap()
        })
        .collect();
    // A prompt of token ids, and its block hashes as a router computes them.
    let ids: Vec<u32> = (1..=64).collect();
    let body = serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": ids})).unwrap();
    let creq = kvroute::proxy::request::parse(bytes::Bytes::from(body.clone())).unwrap();
    let hashes =
        kvroute::proxy::route_request::route_request(None, &creq, Some(ids), 0, "x", vec![])
            .prepare(16, 1 << 20)
            .unwrap()
            .hashes;
    assert_eq!(hashes.len(), 4);
    pubs[1].stored(kvroute::types::Tier::Device, None, &hashes);
    pubs[1].flush().unwrap();

    let c = std::net::TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let (mut w, mut r) = (c.try_clone().unwrap(), BufReader::new(c));
    // The events are applied as they arrive: once a request reaches `b`, every later
    // one does.
    let mut sent = 0;
    while ask(&mut w, &mut r, "POST", "/v1/completions", &body) != b"b" {
        sent += 1;
        assert!(sent < 200, "never routed to the worker holding the blocks");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for _ in 0..8 {
        assert_eq!(ask(&mut w, &mut r, "POST", "/v1/completions", &body), b"b");
    }
    let metrics = String::from_utf8(ask(&mut w, &mut r, "GET", "/metrics", b"")).unwrap();
    let count = format!("kvroute_decision_latency_seconds_count {}", sent + 9);
    assert!(metrics.contains(&count), "{metrics}");

    // An event before `Hello`: an `Error` frame, then the connection closes.
    let mut s = std::net::TcpStream::connect(&events).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut out = bytes::BytesMut::new();
    EventMsg::encode_stored(&mut out, 0, kvroute::types::Tier::Device, None, &hashes);
    s.write_all(&out).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let mut buf = bytes::BytesMut::from(&got[..]);
    let frame = FrameDecoder::new(1 << 20)
        .decode(&mut buf)
        .unwrap()
        .unwrap();
    match WorkerBound::decode(&frame).unwrap() {
        WorkerBound::Error { code, .. } => assert_eq!(code, ErrorCode::ProtocolViolation.as_u16()),
        other => panic!("{other:?}"),
    }
}
