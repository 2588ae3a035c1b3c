//! The binary protocols end to end: worker event connections feeding the index, the
//! request API routing on it, and bad input closing only the offending connection.

mod common;
use common::{hashes, req, spec, Server};
use kvroute::client::{ClientError, EventPublisher, RequestClient};
use kvroute::codec::{ErrorCode, WorkerBound};
use kvroute::engine::RouteRequest;
use kvroute::types::Tier;
use std::io::{Read, Write};
use std::time::Duration;

fn events_then_routing(cores: usize) -> Vec<(String, u32)> {
    let s = Server::start(cores, &[]);
    let mut a = EventPublisher::connect(&s.events, spec("a"), "").unwrap();
    let mut b = EventPublisher::connect(&s.events, spec("b"), "").unwrap();
    let h1 = hashes(1, 16);
    let h2 = hashes(2, 16);
    a.stored(Tier::Device, None, &h1);
    b.stored(Tier::Device, None, &h2[..8]);
    b.stored(Tier::Host, Some(h2[7]), &h2[8..12]);
    a.flush().unwrap();
    b.flush().unwrap();
    s.wait_until("index", |s| s.cached("a") == 16 && s.cached("b") == 12);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    let mut out = Vec::new();
    for (id, h) in [("r1", &h1), ("r2", &h2)] {
        let d = c.route(&req(id, h)).unwrap();
        out.push((d.decode_worker.clone(), d.overlap.device + d.overlap.host));
        c.first_token(id).unwrap();
        c.progress(id, 10).unwrap();
        c.finish(id).unwrap();
    }
    assert_eq!(out, vec![("a".to_string(), 16), ("b".to_string(), 12)]);
    assert!(matches!(
        c.finish("r1").unwrap_err().code(),
        Some(ErrorCode::UnknownRequest)
    ));
    // Removal and clear are applied.
    a.removed(Tier::Device, &h1[4..]);
    a.flush().unwrap();
    s.wait_until("removal", |s| s.cached("a") == 4);
    let d = c.route(&req("r3", &h1)).unwrap();
    assert_eq!(d.overlap.device, 4);
    a.cleared(None);
    a.flush().unwrap();
    s.wait_until("clear", |s| s.cached("a") == 0);
    assert!(s.metric("kvroute_events_total{kind=\"stored\"}") >= 3.0);
    out
}

#[test]
fn binary_events_then_routing_cores_1_and_2() {
    assert_eq!(events_then_routing(1), events_then_routing(2));
}

#[test]
fn pipelined_requests_get_answers_in_order() {
    let s = Server::start(2, &[]);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    c.register(spec("w")).unwrap();
    let mut corrs = Vec::new();
    for i in 0..200 {
        corrs.push(c.send_route(&req(&format!("p{i}"), &hashes(i, 4))).unwrap());
    }
    c.flush().unwrap();
    for want in corrs {
        match c.recv().unwrap() {
            kvroute::client::Answer::Decision(corr, d) => {
                assert_eq!(corr, want);
                assert_eq!(d.decode_worker, "w");
            }
            other => panic!("{other:?}"),
        }
    }
}

fn read_all(stream: &mut std::net::TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut v = Vec::new();
    let _ = stream.read_to_end(&mut v);
    v
}

