//! Answering the frames of one read, against the real binary: a read
//! holding a route and a finish (the common read of a pipelining frontend, answered
//! without allocating), a finish right behind its own route in the same read, a burst
//! of many tiny frames in one write, and the active-block accounting that every
//! decision and finish update on every core (`--cores 2`: each core keeps only its
//! shard's hashes).

mod common;
use common::{hashes, req, spec, Server};
use kvroute::client::{Answer, RequestClient};
use kvroute::codec::LifecycleOp;

/// Decode blocks of `worker` as `GET /v1/workers` reports them (the distinct blocks of
/// its active requests, summed over the cores' shards, with `assume_kv_reuse`).
fn decode_blocks(s: &Server, worker: &str) -> f64 {
    s.workers()
        .iter()
        .find(|w| w["id"] == worker)
        .and_then(|w| w["decode_blocks"].as_f64())
        .unwrap_or(-1.0)
}

/// Sends everything queued in one write, then reads one answer per correlation id.
fn answers(c: &mut RequestClient, corrs: &[u64]) -> Vec<Answer> {
    c.flush().unwrap();
    corrs.iter().map(|_| c.recv().unwrap()).collect()
}

fn route_and_finish_in_one_read(cores: usize) {
    let s = Server::start(cores, &[]);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    c.register(spec("w")).unwrap();
    // r0 first, then reads of [route r(i), finish r(i-1)]: two frames about different
    // ids, answered concurrently, in frame order.
    c.route(&req("r0", &hashes(0, 8))).unwrap();
    for i in 1..40u64 {
        let a = c.send_route(&req(&format!("r{i}"), &hashes(i, 8))).unwrap();
        let b = c
            .send_lifecycle(LifecycleOp::Finish, &format!("r{}", i - 1), 0)
            .unwrap();
        let got = answers(&mut c, &[a, b]);
        match (&got[0], &got[1]) {
            (Answer::Decision(ca, d), Answer::Ack(cb)) => {
                assert_eq!((*ca, *cb), (a, b));
                assert_eq!(d.decode_worker, "w");
                assert_eq!(d.request_id, format!("r{i}"));
            }
            other => panic!("read {i}: {other:?}"),
        }
    }
    // A finish right behind its own route in the same read finds it committed.
    let a = c.send_route(&req("same", &hashes(99, 8))).unwrap();
    let b = c.send_lifecycle(LifecycleOp::Finish, "same", 0).unwrap();
    match &answers(&mut c, &[a, b])[..] {
        [Answer::Decision(ca, _), Answer::Ack(cb)] => assert_eq!((*ca, *cb), (a, b)),
        other => panic!("route + own finish: {other:?}"),
    }
    // Only r39 is still active.
    assert_eq!(s.metric("kvroute_active_requests"), 1.0);
}

#[test]
fn a_route_and_a_finish_in_one_read_cores_1_and_2() {
    route_and_finish_in_one_read(1);
    route_and_finish_in_one_read(2);
}

#[test]
fn a_burst_of_tiny_frames_then_small_reads_are_all_answered_in_order() {
    let s = Server::start(2, &[]);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    c.register(spec("w")).unwrap();
    // 300 routes and their 300 finishes in one write (the session's per-read buffers
    // grow for it and give the room back afterwards).
    let mut corrs = Vec::new();
    for i in 0..300u64 {
        corrs.push(c.send_route(&req(&format!("b{i}"), &hashes(i, 2))).unwrap());
    }
    for i in 0..300u64 {
        corrs.push(
            c.send_lifecycle(LifecycleOp::Finish, &format!("b{i}"), 0)
                .unwrap(),
        );
    }
    let got = answers(&mut c, &corrs);
    for (k, (a, want)) in got.iter().zip(&corrs).enumerate() {
        match a {
            Answer::Decision(corr, _) if k < 300 => assert_eq!(corr, want),
            Answer::Ack(corr) if k >= 300 => assert_eq!(corr, want),
            other => panic!("answer {k}: {other:?}"),
        }
    }
    // The same connection goes on with small reads.
    for i in 0..5u64 {
        let d = c
            .route(&req(&format!("after{i}"), &hashes(500 + i, 4)))
            .unwrap();
        assert_eq!(d.decode_worker, "w");
        c.finish(&format!("after{i}")).unwrap();
    }
    assert_eq!(s.metric("kvroute_active_requests"), 0.0);
}

fn active_blocks_follow_routes_and_finishes(cores: usize) {
    let s = Server::start(cores, &[]);
    let mut c = RequestClient::connect(&s.api, "").unwrap();
    c.register(spec("w")).unwrap();
    let a = hashes(7, 64);
    // b shares a's first 32 blocks and has 32 of its own.
    let mut b = a[..32].to_vec();
    b.extend(hashes(8, 32));
    c.route(&req("a", &a)).unwrap();
    c.route(&req("b", &b)).unwrap();
    s.wait_until("96 distinct active blocks", |s| {
        decode_blocks(s, "w") == 96.0
    });
    c.finish("a").unwrap();
    s.wait_until("b's 64 blocks", |s| decode_blocks(s, "w") == 64.0);
    c.finish("b").unwrap();
    s.wait_until("none", |s| decode_blocks(s, "w") == 0.0);
}

/// A core applies a long request's active blocks after answering, through its own
/// inbox: the next decision on that core must still count them.
#[test]
fn the_next_decision_on_a_core_counts_the_last_ones_active_blocks() {
    for cores in [1, 2] {
        let s = Server::start(cores, &["--index-layout", "replicated"]);
        // One connection, both routes in one write: they run back to back on the core
        // that serves it, before its run loop has had a turn.
        let mut c = RequestClient::connect(&s.api, "").unwrap();
        c.register(spec("w")).unwrap();
        // Long enough that the first route's blocks are applied after its answer.
        let a = hashes(7, 512);
        let mut b = a[..256].to_vec();
        b.extend(hashes(8, 256));
        let mut rb = req("b", &b);
        rb.explain = true;
        let corrs = [
            c.send_route(&req("a", &a)).unwrap(),
            c.send_route(&rb).unwrap(),
        ];
        let got = answers(&mut c, &corrs);
        let Answer::Decision(_, d) = &got[1] else {
            panic!("{got:?}")
        };
        let w = &d.candidates.as_ref().expect("explain")[0];
        // a's 512 active blocks and b's 256 new ones (its other 256 are a's).
        assert_eq!(w.decode_blocks, 768.0, "{cores} cores: {w:?}");
    }
}

#[test]
fn active_blocks_follow_routes_and_finishes_cores_1_and_2() {
    active_blocks_follow_routes_and_finishes(1);
    active_blocks_follow_routes_and_finishes(2);
}
