//! Benchmarks of the endpoint picker's ext_proc stream machine (`epp::stream`): the
//! CPU the EPP adds per request on top of routing, with the pick itself answered at
//! once. One chat request of about 1 KB in full-duplex mode, as an inference gateway
//! sends it (headers, two body chunks), then:
//! - `request_to_pick`: up to the pick's answers (headers response with the endpoint
//!   header and metadata, the body handed back);
//! - `whole_exchange`: the same plus the response phase (response headers, 32 SSE
//!   chunks of one token each, end of stream): the lifecycle reading included.

use criterion::{criterion_group, criterion_main, Criterion};
use envoy_types::pb::envoy::service::ext_proc::v3::ProcessingRequest;
use kvroute::epp::gateway::{body, headers, Phase};
use kvroute::epp::pick::Pick;
use kvroute::epp::stream::{Limits, Out, Stream};
use std::hint::black_box;

fn request() -> Vec<ProcessingRequest> {
    let content = "Summarize the following text in one sentence. ".repeat(20);
    let b = serde_json::json!({"model": "m", "stream": true, "max_tokens": 64,
        "messages": [{"role": "system", "content": "You are helpful."},
                     {"role": "user", "content": content}]})
    .to_string();
    let (x, y) = b.as_bytes().split_at(b.len() / 2);
    let h = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gateway.example"),
        ("content-type", "application/json"),
        ("x-request-id", "bench-1"),
        ("user-agent", "OpenAI/Python 1.0"),
        ("accept", "application/json"),
    ];
    vec![
        headers(Phase::Request, &h, false),
        body(Phase::Request, x, false),
        body(Phase::Request, y, true),
    ]
}

fn response() -> Vec<ProcessingRequest> {
    let mut v = vec![headers(
        Phase::Response,
        &[(":status", "200"), ("content-type", "text/event-stream")],
        true,
    )];
    for i in 0..32 {
        let ev = format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
        );
        v.push(body(Phase::Response, ev.as_bytes(), i == 31));
    }
    v
}

fn pick() -> Pick {
    Pick {
        request_id: "px=bench.0.1".into(),
        worker: "w1".into(),
        endpoint: "10.0.0.1:8000".into(),
        prefill: None,
    }
}

const LIMITS: Limits = Limits {
    max_body_bytes: 8 << 20,
    max_header_count: 128,
    max_header_bytes: 64 << 10,
};

fn run(st: &mut Stream, msgs: &[ProcessingRequest]) -> usize {
    let mut n = 0;
    for m in msgs {
        for o in st.on_message(m.clone()) {
            n += 1;
            if let Out::Route(r) = o {
                black_box(&r);
                n += st.on_pick(Ok(pick())).len();
            }
        }
    }
    n
}

fn bench(c: &mut Criterion) {
    let req = request();
    let resp = response();
    let mut g = c.benchmark_group("epp_stream");
    g.bench_function("request_to_pick", |b| {
        b.iter(|| {
            let mut st = Stream::new(LIMITS, 1);
            black_box(run(&mut st, &req))
        })
    });
    g.bench_function("whole_exchange", |b| {
        b.iter(|| {
            let mut st = Stream::new(LIMITS, 1);
            let n = run(&mut st, &req) + run(&mut st, &resp);
            black_box(n)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