#[test]
fn malformed_and_oversized_frames_close_only_that_connection() {
    let s = Server::start(2, &["--max-frame-bytes", "4096"]);
    let mut good = EventPublisher::connect(&s.events, spec("good"), "").unwrap();
    let h = hashes(7, 8);
    good.stored(Tier::Device, None, &h);
    good.flush().unwrap();
    s.wait_until("index", |s| s.cached("good") == 8);

    // Garbage after a valid handshake: Error(bad_request), then closed.
    let mut bad = EventPublisher::connect(&s.events, spec("bad"), "").unwrap();
    bad.send_raw(&[9, 0, 0, 0, 0x02, 1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    match bad.poll(Duration::from_secs(5)) {
        Ok(Some(WorkerBound::Error { code, .. })) => {
            assert_eq!(code, ErrorCode::BadRequest.as_u16())
        }
        other => panic!("expected an error frame, got {other:?}"),
    }
    // Oversized frame on a raw connection: refused before the body arrives.
    let mut raw = std::net::TcpStream::connect(&s.events).unwrap();
    raw.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
    raw.write_all(&[0x01]).unwrap();
    let answer = read_all(&mut raw);
    assert!(!answer.is_empty(), "an error frame before closing");
    // Garbage on the request port.
    let mut raw = std::net::TcpStream::connect(&s.api).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let _ = read_all(&mut raw);
    // A frame cut mid-way, then close.
    let mut cut = EventPublisher::connect(&s.events, spec("cut"), "").unwrap();
    cut.send_raw(&[200, 0, 0, 0, 0x02, 0, 0]).unwrap();
    drop(cut);

    s.wait_until("errors counted", |s| {
        s.metric("kvroute_protocol_errors_total{kind=\"malformed_frame\"}") >= 1.0
            && s.metric("kvroute_protocol_errors_total{kind=\"oversized_frame\"}") >= 1.0
    });
    // The good worker's connection and routing are unaffected.
    good.stored(Tier::Device, None, &hashes(8, 4));
    good.flush().unwrap();
    s.wait_until("index", |s| s.cached("good") == 12);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    let d = c.route(&req("after", &h)).unwrap();
    assert_eq!((d.decode_worker.as_str(), d.overlap.device), ("good", 8));
}

#[test]
fn sequence_gap_marks_suspect_and_resync_restores() {
    let s = Server::start(2, &[]);
    let mut w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    let mut other = EventPublisher::connect(&s.events, spec("o"), "").unwrap();
    let h = hashes(3, 8);
    w.stored(Tier::Device, None, &h);
    other.stored(Tier::Device, None, &h[..2]);
    w.flush().unwrap();
    other.flush().unwrap();
    s.wait_until("index", |s| s.cached("w") == 8);
    w.skip_seq(5);
    w.heartbeat(0, 8, 10_000);
    w.flush().unwrap();
    match w.poll(Duration::from_secs(5)).unwrap() {
        Some(WorkerBound::Resync { .. }) => {}
        other => panic!("expected resync, got {other:?}"),
    }
    s.wait_until("suspect", |s| {
        s.workers()
            .iter()
            .any(|x| x["id"] == "w" && x["state"] == "suspect")
    });
    assert!(s.metric("kvroute_sequence_gaps_total") >= 1.0);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    let d = c
        .route(&RouteRequest {
            explain: true,
            ..req("s1", &h)
        })
        .unwrap();
    let cand = d.candidates.unwrap();
    let wc = cand.iter().find(|x| x.worker == "w").unwrap();
    assert_eq!(
        wc.overlap.device, 0,
        "suspect worker's overlap counts as zero"
    );
    c.finish("s1").unwrap();
    // Full re-announce.
    w.resync_begin();
    w.stored(Tier::Device, None, &h[..6]);
    w.resync_end();
    w.flush().unwrap();
    s.wait_until("resynced", |s| {
        s.workers()
            .iter()
            .any(|x| x["id"] == "w" && x["state"] == "live")
            && s.cached("w") == 6
    });
    let d = c.route(&req("s2", &h)).unwrap();
    assert_eq!((d.decode_worker.as_str(), d.overlap.device), ("w", 6));
}

#[test]
fn heartbeat_timeout_takes_worker_out_until_it_returns() {
    let s = Server::start(2, &["--heartbeat-timeout-ms", "1000"]);
    let mut w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    c.register(spec("static")).unwrap();
    let h = hashes(5, 4);
    w.stored(Tier::Device, None, &h);
    w.flush().unwrap();
    s.wait_until("index", |s| s.cached("w") == 4);
    w.heartbeat(0, 4, 10_000);
    w.flush().unwrap();
    assert_eq!(c.route(&req("h1", &h)).unwrap().decode_worker, "w");
    c.finish("h1").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(s
        .workers()
        .iter()
        .any(|x| x["id"] == "w" && x["state"] == "down"));
    assert_eq!(c.route(&req("h2", &h)).unwrap().decode_worker, "static");
    c.finish("h2").unwrap();
    w.heartbeat(0, 4, 10_000);
    w.flush().unwrap();
    s.wait_until("back", |s| {
        s.workers()
            .iter()
            .any(|x| x["id"] == "w" && x["state"] == "live")
    });
    assert_eq!(c.route(&req("h3", &h)).unwrap().decode_worker, "w");
}

#[test]
fn second_connection_for_same_worker_is_refused() {
    let s = Server::start(1, &[]);
    let _a = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    match EventPublisher::connect(&s.events, spec("w"), "") {
        Err(ClientError::Router { code, .. }) => assert_eq!(code, ErrorCode::Conflict.as_u16()),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("second connection accepted"),
    }
}

#[test]
fn new_epoch_clears_the_workers_blocks() {
    let s = Server::start(2, &[]);
    let h = hashes(6, 5);
    {
        let mut w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
        w.stored(Tier::Device, None, &h);
        w.flush().unwrap();
        s.wait_until("index", |s| s.cached("w") == 5);
    }
    // Same epoch: state kept, sequence resumes.
    std::thread::sleep(Duration::from_millis(100));
    let w = EventPublisher::connect(&s.events, spec("w"), "").unwrap();
    assert_eq!(w.seq(), 1);
    drop(w);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(s.cached("w"), 5);
    let mut restarted = spec("w");
    restarted.epoch = 2;
    let w = EventPublisher::connect(&s.events, restarted, "").unwrap();
    assert_eq!(w.seq(), 0);
    s.wait_until("cleared", |s| s.cached("w") == 0);
}
